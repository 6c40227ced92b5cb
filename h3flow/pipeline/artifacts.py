"""What the Prefect UI shows of a run: the plan, progress, the report, both Gantt charts.

Every artifact of a batch run is made here, keyed by the run id, so the UI's artifact
list groups a run's plan and report and a rerun replaces them instead of piling up.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import cast
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from h3flow.config.models import LocalConfig
from h3flow.core.contracts import artifact_key
from h3flow.pipeline.manifest import Manifest, run_dir
from h3flow.pipeline.run_report import report_rows
from h3flow.planner.schedule import Schedule

log = logging.getLogger(__name__)
GANTT_MAX_CLIPS = 200  # a larger plan is a table only: drawing thousands of bars is slow and unreadable


def gantt_data_uri(path: Path) -> str:
    """The PNG inline, so the Prefect UI shows the chart without a file server."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def publish_plan(manifest: Manifest, schedule: Schedule, config: LocalConfig, proven: float | None = None) -> None:
    """The planner's prediction for this batch: a table per clip and (up to a size) a Gantt chart."""
    from h3flow.planner.gantt import draw
    from h3flow.planner.resources import Resources

    rows = []
    for cid, runs in schedule.by_clip().items():
        ends = {r.stage: r for r in runs}
        rows.append(
            {
                "clip": cid,
                "pool": schedule.pool_of[cid],
                "decoder": schedule.decoder_of[cid],
                "sampled_at_s": round(ends["handoff"].end, 1),
                "delivered_at_s": round(ends["mux"].end, 1),
            }
        )
    create_table_artifact(
        key=artifact_key("plan", manifest.run_id),
        table=rows,
        description=f"planned ({schedule.policy}): makespan {schedule.makespan:.1f} s, "
        f"{schedule.clips_per_hour:.2f} clips/h" + (f"; proven bound {proven:.1f} s" if proven else ""),
    )
    if len(manifest.clips) > GANTT_MAX_CLIPS:
        return
    resources = Resources.from_config(config)
    path = draw(
        schedule,
        resources,
        run_dir(config.runs_dir, manifest.run_id) / "plan-gantt.png",
        f"plan for run {manifest.run_id} on {config.topology} ({schedule.makespan:.1f} s)",
    )
    create_markdown_artifact(
        key=artifact_key("plan-gantt", manifest.run_id),
        markdown=f"![planned Gantt chart]({gantt_data_uri(path)})",
        description=f"h3flow run {manifest.run_id}: the plan",
    )


class Progress:
    """The run's progress bar in the UI: the share of clips delivered."""

    def __init__(self, manifest: Manifest) -> None:
        self.total = len(manifest.clips)
        self.delivered = len(manifest.delivered)
        description = f"h3flow run {manifest.run_id}: clips delivered"
        self.id = cast(UUID, create_progress_artifact(progress=self.percent, description=description))

    @property
    def percent(self) -> float:
        return 100.0 * self.delivered / max(1, self.total)

    def update(self, manifest: Manifest) -> None:
        if len(manifest.delivered) != self.delivered:
            self.delivered = len(manifest.delivered)
            update_progress_artifact(self.id, progress=self.percent)


def publish_report(manifest: Manifest, paths: dict[str, Path]) -> None:
    """The run as executed: planned vs actual per clip and stage, and the executed Gantt chart."""
    create_table_artifact(
        key=artifact_key("report", manifest.run_id),
        table=report_rows(manifest),
        description=f"h3flow run {manifest.run_id}: planned vs actual per clip and stage",
    )
    if "gantt" in paths:
        create_markdown_artifact(
            key=artifact_key("gantt", manifest.run_id),
            markdown=f"![Gantt chart of run {manifest.run_id}]({gantt_data_uri(paths['gantt'])})\n\n`{paths['gantt']}`",
            description=f"h3flow run {manifest.run_id}: the run as executed",
        )
