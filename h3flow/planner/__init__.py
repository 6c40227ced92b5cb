"""The offline planner: schedule a batch over a topology, prove a bound, recommend a topology.

No network, no GPU, no torch: it imports pydantic, OR-Tools (CP-SAT and GLOP) and the
standard library (matplotlib only when drawing a Gantt chart).

API (the live dispatcher calls the policies with its own state)::

    from h3flow.planner import (Planner, Resources, State, best_schedule, load_profile,
                                make_policy, simulate, lower_bound, validate, FollowPlan)

    best = best_schedule(planner, clips, time_limit=2.0)  # heuristics + local search + CP-SAT
    best.schedule, best.proven, best.gap, best.method     # the schedule, its proven bound, the gap
    follow = FollowPlan.of(planner, best.schedule)        # a policy: the plan's pools, adapted live

    profile = load_profile()                      # or load_profile(Path("my-profile.toml"))
    resources = Resources.from_config(local_config)
    planner = Planner(profile, resources)         # stage durations of clips on these pools

    policy = make_policy("earliest-finish", planner)   # or "design" (round-robin)
    pool = policy.choose_pool(clip, State(
        busy_until={"a0": 40.0, "a1": 0.0, "xtx": 95.5, "host-a->host-b": 0.0, "b": 12.0},
        gone={"xtx"},                             # pools whose worker died
        full={"a1"},                              # pools with no free slot right now
        measured={("a0", "sample", "sd"): 81.3},  # (resource, stage, spec) -> s, overrides the profile
    ))                                            # -> "a0", or None: wait for a slot

    schedule = simulate(batch_or_clips, planner, policy)   # -> Schedule
    schedule.runs        # [StageRun(clip, stage, resource, start, end)], seconds from the start
    schedule.makespan, schedule.clips_per_hour, schedule.utilisation(resources.names)
    lower_bound(planner, clips).seconds           # no policy can finish sooner
    validate(schedule, planner, clips)            # [] or the violations, one line each

- ``State.busy_until`` maps every resource name (sampler pools, links named
  ``"<source host>-><target host>"``, decoder pools) to the seconds *from now* until it
  is free; missing names count as free. ``State.encode_free`` (optional) gives the
  seconds until an encoder pool could start a borrowed encode.
- Clips are anything with ``id``, ``spec`` and ``frames`` (``h3flow.core.batch.Clip``, or
  :class:`PlanClip`); ``simulate`` takes a :class:`~h3flow.core.batch.Batch` too.
- Stages: encode, offload (on the clip's encoder pool), sample, handoff (on its pool),
  transfer (link), decode, mux (decoder). See ``simulate.py`` for the rules and
  ``docs/planner.md`` for the model, the profile's derivations and measured figures.
"""

from __future__ import annotations

from h3flow.planner.best import Best, best_schedule
from h3flow.planner.bounds import Bound, lower_bound
from h3flow.planner.policies import (
    EarliestFinish,
    FollowPlan,
    Policy,
    Projection,
    RoundRobin,
    State,
    project,
)
from h3flow.planner.profile import DEFAULT_PROFILE, Profile, load_profile, parse_profile
from h3flow.planner.resources import Decoder, Link, Resources, SamplerPool
from h3flow.planner.simulate import (
    AHEAD,
    POLICIES,
    STAGES,
    Schedule,
    StageRun,
    clips_of,
    make_policy,
    simulate,
)
from h3flow.planner.timing import PlanClip, Planner, SamplerTimes
from h3flow.planner.validate import validate

__all__ = [
    "AHEAD",
    "DEFAULT_PROFILE",
    "POLICIES",
    "STAGES",
    "Best",
    "Bound",
    "Decoder",
    "EarliestFinish",
    "FollowPlan",
    "Link",
    "PlanClip",
    "Planner",
    "Policy",
    "Profile",
    "Projection",
    "Resources",
    "RoundRobin",
    "SamplerPool",
    "SamplerTimes",
    "Schedule",
    "StageRun",
    "State",
    "best_schedule",
    "clips_of",
    "load_profile",
    "lower_bound",
    "make_policy",
    "parse_profile",
    "project",
    "simulate",
    "validate",
]
