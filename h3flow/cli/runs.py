"""The operator's run commands: deploy, run, wait, status, runs, logs, cancel, resume (display only).

The work is :mod:`h3flow.pipeline.runs`; this module turns it into tables, progress
bars and exit codes. Tables fold long cells instead of cutting them, output paths are
shown relative to their folder (printed once), and every table has a ``--json`` twin.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from h3flow.cli.base import (
    BRING_UP,
    RUN,
    ConfigOpt,
    app,
    config_file,
    console,
    fold_table,
    operator_command,
    print_json,
    print_table,
)
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.manifest import ClipRecord, Manifest
from h3flow.pipeline.prefect_api import RunProgress
from h3flow.pipeline.run_report import summary, throughput

if TYPE_CHECKING:
    from h3flow.ops.lifecycle import ServiceState
    from h3flow.pipeline.deadlines import Slow
    from h3flow.pipeline.prefect_api import RunFlowRun

STATE_STYLE = {
    "pending": "dim",
    "sampling": "yellow",
    "sampled": "cyan",
    "decoding": "blue",
    "delivered": "green",
    "failed": "bold red",
    "cancelled": "magenta",
    "completed": "green",
    "running": "yellow",
    "unreadable": "bold red",
}


def styled(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def read_run(run_id: str, config_path: Path) -> Manifest:
    """The run's manifest from wherever its dispatcher keeps it (this machine or the control host)."""
    from h3flow.config.models import load_local_config
    from h3flow.ops.remote import manifest_reader

    return manifest_reader(load_local_config(config_path))(run_id)


def wait_for(run_id: str, config_path: Path, timeout: float | None = None) -> Manifest:
    """``wait``: progress bars (sampled, delivered) until the dispatcher ends; then the run's manifest."""
    from h3flow.pipeline.runs import watch_run

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
                    Text.assemble((f"{note}: still waiting", "yellow"))
                    if note
                    else Text("Prefect reachable again", "green"),
                    soft_wrap=True,
                )
                last_note[0] = note
            if seen.state != "UNREACHABLE":
                progress.update(bars["sampled"], completed=seen.sampled, total=seen.total)
                progress.update(bars["delivered"], completed=seen.delivered, total=seen.total)

        final = watch_run(run_id, config_path, show, timeout)
    manifest = read_run(run_id, config_path)
    if manifest.state not in ("completed", "failed", "cancelled"):
        manifest.error = f"dispatcher {final.state.lower()}: {final.message or 'no reason given'}"
    return manifest


def outputs_folder(manifest: Manifest) -> Path | None:
    """The folder that holds every output of the run (printed once; cells are relative to it)."""
    outputs = [rec.output for rec in manifest.clips.values() if rec.output]
    if not outputs:
        return None
    common = Path(os.path.commonpath(outputs))
    return common.parent if common.suffix == ".mp4" else common


def print_status(manifest: Manifest, links: dict[str, list[RunFlowRun]] | None = None) -> None:
    """A run's clips × stages; the outputs' folder once (each output relative to it, or
    ``<clip>.mp4`` for all); each failure's reason on its own line; the Prefect UI links."""
    folder = outputs_folder(manifest)
    relative = {
        cid: str(Path(rec.output).relative_to(folder))
        if folder and Path(rec.output).is_relative_to(folder)
        else rec.output
        for cid, rec in manifest.clips.items()
        if rec.output
    }
    own_column = any(name != f"{cid}.mp4" for cid, name in relative.items())
    stages = ("enc", "sample", "xfer", "dec")
    columns = ["clip", "pool", "state", *stages, *(["output"] if own_column else [])]
    table = fold_table(*columns, title=f"run {manifest.run_id} — {manifest.state}", right=stages)

    def cell(rec: ClipRecord, stage: str) -> str:
        got = rec.stages.get(stage)
        if got is None or got.seconds is None:
            return "·"
        return "cached" if got.cached else f"{got.seconds:.1f}s"

    for cid, rec in manifest.clips.items():
        row: list[Text | str] = [Text(cid), Text(rec.pool or "·"), styled(rec.state)]
        row += [cell(rec, stage) for stage in ("encode", "sample", "transfer", "decode")]
        if own_column:
            row.append(Text(relative.get(cid, "")))
        table.add_row(*row)
    print_table(table, short=("state", *stages))
    if folder:
        where = f"outputs: {folder}" + ("" if own_column else "/<clip>.mp4")
        console.print(Text(where), soft_wrap=True)
    for cid, rec in manifest.clips.items():
        if rec.error:
            kind = f" ({rec.failure.value})" if rec.failure else ""
            console.print(Text(f"{rec.state}{kind}: {cid}: {rec.error}", style="red"), soft_wrap=True)
    if manifest.error:
        console.print(Text(f"run error: {manifest.error}", style="red"), soft_wrap=True)
    how = throughput(summary(manifest), planned=False)
    if how:
        console.print(Text(how), soft_wrap=True)
    if links is not None:
        print_links(links, manifest)


