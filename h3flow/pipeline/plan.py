"""The plan of a live run: what the planner predicts for this batch on this topology.

``plan_for_manifest`` simulates the run's clips on the run's own topology with the
planner's policy and writes each clip's planned stage seconds and the planned makespan
into the manifest (the run report compares them with the measured ones). The batch flow
publishes it (:mod:`h3flow.pipeline.artifacts`).
"""

from __future__ import annotations

import logging

from h3flow.config.models import LocalConfig
from h3flow.core.contracts import COVERS
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.manifest import Manifest
from h3flow.planner.profile import load_profile
from h3flow.planner.resources import Resources
from h3flow.planner.simulate import BestOf, Schedule, simulate
from h3flow.planner.timing import PlanClip, Planner

log = logging.getLogger(__name__)


def plan_for_manifest(manifest: Manifest, config: LocalConfig) -> Schedule | None:
    """Plan the manifest's clips on ``config``'s topology; None when the profile cannot (logged)."""
    try:
        profile = load_profile()
        planner = Planner(profile, Resources.from_config(config, profile.encoder_vram_gb))
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
    return schedule
