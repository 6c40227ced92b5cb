"""``h3flow demo``: the embedded default end to end on this machine.

config-adapt --local → start --local (Prefect server, workers, receiver) → run the
example batch (6 clips, reference model) → wait with a progress bar → say where the
MP4s, the Gantt chart and the report are → stop (unless ``--keep``) → the commands
that look at what it made, printed so that they work as printed (``.venv/bin/h3flow …``
after ``make demo``, which keeps the services running).

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
    from h3flow.ops.lifecycle import start_local, stop_services
    from h3flow.pipeline.prefect_api import ui_url
    from h3flow.pipeline.runs import start_run

    if not batch.exists():
        raise ConfigError(f"demo batch {batch} is missing")
    config_path = ensure_local_config(workdir, base_port, engine, database)
    t0 = time.monotonic()
    config, _states = start_local(config_path, console=console)  # on other ports if another's hold these
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
        if keep:  # a live link only: without --keep the server stops below
            lines.append(f"Prefect UI: {ui_url(config)}")
        if config.engine == "comfy" and keep:
            lines.append("ComfyUI:  " + ", ".join(f"{p.comfy_url} ({p.name})" for p in config.pools))
        lines.append(f"demo took {time.monotonic() - t0:.0f} s")
        for line in lines:  # whole lines, never cut or wrapped (a log keeps them copyable)
            console.print(Text(line), soft_wrap=True)
        next_run = manifest.run_id
    finally:
        if not keep:
            stop_services(config, config_path, console=console)
    print_next_steps(next_run, config_path, outputs, kept=keep)
    return code


def next_steps(run_id: str, config_path: Path, outputs: list[str], *, kept: bool) -> list[tuple[str, str]]:
    """(what, command) to look at what a demo made; each command works as printed, from here."""
    from h3flow.cli.base import config_flag, invocation, shell_path

    h3, c = invocation(), config_flag(config_path)
    steps = [] if kept else [("start", f"{h3} start --local{c}")]
    steps += [
        ("UI", f"{h3} open {run_id}{c}"),
        ("status", f"{h3} status {run_id}{c}"),
        *[("MP4s", f"ls {shell_path(Path(folder))}") for folder in outputs],
        ("logs", f"{h3} logs {run_id}{c}"),
        ("stop", f"{h3} stop --local{c}"),
    ]
    return steps


def print_next_steps(run_id: str, config_path: Path, outputs: list[str], *, kept: bool) -> None:
    """The demo's last lines: the commands that look at what it made, each short enough
    for 80 columns and whole (never wrapped into two by rich)."""
    from h3flow.cli.base import activate_hint

    console.print()
    if kept:
        console.print(Text("Look at what it made (the services keep running):"), soft_wrap=True)
    else:
        console.print(
            Text("Look at what it made (the services are stopped: the UI and logs need them):"), soft_wrap=True
        )
    for what, command in next_steps(run_id, config_path, outputs, kept=kept):
        console.print(Text(f"  {what:<8}{command}"), soft_wrap=True)
    hint = activate_hint()
    if hint:
        console.print(Text(hint), soft_wrap=True)


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