ALL_LINKS_UP_TO = 20  # clips; a bigger run lists the links of the clips not delivered (--json: all)


def print_links(links: dict[str, list[RunFlowRun]], manifest: Manifest) -> None:
    """The Prefect UI page of the batch run and of each clip's flow runs (one line each, never cut)."""
    shown = {
        clip: runs
        for clip, runs in links.items()
        if not clip or len(manifest.clips) <= ALL_LINKS_UP_TO or manifest.clips[clip].state != "delivered"
    }
    console.print("Prefect UI:")
    for clip, runs in shown.items():
        for run in runs:
            what = "batch" if run.clip is None else f"{clip} {run.stage}"
            console.print(Text(f"  {what} ({run.state_name.lower()}): {run.link}"), soft_wrap=True)
    if len(shown) < len(links):
        console.print(f"  (delivered clips' links: `h3flow status {escape(manifest.run_id)} --json`)")


def status_json(manifest: Manifest, links: dict[str, list[RunFlowRun]] | None) -> dict[str, Any]:
    from h3flow.pipeline.runs import manifest_json

    out = manifest_json(manifest)
    if links is not None:
        out["prefect"] = {clip or "batch": [r.to_json() for r in runs] for clip, runs in links.items()}
    return out


def clip_links(config_path: Path, manifest: Manifest) -> tuple[dict[str, list[RunFlowRun]] | None, str | None]:
    """The run's flow runs grouped by clip ("" for the batch runs), or (None, why) when
    Prefect cannot be asked: the manifest alone still makes the table."""
    from h3flow.config.models import load_local_config
    from h3flow.pipeline.runs import run_flow_runs

    try:
        runs = run_flow_runs(load_local_config(config_path), manifest)
    except H3FlowError as exc:
        return None, str(exc)
    grouped: dict[str, list[RunFlowRun]] = {"": [r for r in runs if r.clip is None]}
    for clip in manifest.clips:
        grouped[clip] = [r for r in runs if r.clip == clip]
    return grouped, None


def finish(manifest: Manifest) -> int:
    """Exit code of wait: 0 when every clip is delivered, 1 otherwise (failures listed)."""
    failed = [c for c in manifest.clips.values() if c.state != "delivered"]
    if not failed and manifest.state == "completed":
        console.print(f"[green]✓[/] run {escape(manifest.run_id)}: {len(manifest.clips)} clips delivered")
        return 0
    reason = f" — {manifest.error}" if manifest.error else ""
    console.print(Text.assemble(("✗", "red"), f" run {manifest.run_id}: {manifest.state}{reason}"), soft_wrap=True)
    for rec in failed:
        console.print(Text(f"  {rec.clip.id}: {rec.state}" + (f" — {rec.error}" if rec.error else "")), soft_wrap=True)
    return 1


@app.command(rich_help_panel=BRING_UP)
@operator_command
def deploy(
    config: ConfigOpt = None,
    yaml_only: Annotated[
        Optional[Path], typer.Option("--yaml-only", help="Only write prefect.yaml here; contact no server.")
    ] = None,
    source_dir: Annotated[
        Optional[Path], typer.Option(help="Where h3flow's source lives on the workers' hosts.")
    ] = None,
) -> None:
    """Step 5: create work pools, deployments, blocks and prefect.yaml from local.json."""
    from h3flow.pipeline.runs import deploy_everything

    config_path = config_file(config)
    if yaml_only is not None:
        from h3flow.config.models import load_local_config
        from h3flow.core.paths import SOURCE_DIR
        from h3flow.pipeline.deployments import write_prefect_yaml

        write_prefect_yaml(load_local_config(config_path), config_path, yaml_only, source_dir or SOURCE_DIR)
        console.print(Text.assemble(("✓", "green"), f" wrote {yaml_only}"), soft_wrap=True)
        return
    for name in deploy_everything(config_path):
        console.print(Text.assemble(("✓", "green"), f" deployment {name}"), soft_wrap=True)


