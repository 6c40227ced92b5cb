"""Plan a batch on every candidate topology, giving the search time to those that decide the recommendation.

Every feasible topology first gets the heuristics and the analytic bound (milliseconds).
With the ``best`` policy the time budget (``--time-limit``, seconds for the whole plan)
then goes, in slices, to the topologies that could still change the recommendation: in
each group of topologies using the same extra hosts, those whose proven bound leaves them
a chance to be the group's fastest — the tentative recommendation first and most, then
the group leaders. A topology that cannot be the fastest of its group keeps its
heuristic schedule: its gap says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from h3flow.planner.best import Best, Search
from h3flow.planner.bounds import Bound, lower_bound
from h3flow.planner.policies import EarliestFinish, RoundRobin
from h3flow.planner.profile import Profile
from h3flow.planner.schedule import Schedule
from h3flow.planner.search import Candidate
from h3flow.planner.simulate import simulate
from h3flow.planner.timing import PlanClip, Planner
from h3flow.planner.validate import validate

METHODS = ("best", "earliest-finish", "design")
MIN_SLICE = 0.04  # seconds: a slice shorter than this does not reach the search


@dataclass
class Evaluation:
    candidate: Candidate
    planner: Planner | None = None
    search: Search | None = None  # the "best" policy: improved in slices
    fixed: Best | None = None  # a simulator policy's schedule and the analytic bound
    design: Schedule | None = None  # under the design's round-robin
    modelled: dict[str, str] = field(default_factory=dict)
    slices: int = 0
    reference: bool = False  # planned for comparison only (the baseline when not asked for): never recommended

    @property
    def best(self) -> Best | None:
        return self.search.best if self.search is not None else self.fixed

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def schedule(self) -> Schedule | None:
        return self.best.schedule if self.best else None

    @property
    def bound(self) -> Bound | None:
        return self.best.bound if self.best else None

    @property
    def proven(self) -> float:
        return self.best.proven if self.best else 0.0

    @property
    def proven_by(self) -> str:
        return self.best.proven_by if self.best else ""

    @property
    def method(self) -> str:
        return self.best.method if self.best else ""

    @property
    def optimal(self) -> bool:
        return bool(self.best and self.best.optimal)

    @property
    def gap(self) -> float:
        return self.best.gap if self.best else 0.0

    @property
    def clips(self) -> int:
        return len(self.schedule.clips) if self.schedule else 0

    @property
    def rate(self) -> float:
        return self.schedule.clips_per_hour if self.schedule else 0.0

    @property
    def rate_bound(self) -> float:
        """Clips/h no schedule of this topology beats (from the proven bound)."""
        return self.clips * 3600.0 / self.proven if self.proven else float("inf")

    @property
    def steady(self) -> float:
        """Clips/h in steady state: the throughput bound of the batch's mix, which a long batch approaches."""
        return self.bound.clips_per_hour if self.bound else 0.0

    def decoder_names(self) -> list[str]:
        return [d.name for d in self.candidate.resources.decoders] if self.candidate.resources else []

    def step(self, seconds: float, prove_until: float | None = None) -> None:
        if self.search is not None and not self.search.optimal:
            self.search.step(seconds, prove_until=prove_until)
            self.slices += 1

    def prove_beside(self, deadline: float) -> None:
        if self.search is not None:
            self.search.prove_beside(deadline)

    def settle(self) -> None:
        if self.search is not None:
            self.search.settle()


def start(
    candidate: Candidate, clips: list[PlanClip], profile: Profile, method: str, *, design: bool = True
) -> Evaluation:
    """The heuristics and the analytic bound on ``candidate`` (nothing for an infeasible one); ``design``: the
    design's round-robin too (for comparison)."""
    ev = Evaluation(candidate)
    if candidate.resources is None:
        return ev
    planner = Planner(profile, candidate.resources)
    planner.check(clips)  # a missing profile entry fails here, naming the entry
    ev.planner = planner
    if method == "best":
        ev.search = Search(planner, clips, design=design)
        ev.design = ev.search.best.heuristics.get(RoundRobin.name)
    else:
        ev.design = simulate(clips, planner, RoundRobin(planner))
        schedule = ev.design if method == "design" else simulate(clips, planner, EarliestFinish(planner))
        bound = lower_bound(planner, clips)
        ev.fixed = Best(schedule, method, bound, bound.seconds, f"analytic ({bound.binding})", False)
        ev.fixed.optimal = schedule.makespan <= bound.seconds * (1 + 1e-9)
    ev.modelled = dict(planner.modelled)
    return ev


def check(ev: Evaluation, clips: list[PlanClip]) -> None:
    """Validate the schedule the plan stands on (a failure is a planner bug: keep the traceback)."""
    if ev.schedule is None or ev.planner is None:
        return
    problems = validate(ev.schedule, ev.planner, clips)
    if problems:
        raise RuntimeError(f"invalid schedule for {ev.name}: {problems[0]} (+{len(problems) - 1} more)")


def evaluate(
    candidate: Candidate,
    clips: list[PlanClip],
    profile: Profile,
    method: str,
    *,
    time_limit: float = 2.0,
    check_schedule: bool = True,
) -> Evaluation:
    """One topology on its own: the heuristics, then ``time_limit`` seconds of search (policy ``best``)."""
    ev = start(candidate, clips, profile, method)
    if time_limit > 0:
        ev.step(time_limit)
    if check_schedule:
        check(ev, clips)
    return ev


