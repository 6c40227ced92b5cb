"""``h3flow demo``: the embedded default end to end on this machine.

config-adapt --local → start --local (Prefect server, workers, receiver) → run the
example batch (6 clips, reference model) → wait with a progress bar → say where the
MP4s, the Gantt chart and the report are → stop (unless ``--keep``).

``--engine comfy`` runs every stage in real local ComfyUI servers, one per pool
(installed once, cached), in a work dir of its own (``.h3flow-comfy``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from h3flow.cli.base import TRY_IT, app, console, local_choices, operator_command
from h3flow.core.errors import ConfigError
from h3flow.core.paths import EXAMPLES_DIR

DEMO_BATCH = EXAMPLES_DIR / "batches" / "demo.json"


def default_workdir(engine: str) -> Path:
    """Each engine has its own work dir, so the two demos' services and caches never mix."""
    return Path(".h3flow") if engine == "local" else Path(f".h3flow-{engine}")


def ensure_local_config(workdir: Path, base_port: int, engine: str = "local", database: str | None = None) -> Path:
    """Reuse the work dir's local.json while its services may be running; else write a fresh one."""
    from h3flow.config.adapt import adapt, local_host_map, render
    from h3flow.config.models import load_local_config
    from h3flow.core.fsutil import atomic_write_json

    engine_, database_ = local_choices(engine, database)
    path = workdir / "local.json"
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        hm = local_host_map(workdir, base_port, engine=engine_ or "local", database=database_ or "sqlite")
        atomic_write_json(path, render(adapt(hm, work_dir=str(workdir.resolve()))), private=True)
        return path
    config = load_local_config(path)
    if config.engine != engine:
        raise ConfigError(f"{path} runs engine {config.engine!r}, not {engine!r}: give another --workdir")
    have = config.prefect.database.kind if config.prefect.database else "sqlite"
    if database is not None and have != database:
        raise ConfigError(f"{path} keeps Prefect's database in {have}, not {database}: give another --workdir")
    return path


def run_demo(
    workdir: Path,
    keep: bool,
    base_port: int,
    batch: Path = DEMO_BATCH,
    *,
    engine: str = "local",
    database: str | None = None,
) -> int:
    from h3flow.cli.runs import finish, print_status, wait_for
    from h3flow.config.models import load_local_config
    from h3flow.ops.lifecycle import start_services, stop_services
    from h3flow.pipeline.prefect_api import ui_url
    from h3flow.pipeline.runs import start_run

    if not batch.exists():
        raise ConfigError(f"demo batch {batch} is missing")
    config_path = ensure_local_config(workdir, base_port, engine, database)
    config = load_local_config(config_path)
    t0 = time.monotonic()
    start_services(config, config_path, console=console)
    try:
        run_id = start_run(batch, config_path)
        console.print(Text.assemble("run id: ", (run_id, "bold")), soft_wrap=True)
        manifest = wait_for(run_id, config_path, timeout=900)
        print_status(manifest)
        code = finish(manifest)
        run_dir = Path(config.runs_dir) / manifest.run_id
        outputs = sorted({str(Path(c.output).parent) for c in manifest.clips.values() if c.output})
        lines = [f"videos:   {', '.join(outputs) or '—'}"]
        for name, what in (("gantt.png", "gantt:   "), ("report.md", "report:  "), ("manifest.json", "manifest:")):
            if (run_dir / name).exists():
                lines.append(f"{what} {run_dir / name}")
        lines.append(f"Prefect UI: {ui_url(config)}")
        if config.engine == "comfy":
            lines.append("ComfyUI:  " + ", ".join(f"{p.comfy_url} ({p.name})" for p in config.pools))
        lines.append(f"demo took {time.monotonic() - t0:.0f} s")
        for line in lines:  # whole lines, never cut or wrapped (a log keeps them copyable)
            console.print(Text(line), soft_wrap=True)
        return code
    finally:
        if not keep:
            stop_services(config, config_path, console=console)
        else:
            console.print(
                Text(f"services left running (--keep): stop them with `h3flow stop --local --config {config_path}`"),
                soft_wrap=True,
            )


@app.command(rich_help_panel=TRY_IT)
@operator_command
def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Leave the services running afterwards.")] = False,
    workdir: Annotated[
        Optional[Path],
        typer.Option(help="Where the stores, logs, runs and Prefect's database go (.h3flow, or .h3flow-comfy)."),
    ] = None,
    base_port: Annotated[int, typer.Option(help="First port tried for the local services.")] = 14200,
    batch: Annotated[Optional[Path], typer.Option(help="Another batch file instead of the example.")] = None,
    engine: Annotated[
        str, typer.Option(help="local: stages in-process; comfy: in one local ComfyUI per pool.")
    ] = "local",
    database: Annotated[
        Optional[str],
        typer.Option(help="The Prefect server's database: sqlite (default) or postgresql (Debian's, faster)."),
    ] = None,
) -> None:
    """The embedded default end to end: local Prefect server, 6 clips, reference model, real MP4s."""
    workdir = workdir or default_workdir(engine)
    raise typer.Exit(run_demo(workdir, keep, base_port, batch or DEMO_BATCH, engine=engine, database=database))