@app.command(rich_help_panel=RUN)
@operator_command
def run(
    batch: Annotated[Path, typer.Argument(help="Batch file (JSON): clips with prompt, image, spec, seed.")],
    background: Annotated[bool, typer.Option("--background", help="Print the run id and return at once.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Step 6: submit a batch; prints the run id (then waits, unless --background)."""
    from h3flow.config.models import load_local_config
    from h3flow.ops.remote import batch_stager, image_stager
    from h3flow.pipeline.runs import start_run

    config_path = config_file(config)
    loaded = load_local_config(config_path)
    run_id = start_run(batch, config_path, stage=image_stager(loaded), stage_batch=batch_stager(loaded))
    typer.echo(run_id)
    if not background:
        raise typer.Exit(finish(wait_for(run_id, config_path)))


@app.command(rich_help_panel=RUN)
@operator_command
def wait(
    run_id: Annotated[str, typer.Argument(help="The run id `run` printed.")],
    config: ConfigOpt = None,
    timeout: Annotated[Optional[float], typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Step 7: a progress bar until the run ends; exit 0 when every clip is delivered, 1 if some failed."""
    raise typer.Exit(finish(wait_for(run_id, config_file(config), timeout)))


def services_json(states: list[ServiceState]) -> list[dict[str, Any]]:
    return [
        {
            "service": st.spec.name,
            "kind": st.spec.kind,
            "host": st.spec.host,
            "running": st.proc.running,
            "pid": st.proc.pid if st.proc.running else None,
            "uptime_s": round(st.uptime, 1) if st.uptime is not None else None,
            "healthy": st.healthy,
            "detail": st.detail or None,
        }
        for st in states
    ]


def print_services(config_path: Path, as_json: bool) -> None:
    from h3flow.config.models import load_local_config
    from h3flow.ops.lifecycle import logs_where, render_status, service_status

    config = load_local_config(config_path)
    states = service_status(config, config_path)
    if as_json:
        print_json({"services": services_json(states), "logs": logs_where(config)})
        return
    console.print(render_status(states))
    console.print(Text(f"logs and PID files: {logs_where(config)}"), soft_wrap=True)


@app.command(rich_help_panel=RUN)
@operator_command
def status(
    run_id: Annotated[Optional[str], typer.Argument(help="A run id (omit with --services).")] = None,
    services: Annotated[bool, typer.Option("--services", help="What runs on each host instead.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Machine-readable: the manifest's records (or the services) as JSON.")
    ] = False,
    links: Annotated[
        bool, typer.Option("--links/--no-links", help="Ask Prefect for each clip's UI link (off: the manifest only).")
    ] = True,
    config: ConfigOpt = None,
) -> None:
    """A table of a run's clips x stages and their Prefect UI links (--services: the services on each host)."""
    config_path = config_file(config)
    if services:
        print_services(config_path, as_json)
        return
    if run_id is None:
        raise H3FlowError("give a run id, or --services")
    manifest = read_run(run_id, config_path)
    found, why = clip_links(config_path, manifest) if links else (None, None)
    slow = slow_in(manifest, config_path)
    if as_json:
        print_json({**status_json(manifest, found), "slow": [asdict(s) for s in slow]})
        return
    print_status(manifest, found)
    for clip in slow:
        console.print(Text(f"slow: {clip.line()}", style="yellow"), soft_wrap=True)
    if why:
        console.print(Text(f"(no Prefect UI links: {why})", style="dim"), soft_wrap=True)


def slow_in(manifest: Manifest, config_path: Path) -> list[Slow]:
    """The run's clips in flight for longer than the profile expects (none once the run is over)."""
    import time

    from h3flow.config.models import load_local_config
    from h3flow.pipeline.deadlines import slow_clips

    return slow_clips(manifest, load_local_config(config_path), time.time())


def age(stamp: str | None, now: datetime | None = None) -> str:
    """``3m``, ``2h05m``, ``4d``: how long ago an ISO time was."""
    if not stamp:
        return "?"
    seconds = int(((now or datetime.now(UTC)) - datetime.fromisoformat(stamp)).total_seconds())
    if seconds < 60:
        return f"{max(seconds, 0)}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d"


@app.command(rich_help_panel=RUN)
@operator_command
def runs(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show this many of the latest runs.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: the runs as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Recent runs, newest first: state, clips delivered / failed / left, age."""
    from h3flow.config.models import load_local_config
    from h3flow.ops.remote import run_lister

    found = run_lister(load_local_config(config_file(config)))(limit)
    if as_json:
        print_json({"runs": [r.to_json() for r in found]})
        return
    if not found:
        console.print("no runs yet: start one with `h3flow run batch.json`")
        return
    counts = ("delivered", "failed", "left", "age")
    table = fold_table("run", "state", *counts, right=counts)
    for r in found:
        delivered, failed = r.counts.get("delivered", 0), r.counts.get("failed", 0)
        table.add_row(
            Text(r.run_id),
            styled(r.state),
            f"{delivered}/{r.clips}",
            str(failed),
            str(r.clips - delivered - failed),
            age(r.created),
        )
    print_table(table, short=("state", *counts))


@app.command(rich_help_panel=RUN)
@operator_command
def logs(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    clip: Annotated[
        Optional[str], typer.Argument(help="A clip id: its flow runs' logs instead of the batch run's.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: the log lines as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """The Prefect logs of a run's batch flow run, or of one clip's flow runs."""
    from h3flow.config.models import load_local_config
    from h3flow.pipeline.runs import run_logs

    config_path = config_file(config)
    lines = run_logs(load_local_config(config_path), read_run(run_id, config_path), clip)
    if as_json:
        print_json({"run_id": run_id, "clip": clip, "logs": [line.to_json() for line in lines]})
        return
    if not lines:
        console.print(f"no log lines in Prefect for {'clip ' + clip if clip else 'the batch run'} of {run_id}")
    for line in lines:
        stamp = line.timestamp[11:23]  # HH:MM:SS.mmm (UTC)
        where = f"{line.flow_run} › {line.task_run}" if line.task_run else line.flow_run  # the UI's task names
        console.print(Text(f"{stamp} {line.level:<7} {where}: {line.message}"), soft_wrap=True)


@app.command(rich_help_panel=RUN)
@operator_command
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: what was cancelled, as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Cancel a run: its batch flow run and every clip flow run that has not ended (resume continues it later)."""
    from h3flow.config.models import load_local_config
    from h3flow.pipeline.runs import cancel_run

    config_path = config_file(config)
    cancelled = cancel_run(load_local_config(config_path), read_run(run_id, config_path))
    if as_json:
        print_json({"run_id": run_id, "cancelled": [r.to_json() for r in cancelled]})
        return
    if not cancelled:
        console.print(f"run {escape(run_id)}: nothing to cancel (every flow run has ended)")
        return
    for r in cancelled:
        console.print(Text(f"{r.state_name.lower():<10} {r.name}  {r.link}"), soft_wrap=True)
    console.print(
        f"run {escape(run_id)}: {len(cancelled)} flow run(s) cancelled; `h3flow resume {escape(run_id)}` continues it"
    )


@app.command(rich_help_panel=RUN)
@operator_command
def resume(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    background: Annotated[
        bool, typer.Option("--background", help="Return once the run is resubmitted (do not wait for it).")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Step 8: verify what exists and redo only the missing sampling / decoding."""
    from h3flow.config.models import load_local_config
    from h3flow.ops.remote import cluster_inventory, manifest_reader
    from h3flow.pipeline.runs import resume_run

    config_path = config_file(config)
    loaded = load_local_config(config_path)
    found = resume_run(run_id, config_path, read=manifest_reader(loaded), inventory=cluster_inventory(loaded))
    for line in found.repaired:
        console.print(Text.assemble(("repaired: ", "yellow"), line), soft_wrap=True)
    console.print(
        f"run {escape(run_id)}: {found.count('delivered')} delivered (verified), {found.count('sampled')} sampled "
        f"(latent verified on the decoder), {found.count('pending')} to sample"
    )
    if found.count("delivered") == len(found.states) or background:
        raise typer.Exit(0)
    raise typer.Exit(finish(wait_for(run_id, config_path)))