def plan_all(
    candidates: list[Candidate],
    clips: list[PlanClip],
    profile: Profile,
    method: str,
    *,
    seconds: float,
    threshold: float,
    reference: frozenset[str] = frozenset(),
    design: bool = True,
    prove_until: float | None = None,
) -> list[Evaluation]:
    """Every candidate planned within ``seconds`` (the heuristics always), the search time spent where it decides
    (module docstring); the ``reference``
    topologies (canonical names) are planned for comparison only; ``design``: the design's round-robin too;
    ``prove_until``: the leading topology's relaxation goes on until then (its ``settle()`` stops it)."""
    began = time.perf_counter()
    evals = [start(c, clips, profile, method, design=design) for c in candidates]
    for ev in evals:
        ev.reference = ev.candidate.canonical in reference
    allocate(evals, began + seconds - time.perf_counter(), threshold, prove_until=prove_until)
    for ev in evals:
        check(ev, clips)
    return evals


def groups(evals: list[Evaluation]) -> dict[frozenset[str], list[Evaluation]]:
    """Feasible topologies (that may be recommended) by the extra hosts they use."""
    out: dict[frozenset[str], list[Evaluation]] = {}
    for ev in evals:
        if ev.schedule is not None and not ev.reference:
            out.setdefault(ev.candidate.extras | ev.candidate.decoders, []).append(ev)
    return out


def leaders(evals: list[Evaluation], k: int = 2) -> list[Candidate]:
    """The ``k`` fastest topologies of each group: what a recommendation is decided between."""
    out = []
    for members in groups(evals).values():
        out += [e.candidate for e in sorted(members, key=lambda e: -e.rate)[:k]]
    return out


def open_ones(evals: list[Evaluation]) -> list[Evaluation]:
    """Topologies still worth searching: not proven optimal, and their bound leaves them a chance to be the
    fastest of their group."""
    out = []
    for members in groups(evals).values():
        leader = max(e.rate for e in members)
        out += [e for e in members if e.rate_bound > leader * (1 + 1e-9) or e.rate == leader]
    return [e for e in out if e.search is not None and not e.optimal]


def allocate(evals: list[Evaluation], seconds: float, threshold: float, *, prove_until: float | None = None) -> None:
    """Spend ``seconds`` of wall time on the open topologies: first the cheap whole-clip starts of each (the most
    promising first: they often change which is fastest), then slices — the tentative recommendation weighted 3,
    the other group leaders 1.5, the rest 0.5; the least served for its weight goes next. The tentative
    recommendation's relaxation is not restarted at each of its slices: it runs on beside the others' (until
    ``seconds`` end, or ``prove_until``: then it is left running for the caller to ``settle()``)."""
    end = time.perf_counter() + seconds
    try:
        _allocate(evals, end, threshold, max(end, prove_until or end))
    finally:
        lead = leading(evals, threshold) if prove_until is not None else None
        for ev in evals:
            if ev is not lead:
                ev.settle()


def _allocate(evals: list[Evaluation], end: float, threshold: float, prove_until: float) -> None:
    for ev in sorted(open_ones(evals), key=lambda e: -e.rate_bound):
        if end - time.perf_counter() < MIN_SLICE:
            return
        assert ev.search is not None
        ev.search.starts()
    while (left := end - time.perf_counter()) >= MIN_SLICE:
        todo = open_ones(evals)
        if not todo:
            return
        rec = leading(evals, threshold)
        leaders = {id(max(m, key=lambda e: e.rate)) for m in groups(evals).values()}
        weight = {id(e): 3.0 if e is rec else 1.5 if id(e) in leaders else 0.5 for e in todo}
        ev = min(todo, key=lambda e: (e.slices / weight[id(e)], -e.rate_bound))
        share = max(MIN_SLICE, min(left, left * weight[id(ev)] / sum(weight.values())))
        ev.step(share, prove_until if ev is rec else None)


# ---------------------------------------------------------------- which topology wins (the 15% rule)
def hosts(c: Candidate) -> frozenset[str]:
    """The hosts beyond the main sampler host that a topology uses: extra samplers and decoders."""
    return c.extras | c.decoders


def _fewer_hosts(s: Evaluation, e: Evaluation) -> bool:
    return hosts(s.candidate) < hosts(e.candidate)


def _blocker(ok: list[Evaluation], e: Evaluation, threshold: float) -> Evaluation | None:
    smaller = [s for s in ok if _fewer_hosts(s, e) and e.rate < s.rate * (1 + threshold)]
    return max(smaller, key=lambda s: s.rate) if smaller else None


def leading(evals: list[Evaluation], threshold: float) -> Evaluation | None:
    """The topology recommended so far (:func:`choose` over the feasible ones that may be recommended)."""
    ok = [e for e in evals if e.schedule is not None and not e.reference]
    return choose(ok, threshold) if ok else None


def choose(ok: list[Evaluation], threshold: float) -> Evaluation:
    """The fastest topology whose extra hosts pay: it beats every topology that uses a subset of its extra
    hosts by at least ``threshold`` in clips/h (on the best schedules found)."""
    acceptable = [e for e in ok if _blocker(ok, e, threshold) is None]
    return max(acceptable, key=lambda e: (round(e.rate, 6), -e.candidate.hardware_size))
