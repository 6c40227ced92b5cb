"""Run control: deploy, start a run, resume it, ask how it stands.

What the CLI, the demo and the benchmarks call. ``start_run`` validates the batch
before anything starts, writes the run's first manifest and submits the ``batch/run``
deployment (the dispatcher); from then on the dispatcher is the manifest's only writer.
``resume_run`` reconciles the manifest with the stores and submits the same run id again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.batch import load_batch
from h3flow.core.errors import H3FlowError
from h3flow.core.fsutil import atomic_write_json
from h3flow.pipeline.manifest import Manifest, load_manifest, new_manifest, new_run_id, run_dir, save_manifest
from h3flow.pipeline.run_report import summary

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

FINISHED = ("completed", "failed")
DEAD = ("FAILED", "CRASHED", "CANCELLED")


def deploy_everything(config_path: Path, config: LocalConfig | None = None) -> list[str]:
    """Work pools, deployments and blocks on the config's server (``deploy``, and ``start``
    when it starts something): an API that does not answer is an error, never a reason to
    start a temporary server."""
    from h3flow.pipeline.blocks import save_host_blocks, save_secret_block
    from h3flow.pipeline.deployments import deploy_all
    from h3flow.pipeline.prefect_api import prefect_api, require_api

    config = config or load_local_config(config_path)
    require_api(config)
    names = deploy_all(config, config_path)
    with prefect_api(config):
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
    return str(cast("FlowRun", run).id)  # Prefect's sync/async dual API


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
    if all(c.state == "delivered" for c in manifest.clips.values()):
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


def load_run(run_id: str, config_path: Path) -> Manifest:
    return load_manifest(load_local_config(config_path).runs_dir, run_id)


def as_json(manifest: Manifest) -> dict[str, Any]:
    return {**summary(manifest), "clips": {k: v.model_dump(mode="json") for k, v in manifest.clips.items()}}


def manifest_json(manifest: Manifest) -> dict[str, Any]:
    """``status --json``: the summary plus every clip's record."""
    return {**summary(manifest), "clips": {k: v.model_dump(mode="json") for k, v in manifest.clips.items()}}


def watch_run(
    run_id: str,
    config_path: Path,
    on_update: Callable[[Manifest], None] | None = None,
    timeout: float | None = None,
    every: float = 0.5,
) -> Manifest:
    """Follow a run until it ends (or its dispatcher dies); ``on_update`` sees each reading."""
    config = load_local_config(config_path)
    deadline = None if timeout is None else time.monotonic() + timeout
    checked = 0.0
    while True:
        manifest = load_manifest(config.runs_dir, run_id)
        if on_update is not None:
            on_update(manifest)
        if manifest.state in FINISHED:
            return manifest
        if time.monotonic() - checked > 5:
            checked = time.monotonic()
            got = dispatcher_state(config, manifest)
            if got and got[0] in DEAD:
                manifest.error = f"dispatcher {got[0].lower()}: {got[1] or ''}".strip()
                return manifest
        if deadline and time.monotonic() > deadline:
            raise H3FlowError(f"run {run_id} still running after {timeout:g} s")
        time.sleep(every)  # the poll interval of a reader of the manifest, not synchronisation
