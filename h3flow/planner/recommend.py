"""Evaluate topologies on a batch, pick one with the 15% rule, and say so (table or JSON).

The threshold is for *extra hosts* (the XTX box, a second decoder host): a topology that
uses an extra host must beat the best topology without it by at least the threshold in
clips/h. How Host A's own GPUs are split into pools is never "extra hardware": those
topologies compete on clips/h alone. Each extra host's gain is reported at the batch
size asked for, in steady state (n -> infinity, the throughput bound of the batch's mix),
and as the batch size from which it pays off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from h3flow.planner.best import best_schedule
from h3flow.planner.bounds import Bound, lower_bound
from h3flow.planner.improve import improve
from h3flow.planner.instance import Instance
from h3flow.planner.policies import EarliestFinish, RoundRobin
from h3flow.planner.profile import Profile
from h3flow.planner.schedule import Schedule
from h3flow.planner.search import Candidate
from h3flow.planner.sequence import from_schedule
from h3flow.planner.simulate import simulate
from h3flow.planner.timing import PlanClip, Planner
from h3flow.planner.validate import validate

METHODS = ("best", "earliest-finish", "design")
PAYOFF_SIZES = (*range(1, 17), 20, 24, 32, 40, 48)  # batch sizes scanned for "pays off from n clips"
PAYOFF_MAX_CLIPS = PAYOFF_SIZES[-1]


@dataclass
class Evaluation:
    candidate: Candidate
    planner: Planner | None = None
    schedule: Schedule | None = None  # under the chosen method
    design: Schedule | None = None  # under the design's round-robin
    bound: Bound | None = None  # analytic bound + steady-state throughput bound
    proven: float = 0.0  # the best proven lower bound (seconds)
    proven_by: str = ""
    method: str = ""  # what produced ``schedule``
    modelled: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def rate(self) -> float:
        return self.schedule.clips_per_hour if self.schedule else 0.0

    @property
    def steady(self) -> float:
        """Clips/h in steady state: the throughput bound of the batch's mix, which a long batch approaches."""
        return self.bound.clips_per_hour if self.bound else 0.0

    @property
    def gap(self) -> float:
        return max(0.0, self.schedule.makespan / self.proven - 1) if self.schedule and self.proven else 0.0

    def decoder_names(self) -> list[str]:
        return [d.name for d in self.candidate.resources.decoders] if self.candidate.resources else []


def evaluate(
    candidate: Candidate,
    clips: list[PlanClip],
    profile: Profile,
    method: str,
    *,
    time_limit: float = 2.0,
    check: bool = True,
) -> Evaluation:
    """Plan ``clips`` on ``candidate`` with ``method`` (and the design's round-robin, for comparison)."""
    ev = Evaluation(candidate)
    if candidate.resources is None:
        return ev
    planner = Planner(profile, candidate.resources)
    planner.check(clips)  # a missing profile entry fails here, naming the entry
    ev.planner = planner
    if method == "best":
        best = best_schedule(planner, clips, time_limit=time_limit)
        ev.schedule, ev.design, ev.bound = best.schedule, best.heuristics[RoundRobin.name], best.bound
        ev.proven, ev.proven_by, ev.method = best.proven, best.proven_by, best.method
    else:
        ev.design = simulate(clips, planner, RoundRobin(planner))
        ev.schedule = ev.design if method == "design" else simulate(clips, planner, EarliestFinish(planner))
        ev.bound = lower_bound(planner, clips)
        ev.proven, ev.proven_by, ev.method = ev.bound.seconds, f"analytic ({ev.bound.binding})", method
    if check:  # the schedule the plan stands on
        problems = validate(ev.schedule, planner, clips)
        if problems:  # a planner bug, not an operator error: keep the traceback
            raise RuntimeError(f"invalid schedule for {candidate.name}: {problems[0]} (+{len(problems) - 1} more)")
    ev.modelled = dict(planner.modelled)
    return ev


# --------------------------------------------------------------------------- the 15% rule
def hosts(c: Candidate) -> frozenset[str]:
    """The hosts beyond the main sampler host that a topology uses: extra samplers and decoders."""
    return c.extras | c.decoders


