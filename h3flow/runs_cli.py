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
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from h3flow.batch import load_batch
from h3flow.config import LocalConfig, load_local_config
from h3flow.errors import ConfigError, H3FlowError
from h3flow.fsutil import atomic_write_json
from h3flow.manifest import Manifest, load_manifest, new_manifest, new_run_id, run_dir, save_manifest
from h3flow.report import summary

console = Console(highlight=False)
STATE_STYLE = {
    "pending": "dim",
    "sampling": "yellow",
    "sampled": "cyan",
    "decoding": "blue",
    "delivered": "green",
    "failed": "bold red",
}


def deploy(config_path: Path) -> list[str]:
    from h3flow.blocks import save_host_blocks, save_secret_block
    from h3flow.deployments import deploy_all

    config = load_local_config(config_path)
    names = deploy_all(config, config_path)
    save_host_blocks(config)
    save_secret_block(config)
    return names


def submit(config: LocalConfig, config_path: Path, manifest: Manifest, batch_file: str | None) -> str:
    """Start the dispatcher as a run of the ``batch/run`` deployment; returns its flow run id."""
    from prefect.deployments import run_deployment

    from h3flow.prefect_api import prefect_api

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
        raise H3FlowError(f"cannot submit to Prefect at {config.prefect.api_url}: {exc} (is `h3flow start` done?)") from None
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


def resume(run_id: str, config_path: Path) -> Manifest:
    from h3flow.dispatch import reconcile

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

    from h3flow.prefect_api import prefect_api

    try:
        with prefect_api(config), get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(ids[-1]))
    except Exception:  # noqa: BLE001 - the server may be down; the manifest still speaks
        return None
    return (run.state_type.value if run.state_type else "PENDING", run.state.message if run.state else None)


def wait(run_id: str, config_path: Path, timeout: float | None = None) -> Manifest:
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
    for rec in manifest.clips.values():
        def cell(stage: str) -> str:
            got = rec.stages.get(stage)
            if got is None or got.seconds is None:
                return "·"
            return "cached" if got.cached else f"{got.seconds:.1f}s"

        style = STATE_STYLE[rec.state]
        table.add_row(
            rec.clip.id, rec.clip.spec, rec.pool or "·", f"[{style}]{rec.state}[/]",
            cell("encode"), cell("sample"), cell("transfer"), cell("decode"),
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
    console.print(f"[red]✗[/] run {manifest.run_id}: {manifest.state}" + (f" — {manifest.error}" if manifest.error else ""))
    for rec in failed:
        console.print(f"  {rec.clip.id}: {rec.state}" + (f" — {rec.error}" if rec.error else ""))
    return 1


def load_run(run_id: str, config_path: Path) -> Manifest:
    return load_manifest(load_local_config(config_path).runs_dir, run_id)


def as_json(manifest: Manifest) -> dict[str, Any]:
    return {**summary(manifest), "clips": {k: v.model_dump(mode="json") for k, v in manifest.clips.items()}}


__all__ = ["ConfigError", "deploy", "start_run", "resume", "wait", "print_status", "finish", "load_run"]
