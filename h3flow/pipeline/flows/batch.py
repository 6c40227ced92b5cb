"""The ``batch`` flow: plan, dispatch, collect, report — and the scheduled inbox.

Called with a batch file it runs that batch under ``run_id`` (a fresh one if absent;
an existing run id resumes that run). Called with no batch (the cron deployment), it
takes every ``*.json`` in the inbox folder and runs each, moving the file to
``done/`` or ``failed/`` with its run id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from h3flow.config.models import config_at
from h3flow.core.batch import load_batch
from h3flow.pipeline.dispatcher import Dispatcher, PrefectApi, planner_chooser
from h3flow.pipeline.flows.clip import config_path_or_env
from h3flow.pipeline.manifest import Manifest, load_manifest, manifest_path, new_manifest, new_run_id, save_manifest
from h3flow.pipeline.run_report import report_rows, write_run_report
from h3flow.planner.schedule import Schedule


def open_run(batch: str | None, run_id: str | None, config_path: str) -> Manifest:
    """The run's manifest: loaded when the run exists (resume), created from the batch otherwise."""
    config = config_at(config_path)
    if run_id and manifest_path(config.runs_dir, run_id).exists():
        return load_manifest(config.runs_dir, run_id)
    if batch is None:
        raise ValueError("a new run needs a batch file")
    parsed = load_batch(Path(batch))
    manifest = new_manifest(run_id or new_run_id(parsed.name), parsed.name, parsed.clips, config_path)
    save_manifest(config.runs_dir, manifest)
    return manifest


@flow(name="batch", log_prints=True)
def batch(batch: str | None = None, run_id: str | None = None, config_path: str | None = None) -> dict[str, Any]:
    """Dispatch a batch over the pools (or process the inbox when no batch is given)."""
    path = config_path_or_env(config_path)
    if batch is None and run_id is None:
        return process_inbox(path)
    return run_batch(batch, run_id, path)


def run_batch(batch_file: str | None, run_id: str | None, config_path: str) -> dict[str, Any]:
    from prefect.runtime import flow_run

    logger = get_run_logger()
    config = config_at(config_path)
    manifest = open_run(batch_file, run_id, config_path)
    if flow_run.id and str(flow_run.id) not in manifest.flow_run_ids:
        manifest.flow_run_ids.append(str(flow_run.id))
    total = len(manifest.clips)
    progress = cast(
        UUID, create_progress_artifact(progress=0.0, description=f"h3flow run {manifest.run_id}: clips delivered")
    )
    plan = plan_artifact(manifest, config_path)
    delivered = [len(manifest.delivered)]

    def on_change(m: Manifest) -> None:
        if len(m.delivered) != delivered[0]:
            delivered[0] = len(m.delivered)
            update_progress_artifact(progress, progress=100.0 * delivered[0] / total)

    api = PrefectApi()
    try:
        result = Dispatcher(
            config, config_path, manifest, api, choose=planner_chooser(config, plan), on_change=on_change
        ).run()
    finally:
        api.close()
    paths = write_run_report(result, config)
    create_table_artifact(
        key=f"report-{artifact_key(result.run_id)}",
        table=report_rows(result),
        description=f"h3flow run {result.run_id}: planned vs actual per clip and stage",
    )
    logger.info(
        "run %s %s: %d/%d delivered; report %s", result.run_id, result.state, len(result.delivered), total, paths["md"]
    )
    if "gantt" in paths:
        create_markdown_artifact(
            key=f"gantt-{artifact_key(result.run_id)}",
            markdown=f"![Gantt chart of run {result.run_id}]({gantt_data_uri(paths['gantt'])})\n\n`{paths['gantt']}`",
            description=f"h3flow run {result.run_id}: the run as executed",
        )
    save_manifest(config.runs_dir, result)  # the final state, last: `wait` returns on it
    if result.state == "failed":
        raise RuntimeError(f"run {result.run_id} failed: {result.error or ', '.join(c.clip.id for c in result.failed)}")
    return {"run_id": result.run_id, "state": result.state, "delivered": len(result.delivered)}


def gantt_data_uri(path: Path) -> str:
    """The PNG inline, so the Prefect UI shows the chart without a file server."""
    import base64

    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def artifact_key(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:60]


def plan_artifact(manifest: Manifest, config_path: str) -> Schedule | None:
    """The planner's prediction for this batch on this topology (a table and a Gantt chart in the UI);
    the dispatcher starts from it."""
    from h3flow.pipeline.manifest import run_dir
    from h3flow.pipeline.plan import plan_for_manifest
    from h3flow.planner.gantt import draw
    from h3flow.planner.resources import Resources

    config = config_at(config_path)
    schedule = plan_for_manifest(manifest, config)
    if schedule is None:
        return None
    resources = Resources.from_config(config)
    path = draw(
        schedule,
        resources,
        run_dir(config.runs_dir, manifest.run_id) / "plan-gantt.png",
        f"plan for run {manifest.run_id} on {config.topology} ({schedule.makespan:.1f} s)",
    )
    create_markdown_artifact(
        key=f"plan-gantt-{artifact_key(manifest.run_id)}",
        markdown=f"![planned Gantt chart]({gantt_data_uri(path)})",
        description=f"h3flow run {manifest.run_id}: the plan",
    )
    return schedule


def process_inbox(config_path: str) -> dict[str, Any]:
    config = config_at(config_path)
    if config.prefect.schedule is None:
        raise ValueError("no inbox: local.json has no prefect.schedule")
    inbox = Path(config.prefect.schedule.inbox)
    done: dict[str, str] = {}
    for file in sorted(inbox.glob("*.json")):
        claimed = inbox / "processing" / file.name
        claimed.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(file, claimed)  # one dispatcher per file, even with overlapping schedules
        except FileNotFoundError:
            continue
        run_id = new_run_id(file.stem)
        try:
            run_batch(str(claimed), run_id, config_path)
            outcome = "done"
        except Exception:  # noqa: BLE001 - the file's fate is recorded, the next file still runs
            outcome = "failed"
        target = inbox / outcome / f"{file.stem}.{run_id}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(claimed, target)
        done[file.name] = f"{outcome}:{run_id}"
    return done
