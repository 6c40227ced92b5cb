"""The planner's best schedule for a batch, with a proven lower bound: heuristics, local search, CP-SAT.

1. The simulator's two policies (earliest-finish and the design's round-robin) give the
   starting schedules; the analytic bound (:mod:`~h3flow.planner.bounds`) may already
   prove the better one optimal.
2. Whole clips of each kind per pool, balanced (:mod:`~h3flow.planner.relax`) from the
   better heuristic's assignment and from the fractional-load LP's split, give more
   starting points; the load relaxation, solved exactly, proves a tighter bound and gives
   one more. Local search (:mod:`~h3flow.planner.improve`) improves the best of them.
3. CP-SAT (:mod:`~h3flow.planner.solver`), warm-started from the best so far, searches
   for the rest of the time limit and proves a bound (batches of up to ``CP_MAX_CLIPS``).

The result is never worse than the best heuristic: each stage only replaces the
schedule when it finds a shorter one. ``time_limit=0`` stops after step 1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from h3flow.planner.bounds import Bound, lower_bound
from h3flow.planner.improve import improve
from h3flow.planner.instance import Instance
from h3flow.planner.policies import EarliestFinish, RoundRobin
from h3flow.planner.schedule import Schedule
from h3flow.planner.sequence import Sequences, from_counts, from_schedule, makespan, to_schedule
from h3flow.planner.timing import ClipLike, Planner

DEFAULT_TIME_LIMIT = 2.0
SMALL = 24  # up to this many clips CP-SAT gets most of the time (it usually proves the optimum)
CP_MAX_CLIPS = 120  # larger batches: local search only (the model grows past what the time limit solves)
RELAX_MAX_CLIPS = 400
TOLERANCE = 1e-6


@dataclass
class Best:
    schedule: Schedule  # the best schedule found, validated by the caller
    method: (
        str  # what found it: "earliest-finish", "design", "load balance", "load relaxation", "local search", "CP-SAT"
    )
    bound: Bound  # the analytic bound (and the steady-state throughput bound)
    proven: float  # the best proven lower bound, seconds (>= bound.seconds)
    proven_by: str  # "analytic (<binding>)", "load relaxation" or "CP-SAT"
    optimal: bool
    heuristics: dict[str, Schedule] = field(default_factory=dict)  # the simulator's, by policy name
    seconds: float = 0.0

    @property
    def gap(self) -> float:
        """How much longer than the proven bound the schedule is (0.0: proven optimal)."""
        return max(0.0, self.schedule.makespan / self.proven - 1) if self.proven > 0 else 0.0


def best_schedule(
    planner: Planner,
    clips: Sequence[ClipLike],
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
    seed: int = 0,
    workers: int = 1,
) -> Best:
    from h3flow.planner.simulate import simulate

    began = time.perf_counter()
    deadline = began + max(time_limit, 0.0)
    heuristics = {p.name: simulate(clips, planner, p(planner)) for p in (EarliestFinish, RoundRobin)}
    bound = lower_bound(planner, clips)
    method, schedule = min(heuristics.items(), key=lambda kv: (round(kv[1].makespan, 6), kv[0] != "earliest-finish"))
    result = Best(schedule, method, bound, bound.seconds, f"analytic ({bound.binding})", False, heuristics)

    def done() -> Best:
        result.optimal = result.schedule.makespan <= result.proven * (1 + TOLERANCE)
        result.seconds = time.perf_counter() - began
        return result

    if result.schedule.makespan <= bound.seconds * (1 + TOLERANCE) or time_limit <= 0:
        return done()
    inst = Instance.of(planner, clips)
    seqs: Sequences = from_schedule(inst, schedule)
    current = makespan(inst, seqs)

    def take(found: Sequences, value: float, how: str) -> None:
        nonlocal seqs, current
        if value < min(current, result.schedule.makespan) - TOLERANCE:
            seqs, current = found, value
            result.schedule, result.method = to_schedule(inst, found, how), how

    # balanced starting points: whole clips per pool from today's assignment and from the LP's split
    from h3flow.planner.bounds import balanced_counts
    from h3flow.planner.relax import balance_counts, relaxed_makespan, solve_relaxation

    counts = [balance_counts(inst, c) for c in (counts_of(inst, seqs), balanced_counts(inst))]
    for c in counts:
        start = from_counts(inst, c)
        take(start, makespan(inst, start), "load balance")
    if inst.n <= RELAX_MAX_CLIPS:  # solved exactly: a tighter bound, and its counts as another start
        left = deadline - time.perf_counter()
        hint = min(counts, key=lambda c: relaxed_makespan(inst, c))
        relaxed = solve_relaxation(inst, left * (0.1 if inst.n <= SMALL else 0.2), workers, hint)
        if relaxed.bound > result.proven:
            result.proven, result.proven_by = relaxed.bound, "load relaxation"
        if relaxed.counts is not None:
            start = from_counts(inst, relaxed.counts)
            take(start, makespan(inst, start), "load relaxation")
    if result.schedule.makespan <= result.proven * (1 + TOLERANCE):
        return done()
    left = deadline - time.perf_counter()
    share = 0.2 if inst.n <= SMALL else 0.8 if inst.n <= CP_MAX_CLIPS else 1.0
    found, value = improve(inst, seqs, seconds=left * share, seed=seed)
    take(found, value, "local search")
    if inst.n <= CP_MAX_CLIPS and result.schedule.makespan > result.proven * (1 + TOLERANCE):
        from h3flow.planner.solver import solve_cp

        left = deadline - time.perf_counter()
        cp = solve_cp(inst, seconds=left, hint=seqs, known_bound=result.proven, workers=workers, seed=seed)
        if cp.bound > result.proven:
            result.proven, result.proven_by = cp.bound, "CP-SAT"
        if cp.timeline is not None and cp.delivery is not None and cp.sequences is not None:
            from h3flow.planner.sequence import delivery_runs, sampler_runs

            retimed = makespan(inst, cp.sequences)
            if retimed <= cp.delivery.makespan:
                take(cp.sequences, retimed, "CP-SAT")
            elif cp.delivery.makespan < result.schedule.makespan - TOLERANCE:
                res = planner.resources
                ids = [c.id for c in inst.clips]
                result.schedule = Schedule(
                    res.topology,
                    "CP-SAT",
                    ids,
                    sampler_runs(inst, cp.timeline) + delivery_runs(inst, cp.delivery),
                    {c: res.samplers[cp.timeline.pool_of[j]].name for j, c in enumerate(ids)},
                    {c: res.decoders[cp.delivery.decoder[j]].name for j, c in enumerate(ids)},
                )
                result.method = "CP-SAT"
    return done()


def counts_of(inst: Instance, seqs: Sequences) -> list[list[int]]:
    """How many clips of each kind each pool takes in ``seqs``: [pool][kind]."""
    counts = [[0] * (max(inst.kind) + 1) for _ in range(inst.pools)]
    for p, seq in enumerate(seqs):
        for item in seq:
            if item >= 0:
                counts[p][inst.kind[item]] += 1
    return counts
