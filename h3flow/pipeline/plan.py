"""The plan of a live run: what the planner predicts for this batch on this topology.

``plan_for_manifest`` plans the run's clips on the run's own topology with the planner's
best schedule (heuristics, local search and CP-SAT within ``PLAN_TIME_LIMIT``; the
heuristics alone for a batch over ``QUICK_PLAN_CLIPS``, so a 5000-clip batch starts at
once), writes each clip's planned stage seconds and the planned makespan into the
manifest (the run report compares them with the measured ones), and returns it: the
dispatcher starts from its assignment of clips to pools
(:func:`h3flow.pipeline.dispatcher.planner_chooser`), and the batch flow publishes it
(:mod:`h3flow.pipeline.artifacts`).
"""

from __future__ import annotations

import logging

from h3flow.config.models import LocalConfig
from h3flow.core.contracts import COVERS
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.manifest import Manifest
from h3flow.planner.best import Best, best_schedule
from h3flow.planner.profile import load_profile
from h3flow.planner.resources import Resources
from h3flow.planner.timing import PlanClip, Planner

log = logging.getLogger(__name__)

PLAN_TIME_LIMIT = 2.0  # seconds of search before a run starts
QUICK_PLAN_CLIPS = 500  # above this, the heuristics only: the first clip must not wait for the search


def plan_for_manifest(manifest: Manifest, config: LocalConfig, time_limit: float = PLAN_TIME_LIMIT) -> Best | None:
    """Plan the manifest's clips on ``config``'s topology; None when the profile cannot (logged)."""
    try:
        profile = load_profile()
        planner = Planner(profile, Resources.from_config(config))
        clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
        planner.check(clips)
    except H3FlowError as exc:
        log.warning("no plan for run %s: %s", manifest.run_id, exc)
        return None
    best = best_schedule(planner, clips, time_limit=time_limit if len(clips) <= QUICK_PLAN_CLIPS else 0.0)
    seconds: dict[str, dict[str, float]] = {}
    for run in best.schedule.runs:
        seconds.setdefault(run.clip, {})[run.stage] = run.end - run.start
    for cid, rec in manifest.clips.items():
        rec.planned = {stage: sum(seconds[cid][s] for s in parts) for stage, parts in COVERS.items()}
    manifest.planned_makespan = round(best.schedule.makespan, 3)
    return best
