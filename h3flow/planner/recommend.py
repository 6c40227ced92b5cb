"""Evaluate topologies on a batch, pick one with the 15% rule, and say so (table or JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from h3flow.planner.bounds import Bound, lower_bound
from h3flow.planner.policies import EarliestFinish, RoundRobin
from h3flow.planner.profile import Profile
from h3flow.planner.search import Candidate
from h3flow.planner.simulate import BestOf, Schedule, simulate
from h3flow.planner.timing import PlanClip, Planner
from h3flow.planner.validate import validate


@dataclass
class Evaluation:
    candidate: Candidate
    planner: Planner | None = None
    schedule: Schedule | None = None  # under the chosen policy
    design: Schedule | None = None  # under the design's round-robin
    bound: Bound | None = None
    modelled: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def rate(self) -> float:
        return self.schedule.clips_per_hour if self.schedule else 0.0

    def decoder_names(self) -> list[str]:
        return [d.name for d in self.candidate.resources.decoders] if self.candidate.resources else []


def evaluate(
    candidate: Candidate, clips: list[PlanClip], profile: Profile, policy: str, check: bool = True
) -> Evaluation:
    """Simulate ``clips`` on ``candidate`` under ``policy`` (and the design's, for comparison)."""
    ev = Evaluation(candidate)
    if candidate.resources is None:
        return ev
    planner = Planner(profile, candidate.resources)
    planner.check(clips)  # a missing profile entry fails here, naming the entry
    ev.planner = planner
    if policy == "best":
        best = BestOf(planner)
        best.order(clips)
        ev.schedule = best.schedules[best.chosen.name]
        ev.design = best.schedules[RoundRobin.name]
    else:
        ev.design = simulate(clips, planner, RoundRobin(planner))
        ev.schedule = ev.design if policy == "design" else simulate(clips, planner, EarliestFinish(planner))
    if check:  # the schedule the plan stands on (the tests validate every schedule)
        problems = validate(ev.schedule, planner, clips)
        if problems:  # a simulator bug, not an operator error: keep the traceback
            raise RuntimeError(f"invalid schedule for {candidate.name}: {problems[0]} (+{len(problems) - 1} more)")
    ev.bound = lower_bound(planner, clips)
    ev.modelled = dict(planner.modelled)
    return ev


# --------------------------------------------------------------------------- the 15% rule
@dataclass(frozen=True)
class Recommendation:
    name: str
    sentence: str
    rejected: str | None = None  # a faster topology that does not pay for its extra hardware


def _extra(small: Candidate, big: Candidate) -> str:
    parts = []
    if big.gpus > small.gpus:
        parts.append(f"{big.gpus - small.gpus} more GPU{'s' if big.gpus - small.gpus > 1 else ''} on the main host")
    for host in sorted(big.extras - small.extras):
        parts.append(f"the {host} host")
    for dec in sorted(big.decoders - small.decoders):
        parts.append(f"decoder {dec}")
    return " and ".join(parts) or "no extra hardware"


def recommend(evals: list[Evaluation], threshold: float) -> Recommendation | None:
    """The fastest topology whose extra hardware pays: it beats every topology that uses a
    subset of its hardware by at least ``threshold`` in clips/hour."""
    ok = [e for e in evals if e.schedule is not None]
    if not ok:
        return None

    def blocker(e: Evaluation) -> Evaluation | None:
        smaller = [s for s in ok if s.candidate.less_hardware(e.candidate) and e.rate < s.rate * (1 + threshold)]
        return max(smaller, key=lambda s: s.rate) if smaller else None

    acceptable = [e for e in ok if blocker(e) is None]
    rec = max(acceptable, key=lambda e: (round(e.rate, 6), -e.candidate.hardware_size))
    pct = threshold * 100
    smaller = [s for s in ok if s.candidate.less_hardware(rec.candidate)]
    if smaller:
        nearest = max(smaller, key=lambda s: (s.candidate.hardware_size, s.rate))
        gain = rec.rate / nearest.rate - 1
        why = (
            f"{rec.rate:.2f} clips/h, {gain:+.1%} over {nearest.name} (at least {pct:.0f}%): "
            f"worth {_extra(nearest.candidate, rec.candidate)}"
        )
    else:
        why = f"{rec.rate:.2f} clips/h on the least hardware that runs the batch"
    rejected = None
    faster = [e for e in ok if e.rate > rec.rate * (1 + 1e-9)]
    if faster:  # the fastest of all did not pay for its extra hardware: say against what
        top = max(faster, key=lambda e: e.rate)
        base = blocker(top) or rec
        gain = top.rate / base.rate - 1
        rejected = (
            f"{top.name} would add only {gain:+.1%} over {base.name} (under {pct:.0f}%): "
            f"not worth {_extra(base.candidate, top.candidate)}"
        )
    modelled = sorted(rec.modelled)
    caveat = f" (rests on modelled times: {'; '.join(modelled)}; measure before adopting)" if modelled else ""
    sentence = f"{rec.name}: {why}" + (f"; {rejected}" if rejected else "") + "." + caveat
    return Recommendation(rec.name, sentence, rejected)


# --------------------------------------------------------------------------- output
def row(ev: Evaluation, base: Evaluation | None) -> dict[str, Any]:
    c = ev.candidate
    out: dict[str, Any] = {"topology": ev.name, "canonical": c.canonical, "feasible": c.feasible}
    if not c.feasible or ev.schedule is None:
        out["reason"] = c.reason
        return out
    s, res = ev.schedule, c.resources
    assert res is not None and ev.bound is not None and ev.design is not None
    util = s.utilisation(res.names)
    decoders = ev.decoder_names()
    out.update(
        policy=s.policy,
        makespan_s=round(s.makespan, 3),
        clips_per_hour=round(s.clips_per_hour, 3),
        gain_over_baseline=round(s.clips_per_hour / base.rate - 1, 5) if base and base.rate else None,
        design_policy={
            "makespan_s": round(ev.design.makespan, 3),
            "clips_per_hour": round(ev.design.clips_per_hour, 3),
        },
        lower_bound_s=round(ev.bound.seconds, 3),
        lower_bound_binding=ev.bound.binding,
        makespan_over_lower_bound=round(s.makespan / ev.bound.seconds, 4),
        throughput_bound_clips_per_hour=round(ev.bound.clips_per_hour, 3),
        utilisation={k: round(v, 4) for k, v in util.items()},
        decoder_idle_pct={d: round(100 * (1 - util[d]), 2) for d in decoders},
        decoder_idle_gaps_s={d: round(s.idle_gaps(d), 3) for d in decoders},
        pools={
            p.name: f"{p.degree}x{p.gpu_model}" + (f" (encoded on {p.encoder})" if p.encoder != p.name else "")
            for p in res.samplers
        },
        modelled=ev.modelled,
    )
    return out


def report_json(
    evals: list[Evaluation], base: Evaluation, rec: Recommendation | None, meta: dict[str, Any]
) -> dict[str, Any]:
    return {
        **meta,
        "baseline": {"topology": base.name, "clips_per_hour": round(base.rate, 3), "why": BASELINE_WHY},
        "topologies": [row(e, base) for e in evals],
        "recommendation": {"topology": rec.name, "why": rec.sentence} if rec else None,
    }


BASELINE_WHY = (
    "every GPU of the main sampler host in one pool and no extra sampler: the same cards as the "
    "other topologies in their simplest deployment, so the gain is what the topology alone buys"
)
