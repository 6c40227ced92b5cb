"""The plan of a live run: what the batch flow shows before the clips start.

``plan_for_manifest`` plans the run's clips on the run's own topology with the planner's
best schedule (heuristics, local search and CP-SAT within ``PLAN_TIME_LIMIT``), writes
each clip's planned stage seconds and the planned makespan into the manifest (the run
report compares them with the measured ones), publishes the plan as a table artifact
inside a Prefect flow, and returns the schedule: the dispatcher starts from its
assignment of clips to pools (``h3flow.pipeline.dispatcher.planner_chooser``).
"""

from __future__ import annotations

import logging
import re

from h3flow.config.models import LocalConfig
from h3flow.core.errors import H3FlowError
from h3flow.planner.best import best_schedule
from h3flow.planner.profile import load_profile
from h3flow.planner.resources import Resources
from h3flow.planner.schedule import Schedule
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


PLAN_TIME_LIMIT = 2.0  # seconds of search before a run starts


def plan_for_manifest(manifest, config: LocalConfig, time_limit: float = PLAN_TIME_LIMIT) -> Schedule | None:
    """Plan the manifest's clips on ``config``'s topology; None when the profile cannot (logged)."""
    try:
        profile = load_profile()
        planner = Planner(profile, Resources.from_config(config))
        clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
        planner.check(clips)
    except H3FlowError as exc:
        log.warning("no plan for run %s: %s", manifest.run_id, exc)
        return None
    best = best_schedule(planner, clips, time_limit=time_limit)
    schedule = best.schedule
    seconds: dict[str, dict[str, float]] = {}
    for run in schedule.runs:
        seconds.setdefault(run.clip, {})[run.stage] = run.end - run.start
    for cid, rec in manifest.clips.items():
        rec.planned = {stage: sum(seconds[cid][s] for s in parts) for stage, parts in COVERS.items()}
    manifest.planned_makespan = round(schedule.makespan, 3)
    _artifact(manifest.run_id, schedule, best.proven)
    return schedule


def _artifact(run_id: str, schedule: Schedule, proven: float) -> None:
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
            f"{schedule.clips_per_hour:.2f} clips/h; proven bound {proven:.1f} s",
        )
    except Exception as exc:  # noqa: BLE001 - a missing UI artifact must not stop the run
        log.warning("plan artifact for run %s not published: %s", run_id, exc)
