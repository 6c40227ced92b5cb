"""The operator's run commands: deploy, run, wait, status, resume (display only).

The work is :mod:`h3flow.pipeline.runs`; this module turns it into tables, progress
bars and exit codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from h3flow.cli.base import ConfigOpt, app, console, operator_command
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.manifest import (
    ClipRecord,
    Manifest,
)
from h3flow.pipeline.prefect_api import RunProgress
from h3flow.pipeline.run_report import summary
from h3flow.pipeline.runs import (
    deploy_everything,
    load_run,
    manifest_json,
    resume_run,
    start_run,
    watch_run,
)

STATE_STYLE = {
    "pending": "dim",
    "sampling": "yellow",
    "sampled": "cyan",
    "decoding": "blue",
    "delivered": "green",
    "failed": "bold red",
}


def wait_for(run_id: str, config_path: Path, timeout: float | None = None) -> Manifest:
    """``wait``: progress bars (sampled, delivered) until the dispatcher ends; then the run's manifest."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bars: dict[str, Any] = {}
        last_note: list[str | None] = [None]

        def show(seen: RunProgress) -> None:
            if not bars:
                bars["sampled"] = progress.add_task("sampled  ", total=seen.total)
                bars["delivered"] = progress.add_task("delivered", total=seen.total)
            note = seen.message if seen.state == "UNREACHABLE" else None
            if note != last_note[0]:
                progress.console.print(
                    f"[yellow]{note}: still waiting[/]" if note else "[green]Prefect reachable again[/]"
                )
                last_note[0] = note
            if seen.state != "UNREACHABLE":
                progress.update(bars["sampled"], completed=seen.sampled, total=seen.total)
                progress.update(bars["delivered"], completed=seen.delivered, total=seen.total)

        final = watch_run(run_id, config_path, show, timeout)
    manifest = load_run(run_id, config_path)
    if manifest.state not in ("completed", "failed", "cancelled"):
        manifest.error = f"dispatcher {final.state.lower()}: {final.message or 'no reason given'}"
    return manifest


def print_status(manifest: Manifest) -> None:
    table = Table(title=f"run {manifest.run_id} — {manifest.state}", header_style="bold")
    for column in ("clip", "spec", "pool", "state", "encode", "sample", "transfer", "decode", "output / error"):
        table.add_column(column)

    def cell(rec: ClipRecord, stage: str) -> str:
        got = rec.stages.get(stage)
        if got is None or got.seconds is None:
            return "·"
        return "cached" if got.cached else f"{got.seconds:.1f}s"

    for rec in manifest.clips.values():
        style = STATE_STYLE[rec.state]
        table.add_row(
            rec.clip.id,
            rec.clip.spec,
            rec.pool or "·",
            f"[{style}]{rec.state}[/]",
            cell(rec, "encode"),
            cell(rec, "sample"),
            cell(rec, "transfer"),
            cell(rec, "decode"),
            rec.output or rec.error or "",
        )
    console.print(table)
    info = summary(manifest)
    if info["makespan_s"]:
        console.print(f"makespan {info['makespan_s']} s · {info['clips_per_hour']} clips/h")


def finish(manifest: Manifest) -> int:
    """Exit code of wait: 0 when every clip is delivered, 1 otherwise (failures listed)."""
    failed = [c for c in manifest.clips.values() if c.state != "delivered"]
    if not failed and manifest.state == "completed":
        console.print(f"[green]✓[/] run {manifest.run_id}: {len(manifest.clips)} clips delivered")
        return 0
    console.print(
        f"[red]✗[/] run {manifest.run_id}: {manifest.state}" + (f" — {manifest.error}" if manifest.error else "")
    )
    for rec in failed:
        console.print(f"  {rec.clip.id}: {rec.state}" + (f" — {rec.error}" if rec.error else ""))
    return 1


@app.command()
@operator_command
def deploy(
    config: ConfigOpt = Path("local.json"),
    yaml_only: Annotated[
        Optional[Path], typer.Option("--yaml-only", help="Only write prefect.yaml here; contact no server.")
    ] = None,
    source_dir: Annotated[
        Optional[Path], typer.Option(help="Where h3flow's source lives on the workers' hosts.")
    ] = None,
) -> None:
    """Create work pools, deployments, blocks and prefect.yaml from local.json."""

    if yaml_only is not None:
        from h3flow.config.models import load_local_config
        from h3flow.core.paths import SOURCE_DIR
        from h3flow.pipeline.deployments import write_prefect_yaml

        write_prefect_yaml(load_local_config(config), config, yaml_only, source_dir or SOURCE_DIR)
        console.print(f"[green]✓[/] wrote {yaml_only}")
        return
    for name in deploy_everything(config):
        console.print(f"[green]✓[/] deployment {name}")


@app.command()
@operator_command
def run(
    batch: Annotated[Path, typer.Argument(help="Batch file (JSON): clips with prompt, image, spec, seed.")],
    background: Annotated[bool, typer.Option("--background", help="Print the run id and return at once.")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """Step 6: submit a batch; prints the run id (then waits, unless --background)."""
    run_id = start_run(batch, config)
    typer.echo(run_id)
    if not background:
        raise typer.Exit(finish(wait_for(run_id, config)))


@app.command()
@operator_command
def wait(
    run_id: str,
    config: ConfigOpt = Path("local.json"),
    timeout: Annotated[Optional[float], typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Step 7: a progress bar until the run ends; exit 0 when every clip is delivered, 1 if some failed."""
    raise typer.Exit(finish(wait_for(run_id, config, timeout)))


@app.command()
@operator_command
def status(
    run_id: Annotated[Optional[str], typer.Argument(help="A run id (omit with --services).")] = None,
    services: Annotated[bool, typer.Option("--services", help="What runs on each host instead.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """A table of a run's clips x stages (--services: the services on each host)."""
    if services:
        from h3flow.ops.lifecycle import print_service_status

        print_service_status(config)
        return
    if run_id is None:
        raise H3FlowError("give a run id, or --services")
    manifest = load_run(run_id, config)
    if as_json:
        import json

        typer.echo(json.dumps(manifest_json(manifest), indent=2))
    else:
        print_status(manifest)


@app.command()
@operator_command
def resume(
    run_id: str,
    background: Annotated[bool, typer.Option("--background")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """Step 8: verify what exists and redo only the missing sampling / decoding."""
    found = resume_run(run_id, config)
    for line in found.repaired:
        console.print(f"[yellow]repaired:[/] {line}")
    console.print(
        f"run {run_id}: {found.count('delivered')} delivered (verified), {found.count('sampled')} sampled "
        f"(latent verified on the decoder), {found.count('pending')} to sample"
    )
    if found.count("delivered") == len(found.states) or background:
        raise typer.Exit(0)
    raise typer.Exit(finish(wait_for(run_id, config)))
