"""The operator's run commands: deploy, run, wait, status, resume.

``run`` validates the batch before anything starts, writes the run's manifest and
submits the ``batch/run`` deployment; ``wait`` and ``status`` read the manifest (the
dispatcher rewrites it atomically after every change) and ask Prefect whether the
dispatcher is still alive; ``resume`` re-submits the same run id, and the dispatcher
redoes only what the stores do not already hold.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from h3flow.cli.base import ConfigOpt, app, console, operator_command
from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.batch import load_batch
from h3flow.core.errors import H3FlowError
from h3flow.core.fsutil import atomic_write_json
from h3flow.pipeline.manifest import (
    ClipRecord,
    Manifest,
    load_manifest,
    new_manifest,
    new_run_id,
    run_dir,
    save_manifest,
)
from h3flow.pipeline.run_report import summary

STATE_STYLE = {
    "pending": "dim",
    "sampling": "yellow",
    "sampled": "cyan",
    "decoding": "blue",
    "delivered": "green",
    "failed": "bold red",
}


def deploy_all_from(config_path: Path) -> list[str]:
    from h3flow.pipeline.blocks import save_host_blocks, save_secret_block
    from h3flow.pipeline.deployments import deploy_all

    config = load_local_config(config_path)
    names = deploy_all(config, config_path)
    save_host_blocks(config)
    save_secret_block(config)
    return names


def submit(config: LocalConfig, config_path: Path, manifest: Manifest, batch_file: str | None) -> str:
    """Start the dispatcher as a run of the ``batch/run`` deployment; returns its flow run id."""
    from prefect.deployments import run_deployment

    from h3flow.pipeline.prefect_api import prefect_api

    try:
        with prefect_api(config):
            run = run_deployment(
                "batch/run",
                parameters={"batch": batch_file, "run_id": manifest.run_id, "config_path": str(config_path.resolve())},
                timeout=0,
                as_subflow=False,
                flow_run_name=manifest.run_id,
            )
    except Exception as exc:  # noqa: BLE001 - any API failure here means: nothing started
        raise H3FlowError(
            f"cannot submit to Prefect at {config.prefect.api_url}: {exc} (is `h3flow start` done?)"
        ) from None
    return str(run.id)


def start_run(batch_file: Path, config_path: Path) -> Manifest:
    config = load_local_config(config_path)
    batch = load_batch(batch_file)
    manifest = new_manifest(new_run_id(batch.name), batch.name, batch.clips, str(config_path.resolve()))
    save_manifest(config.runs_dir, manifest)
    record_dispatcher(config, manifest, submit(config, config_path, manifest, str(batch_file.resolve())))
    return manifest


def submitted_path(config: LocalConfig, run_id: str) -> Path:
    return run_dir(config.runs_dir, run_id) / "dispatchers.json"


def record_dispatcher(config: LocalConfig, manifest: Manifest, flow_run_id: str) -> None:
    """Note the dispatcher's flow run at once (beside the manifest, which only the
    dispatcher writes), so `wait` can tell if it dies before it ever starts."""
    path = submitted_path(config, manifest.run_id)
    ids = json.loads(path.read_text()) if path.exists() else []
    atomic_write_json(path, [*ids, flow_run_id])


def resume_run(run_id: str, config_path: Path) -> Manifest:
    from h3flow.pipeline.dispatcher import reconcile

    config = load_local_config(config_path)
    manifest = load_manifest(config.runs_dir, run_id)
    reconcile(config, manifest)
    states = [c.state for c in manifest.clips.values()]
    console.print(
        f"run {run_id}: {states.count('delivered')} delivered (verified), {states.count('sampled')} sampled "
        f"(latent verified on the decoder), {states.count('pending')} to sample, {states.count('failed')} failed"
    )
    if all(s == "delivered" for s in states):
        return manifest
    for rec in manifest.clips.values():  # a failed clip gets a fresh chance on resume
        if rec.state == "failed":
            rec.state, rec.error, rec.attempts = "pending", None, 0
    manifest.state = "pending"
    save_manifest(config.runs_dir, manifest)
    record_dispatcher(config, manifest, submit(config, config_path, manifest, None))
    return manifest


def dispatcher_state(config: LocalConfig, manifest: Manifest) -> tuple[str, str | None] | None:
    """The state of the newest dispatcher flow run, or None when Prefect can't tell."""
    path = submitted_path(config, manifest.run_id)
    ids = json.loads(path.read_text()) if path.exists() else manifest.flow_run_ids
    if not ids:
        return None
    from uuid import UUID

    from prefect.client.orchestration import get_client

    from h3flow.pipeline.prefect_api import prefect_api

    try:
        with prefect_api(config), get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(ids[-1]))
    except Exception:  # noqa: BLE001 - the server may be down; the manifest still speaks
        return None
    return (run.state_type.value if run.state_type else "PENDING", run.state.message if run.state else None)


def wait_for(run_id: str, config_path: Path, timeout: float | None = None) -> Manifest:
    config = load_local_config(config_path)
    manifest = load_manifest(config.runs_dir, run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    total = len(manifest.clips)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        sampled = progress.add_task("sampled  ", total=total)
        delivered = progress.add_task("delivered", total=total)
        checked = 0.0
        while True:
            manifest = load_manifest(config.runs_dir, run_id)
            states = [c.state for c in manifest.clips.values()]
            progress.update(sampled, completed=sum(s in ("sampled", "decoding", "delivered") for s in states))
            progress.update(delivered, completed=states.count("delivered"))
            if manifest.state in ("completed", "failed"):
                break
            if time.monotonic() - checked > 5:
                checked = time.monotonic()
                got = dispatcher_state(config, manifest)
                if got and got[0] in ("FAILED", "CRASHED", "CANCELLED"):
                    manifest.error = f"dispatcher {got[0].lower()}: {got[1] or ''}".strip()
                    break
            if deadline and time.monotonic() > deadline:
                raise H3FlowError(f"run {run_id} still running after {timeout:g} s")
            time.sleep(0.5)  # the refresh interval of a progress display
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


def load_run(run_id: str, config_path: Path) -> Manifest:
    return load_manifest(load_local_config(config_path).runs_dir, run_id)


def as_json(manifest: Manifest) -> dict[str, Any]:
    return {**summary(manifest), "clips": {k: v.model_dump(mode="json") for k, v in manifest.clips.items()}}


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
    for name in deploy_all_from(config):
        console.print(f"[green]✓[/] deployment {name}")


@app.command()
@operator_command
def run(
    batch: Annotated[Path, typer.Argument(help="Batch file (JSON): clips with prompt, image, spec, seed.")],
    background: Annotated[bool, typer.Option("--background", help="Print the run id and return at once.")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """Step 6: submit a batch; prints the run id (then waits, unless --background)."""
    manifest = start_run(batch, config)
    typer.echo(manifest.run_id)
    if not background:
        raise typer.Exit(finish(wait_for(manifest.run_id, config)))


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

        typer.echo(json.dumps(as_json(manifest), indent=2))
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
    manifest = resume_run(run_id, config)
    if manifest.state == "completed" or background:
        raise typer.Exit(0)
    raise typer.Exit(finish(wait_for(run_id, config)))
