"""The plan of a live run: what the planner predicts for this batch on this topology.

``plan_for_manifest`` plans the run's clips on the run's own topology with the planner's
best schedule (heuristics, local search and CP-SAT within ``PLAN_TIME_LIMIT``; the
heuristics alone for a batch over ``QUICK_PLAN_CLIPS``, so a 5000-clip batch starts at
once; the batch flow starts on the heuristics' plan and takes the searched one when a
thread has it, so no clip waits for the search), writes each clip's planned stage seconds and the planned makespan into the
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


def plan_clips(clips: list[PlanClip], config: LocalConfig, time_limit: float) -> Best | None:
    """The planner's best schedule of ``clips`` on ``config``'s topology (no search over
    ``QUICK_PLAN_CLIPS``); None when the profile cannot time them (logged)."""
    try:
        planner = Planner(load_profile(), Resources.from_config(config))
        planner.check(clips)
    except H3FlowError as exc:
        log.warning("no plan: %s", exc)
        return None
    return best_schedule(planner, clips, time_limit=time_limit if len(clips) <= QUICK_PLAN_CLIPS else 0.0)


def record_plan(manifest: Manifest, best: Best) -> None:
    """Write each clip's planned stage seconds and the planned makespan into the manifest."""
    seconds: dict[str, dict[str, float]] = {}
    for run in best.schedule.runs:
        seconds.setdefault(run.clip, {})[run.stage] = run.end - run.start
    for cid, rec in manifest.clips.items():
        rec.planned = {stage: sum(seconds[cid][s] for s in parts) for stage, parts in COVERS.items()}
    manifest.planned_makespan = round(best.schedule.makespan, 3)


def clips_of(manifest: Manifest) -> list[PlanClip]:
    return [PlanClip.of(rec.clip) for rec in manifest.clips.values()]


def plan_for_manifest(manifest: Manifest, config: LocalConfig, time_limit: float = PLAN_TIME_LIMIT) -> Best | None:
    """Plan the manifest's clips on ``config``'s topology and record the plan in it; None when the
    profile cannot (logged)."""
    best = plan_clips(clips_of(manifest), config, time_limit)
    if best is not None:
        record_plan(manifest, best)
    return best