@dataclass(frozen=True)
class Payoff:
    """What one extra host adds: at the asked batch size, in steady state, and from which batch size it pays."""

    host: str
    with_host: str
    without_host: str
    clips: int
    gain: float
    steady_gain: float
    pays_from: int | None  # the smallest batch size from which it adds >= the threshold (None: never)

    def sentence(self, threshold: float) -> str:
        pct = f"{threshold * 100:.0f}%"
        if self.steady_gain < threshold:
            when = f"never {pct} ({self.steady_gain:+.1%} in steady state)"
        elif self.pays_from is None:
            when = f">= {pct} only beyond {PAYOFF_MAX_CLIPS} clips, {self.steady_gain:+.1%} in steady state"
        else:
            when = f">= {pct} from {self.pays_from} clips, {self.steady_gain:+.1%} in steady state"
        return f"the {self.host} host adds {self.gain:+.1%} at {self.clips} clips, {when}"

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "with": self.with_host,
            "without": self.without_host,
            "clips": self.clips,
            "gain": round(self.gain, 5),
            "steady_state_gain": round(self.steady_gain, 5),
            "pays_off_from_clips": self.pays_from,
        }


@dataclass(frozen=True)
class Recommendation:
    name: str
    sentence: str
    rejected: str | None = None  # a faster topology whose extra host does not pay at this batch size
    payoffs: tuple[Payoff, ...] = ()


def _extra(small: Candidate, big: Candidate) -> str:
    parts = [f"the {h} host" for h in sorted(big.extras - small.extras)]
    parts += [f"decoder {d}" for d in sorted(big.decoders - small.decoders)]
    return " and ".join(parts) or "no extra host"


def recommend(
    evals: list[Evaluation], threshold: float, clips: Sequence[PlanClip] | None = None
) -> Recommendation | None:
    """The fastest topology whose extra hosts pay: it beats every topology that uses a subset of its
    extra hosts by at least ``threshold`` in clips/hour. With ``clips``, each extra host's pay-off is
    scanned over batch sizes too."""
    ok = [e for e in evals if e.schedule is not None]
    if not ok:
        return None

    def fewer_hosts(s: Evaluation, e: Evaluation) -> bool:
        return hosts(s.candidate) < hosts(e.candidate)

    def blocker(e: Evaluation) -> Evaluation | None:
        smaller = [s for s in ok if fewer_hosts(s, e) and e.rate < s.rate * (1 + threshold)]
        return max(smaller, key=lambda s: s.rate) if smaller else None

    acceptable = [e for e in ok if blocker(e) is None]
    rec = max(acceptable, key=lambda e: (round(e.rate, 6), -e.candidate.hardware_size))
    n = len(rec.schedule.clips) if rec.schedule else 0
    pct = threshold * 100
    why = f"{rec.rate:.2f} clips/h at {n} clips ({rec.steady:.2f} in steady state)"
    smaller = [s for s in ok if fewer_hosts(s, rec)]
    if smaller:
        nearest = max(smaller, key=lambda s: (len(hosts(s.candidate)), s.rate))
        why += (
            f", {rec.rate / nearest.rate - 1:+.1%} over {nearest.name} (at least {pct:.0f}%): "
            f"worth {_extra(nearest.candidate, rec.candidate)}"
        )
    rejected = None
    faster = [e for e in ok if e.rate > rec.rate * (1 + 1e-9)]
    if faster:  # the fastest of all did not pay for its extra host: say against what
        top = max(faster, key=lambda e: e.rate)
        base = blocker(top) or rec
        rejected = (
            f"{top.name} would add only {top.rate / base.rate - 1:+.1%} over {base.name} at {n} clips "
            f"(under {pct:.0f}%): not worth {_extra(base.candidate, top.candidate)} at this batch size"
        )
    payoffs = tuple(_payoffs(ok, rec, threshold, clips)) if clips else ()
    modelled = sorted(rec.modelled)
    caveat = f" (rests on modelled times: {'; '.join(modelled)}; measure before adopting)" if modelled else ""
    parts = [f"{rec.name}: {why}"] + ([rejected] if rejected else []) + [p.sentence(threshold) for p in payoffs]
    return Recommendation(rec.name, "; ".join(parts) + "." + caveat, rejected, payoffs)


