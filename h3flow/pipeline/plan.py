"""The plan of a live run: what the batch flow shows before the clips start.

``plan_for_manifest`` simulates the run's clips on the run's own topology with the
planner's policy, writes each clip's planned stage seconds and the planned makespan into
the manifest (the run report compares them with the measured ones) and, inside a Prefect
flow, publishes the plan as a table artifact.
"""

from __future__ import annotations

import logging
import re

from h3flow.config.models import LocalConfig
from h3flow.core.errors import H3FlowError
from h3flow.planner.profile import load_profile
from h3flow.planner.resources import Resources
from h3flow.planner.simulate import BestOf, Schedule, simulate
from h3flow.planner.timing import PlanClip, Planner

log = logging.getLogger(__name__)

# the manifest's stages -> the planner's stages they cover
COVERS = {
    "encode": ("encode",),
    "offload": ("offload",),
    "sample": ("sample", "handoff"),
    "transfer": ("transfer",),
    "decode": ("decode", "mux"),
}


def plan_for_manifest(manifest, config: LocalConfig) -> Schedule | None:
    """Plan the manifest's clips on ``config``'s topology; None when the profile cannot (logged)."""
    try:
        profile = load_profile()
        planner = Planner(profile, Resources.from_config(config))
        clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
        planner.check(clips)
    except H3FlowError as exc:
        log.warning("no plan for run %s: %s", manifest.run_id, exc)
        return None
    schedule = simulate(clips, planner, BestOf(planner))
    seconds: dict[str, dict[str, float]] = {}
    for run in schedule.runs:
        seconds.setdefault(run.clip, {})[run.stage] = run.end - run.start
    for cid, rec in manifest.clips.items():
        rec.planned = {stage: sum(seconds[cid][s] for s in parts) for stage, parts in COVERS.items()}
    manifest.planned_makespan = round(schedule.makespan, 3)
    _artifact(manifest.run_id, schedule)
    return schedule


def _artifact(run_id: str, schedule: Schedule) -> None:
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
    try:
        from prefect.artifacts import create_table_artifact

        create_table_artifact(
            key="plan-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")[:55],
            table=rows,
            description=f"planned ({schedule.policy}): makespan {schedule.makespan:.1f} s, "
            f"{schedule.clips_per_hour:.2f} clips/h",
        )
    except Exception as exc:  # noqa: BLE001 - a missing UI artifact must not stop the run
        log.warning("plan artifact for run %s not published: %s", run_id, exc)
