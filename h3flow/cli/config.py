"""``h3flow config-adapt``: host-map.json -> local.json, or a drift report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from h3flow.cli.base import SET_UP, app, console, local_choices, operator_command
from h3flow.config.adapt import adapt, local_host_map, render
from h3flow.config.models import load_host_map
from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.fsutil import atomic_write_json


def drift(old: Any, new: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ, as ``path: old -> new`` lines."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append(f"{sub}: added")
            elif key not in new:
                out.append(f"{sub}: removed")
            else:
                out.extend(drift(old[key], new[key], sub))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for i, (a, b) in enumerate(zip(old, new, strict=False)) for line in drift(a, b, f"{path}[{i}]")]
    if old != new:
        return [f"{path}: {json.dumps(old)} -> {json.dumps(new)}"]
    return []


def run_config_adapt(
    host_map: Path | None,
    output: Path,
    topology: str | None,
    check: bool,
    local: bool,
    workdir: Path,
    base_port: int,
    engine: str | None = None,
    database: str | None = None,
) -> None:
    engine_, database_ = local_choices(engine, database)
    if local:
        if host_map is not None:
            raise ConfigError("give either a host map or --local, not both")
        hm = local_host_map(workdir, base_port, engine=engine_ or "local", database=database_ or "sqlite")
        config = adapt(hm, topology, work_dir=str(workdir.resolve()))
    else:
        if host_map is None:
            raise ConfigError("missing host map: h3flow config-adapt host-map.json (or --local)")
        if engine is not None:
            raise ConfigError('--engine goes with --local; a host map sets its own "engine"')
        if database is not None:
            raise ConfigError('--database goes with --local; a host map sets its own "prefect.database"')
        config = adapt(load_host_map(host_map), topology)
    fresh = render(config)
    if output.is_dir():
        raise ConfigError(f"-o {output} is a directory: name the file, e.g. -o {output / 'local.json'}")
    if check:
        if not output.exists():
            raise ConfigError(f"{output}: no such file to check against")
        try:
            existing = json.loads(output.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{output}: unreadable: {exc}") from None
        lines = drift(existing, fresh)
        if local:  # ports are picked afresh each time; they are not drift
            lines = [line for line in lines if "port" not in line and "url" not in line]
        if lines:
            console.print(f"[yellow]{output} has drifted from {host_map or 'the embedded default'}:[/]")
            for line in lines:
                console.print(f"  {line}")
            raise H3FlowError(f"{len(lines)} difference(s): rerun `h3flow config-adapt` to update {output}") from None
        console.print(f"[green]✓[/] {output} matches {host_map or 'the embedded default'}")
        return
    try:
        atomic_write_json(output, fresh, private=True)  # it names hosts, paths and the secret's source
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
    pools = ", ".join(f"{p.work_pool} ({p.role}, {len(p.gpus)}×{p.gpu_model})" for p in config.pools)
    console.print(f"[green]✓[/] wrote {output}: topology {config.topology}, engine {config.engine} — {pools}")


@app.command("config-adapt", rich_help_panel=SET_UP)
@operator_command
def config_adapt(
    host_map: Annotated[Optional[Path], typer.Argument(help="host-map.json written by the operator.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the resolved config.")] = Path(
        "local.json"
    ),
    topology: Annotated[
        Optional[str], typer.Option(help="Topology name (default: the host map's, else four_four_plus_one).")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Report drift against an existing local.json; write nothing.")
    ] = False,
    local: Annotated[bool, typer.Option("--local", help="The embedded default: every host is this machine.")] = False,
    workdir: Annotated[Path, typer.Option(help="Work dir for --local (stores, logs, Prefect home).")] = Path(".h3flow"),
    base_port: Annotated[int, typer.Option(help="First port tried for --local services.")] = 14200,
    engine: Annotated[
        Optional[str],
        typer.Option(help="--local: run the stages in-process (local) or in one local ComfyUI per pool (comfy)."),
    ] = None,
    database: Annotated[
        Optional[str],
        typer.Option(help="--local: the Prefect server's database, sqlite (default) or postgresql (Debian's, faster)."),
    ] = None,
) -> None:
    """Step 2: validate host-map.json and resolve it into local.json."""
    run_config_adapt(host_map, output, topology, check, local, workdir, base_port, engine, database)