def _payoffs(ok: list[Evaluation], rec: Evaluation, threshold: float, clips: Sequence[PlanClip]) -> list[Payoff]:
    """For each extra host: the recommendation with and without it, over batch sizes."""
    out = []
    every = sorted({h for e in ok for h in hosts(e.candidate)})
    for host in every:
        mine = hosts(rec.candidate)
        want_with, want_without = mine | {host}, mine - {host}
        with_ = [e for e in ok if hosts(e.candidate) == want_with]
        without = [e for e in ok if hosts(e.candidate) == want_without]
        if not with_ or not without:
            continue
        a, b = max(with_, key=lambda e: e.rate), max(without, key=lambda e: e.rate)
        steady = a.steady / b.steady - 1 if b.steady else 0.0
        gains = {len(clips): a.rate / b.rate - 1}
        if steady >= threshold:
            for size in PAYOFF_SIZES:
                gains.setdefault(size, _quick_rate(a, clips, size) / _quick_rate(b, clips, size) - 1)
        pays_from = None
        if steady >= threshold:
            for size in sorted(gains, reverse=True):
                if gains[size] < threshold:
                    break
                pays_from = size
        out.append(Payoff(host, a.name, b.name, len(clips), gains[len(clips)], steady, pays_from))
    return out


def resized(clips: Sequence[PlanClip], size: int) -> list[PlanClip]:
    """A batch of ``size`` clips in the same mix: the batch's clips in turn."""
    return [PlanClip(f"n{i}", clips[i % len(clips)].spec, clips[i % len(clips)].frames) for i in range(size)]


def _quick_rate(ev: Evaluation, clips: Sequence[PlanClip], size: int) -> float:
    """Clips/h of ``size`` clips of the batch's mix: the better heuristic, briefly improved."""
    assert ev.planner is not None
    batch = resized(clips, size)
    planner = ev.planner
    best = min((simulate(batch, planner, p(planner)) for p in (EarliestFinish, RoundRobin)), key=lambda s: s.makespan)
    span = best.makespan
    if size > 1:
        inst = Instance.of(planner, batch)
        _, span = improve(inst, from_schedule(inst, best), seconds=0.05, max_evals=100)
    return size * 3600.0 / min(span, best.makespan)


# --------------------------------------------------------------------------- output
def row(ev: Evaluation, base: Evaluation | None, with_schedule: bool = True) -> dict[str, Any]:
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
        method=ev.method,
        makespan_s=round(s.makespan, 3),
        clips_per_hour=round(s.clips_per_hour, 3),
        steady_state_clips_per_hour=round(ev.steady, 3),
        gain_over_baseline=round(s.clips_per_hour / base.rate - 1, 5) if base and base.rate else None,
        design_policy={
            "makespan_s": round(ev.design.makespan, 3),
            "clips_per_hour": round(ev.design.clips_per_hour, 3),
        },
        proven_bound_s=round(ev.proven, 3),
        proven_by=ev.proven_by,
        gap=round(ev.gap, 5),
        analytic_bound_s=round(ev.bound.seconds, 3),
        analytic_bound_binding=ev.bound.binding,
        utilisation={k: round(v, 4) for k, v in util.items()},
        decoder_idle_pct={d: round(100 * (1 - util[d]), 2) for d in decoders},
        decoder_idle_gaps_s={d: round(s.idle_gaps(d), 3) for d in decoders},
        pools={
            p.name: f"{p.degree}x{p.gpu_model}" + (f" (encoded on {p.encoder})" if p.encoder != p.name else "")
            for p in res.samplers
        },
        modelled=ev.modelled,
    )
    if with_schedule:
        out["schedule"] = s.per_clip()
    return out


def report_json(
    evals: list[Evaluation], base: Evaluation, rec: Recommendation | None, meta: dict[str, Any]
) -> dict[str, Any]:
    return {
        **meta,
        "baseline": {"topology": base.name, "clips_per_hour": round(base.rate, 3), "why": BASELINE_WHY},
        "topologies": [row(e, base) for e in evals],
        "recommendation": {
            "topology": rec.name,
            "why": rec.sentence,
            "extra_hosts": [p.as_json() for p in rec.payoffs],
        }
        if rec
        else None,
    }


BASELINE_WHY = (
    "every GPU of the main sampler host in one pool and no extra sampler: the same cards as the "
    "other topologies in their simplest deployment, so the gain is what the topology alone buys"
)
