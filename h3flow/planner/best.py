"""The planner's best schedule for a batch, with a proven lower bound: heuristics, local search, CP-SAT.

1. The simulator's two policies (earliest-finish and the design's round-robin) give the
   starting schedules; the analytic bound (:mod:`~h3flow.planner.bounds`) may already
   prove the better one optimal.
2. Whole clips of each kind per pool: balanced (:mod:`~h3flow.planner.relax`) from the
   better heuristic's assignment and from the fractional-load LP's split, and the load
   relaxation's optimum (solved exactly: it proves a tighter bound). Each set of counts is
   sequenced two ways — longest first, and keeping borrowers fed
   (:mod:`~h3flow.planner.feed`) — and the best few are improved by moving clips between
   pools on real schedules (:mod:`~h3flow.planner.assign`).
3. Local search (:mod:`~h3flow.planner.improve`) from the relaxation's newest counts where it has new ones
   (though they may sequence longer than the best start), else from the best sequences.
4. CP-SAT (:mod:`~h3flow.planner.solver`), warm-started from the best so far, for the
   rest of the time (batches of up to ``CP_MAX_CLIPS``); it proves a bound too.

:class:`Search` does this in slices of time, so ``h3flow plan`` can give its budget to the
topologies that decide a recommendation; later slices search more (other seeds, the
relaxation with the encoder pools' feeding constraints, CP-SAT again). Each slice solves
the relaxation in a thread beside the search (:class:`~h3flow.planner.relax.Proof`: a
second core proves the bound while the local search runs). The result is never worse than
the best heuristic: a schedule is only replaced by a shorter one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from h3flow.planner.bounds import Bound, lower_bound
from h3flow.planner.instance import Instance
from h3flow.planner.policies import EarliestFinish, RoundRobin
from h3flow.planner.relax import Proof
from h3flow.planner.schedule import Schedule
from h3flow.planner.sequence import Sequences, from_schedule, makespan, to_schedule
from h3flow.planner.timing import ClipLike, PlanClip, Planner

DEFAULT_TIME_LIMIT = 2.0
SMALL = 24  # up to this many clips CP-SAT gets most of the time (it usually proves the optimum)
CP_MAX_CLIPS = 120  # larger batches: no CP-SAT (the model grows past what the time limit solves)
RELAX_MAX_CLIPS = 400
RELAX_WAIT = (0.35, 0.25)  # of the first slice (up to SMALL clips, above): at most this long for the relaxation
TOLERANCE = 1e-9  # relative: a schedule this close to its bound is proven optimal (float noise only)


@dataclass
class Best:
    schedule: Schedule  # the best schedule found, validated by the caller
    method: (
        str  # what found it: "earliest-finish", "design", "load balance", "load relaxation", "assignment search",
        # "local search", "CP-SAT"
    )
    bound: Bound  # the analytic bound (and the steady-state throughput bound)
    proven: float  # the best proven lower bound, seconds (>= bound.seconds)
    proven_by: str  # "analytic (<binding>)", "load relaxation" or "CP-SAT"
    optimal: bool
    heuristics: dict[str, Schedule] = field(default_factory=dict)  # the simulator's, by policy name
    seconds: float = 0.0  # wall time spent on it

    @property
    def gap(self) -> float:
        """How much longer than the proven bound the schedule is (0.0 exactly when proven optimal)."""
        if self.optimal or self.proven <= 0:
            return 0.0
        return max(self.schedule.makespan / self.proven - 1, 1e-12)


class Search:
    """One batch on one topology: the best schedule and the best proven bound so far, improved in slices."""

    def __init__(
        self, planner: Planner, clips: Sequence[ClipLike], *, seed: int = 0, workers: int = 1, design: bool = True
    ) -> None:
        """The heuristics (``design``: the design's round-robin too) and the analytic bound."""
        from h3flow.planner.simulate import simulate

        began = time.perf_counter()
        self.planner, self.clips = planner, [PlanClip.of(c) for c in clips]
        self.seed, self.workers = seed, workers
        policies = (EarliestFinish, RoundRobin) if design else (EarliestFinish,)
        heuristics = {p.name: simulate(self.clips, planner, p(planner)) for p in policies}
        bound = lower_bound(planner, self.clips)
        method, schedule = min(
            heuristics.items(), key=lambda kv: (round(kv[1].makespan, 6), kv[0] != "earliest-finish")
        )
        self.best = Best(schedule, method, bound, bound.seconds, f"analytic ({bound.binding})", False, heuristics)
        self._inst: Instance | None = None
        self._seqs: Sequences | None = None
        self._pool: list[tuple[tuple[float, ...], list[list[int]], str]] | None = None  # starts: key, counts, how
        self._relaxed = False  # the relaxation was solved (without the feeding constraints)
        self._fed = False  # ... and with them
        self._proof: Proof | None = None  # the relaxation being solved beside this slice's search
        self._tried: set[str] = set()  # the relaxation's counts already timed
        self._slices = 0
        self._relaxed_start: Sequences | None = None  # new counts of the relaxation, sequenced: not yet searched from
        self._until = 0.0  # the slice's relaxation may run until then
        self._finish(began)

    # ------------------------------------------------------------------ state
    @property
    def optimal(self) -> bool:
        return self.best.optimal

    @property
    def inst(self) -> Instance:
        if self._inst is None:
            self._inst = Instance.of(self.planner, self.clips)
            self._seqs = from_schedule(self._inst, self.best.schedule)
        return self._inst

    def _finish(self, began: float) -> None:
        b = self.best
        b.optimal = b.schedule.makespan <= b.proven * (1 + TOLERANCE)
        b.seconds += time.perf_counter() - began

    def _take(self, seqs: Sequences, value: float, how: str) -> bool:
        """Keep ``seqs`` if shorter than the best so far."""
        if value < self.best.schedule.makespan * (1 - TOLERANCE) - 1e-9:
            self._seqs = seqs
            self.best.schedule, self.best.method = to_schedule(self.inst, seqs, how), how
            return True
        return False

    def _prove(self, bound: float, by: str) -> None:
        if bound > self.best.proven:
            self.best.proven, self.best.proven_by = bound, by

    # ------------------------------------------------------------------ search
    def step(self, seconds: float, *, prove_until: float | None = None) -> Best:
        """Spend up to ``seconds`` of wall time on a better schedule and a better bound; ``prove_until``: the
        slice's relaxation may go on beside the caller until then (a ``perf_counter`` time) — a later step goes
        on with it and :meth:`settle` stops it."""
        began = time.perf_counter()
        deadline = began + max(seconds, 0.0)
        if not self.optimal and seconds > 0 and len(self.clips) > 1:
            self.starts()
            if self._proof is not None and self._proof.done:
                self._end_proof()
            self._until = max(deadline, prove_until or 0.0)
            if self._proof is None:
                self._proof = self._start_proof(self._until)
            try:
                if self._slices == 0:
                    self._first(deadline)
                else:
                    self._more(deadline)
            finally:
                if prove_until is None or self._proof is None or self._proof.done:
                    self._end_proof()
                else:
                    self._relaxation_start(self._proof.counts)
            self._slices += 1
        self._finish(began)
        return self.best

    def _start_proof(self, deadline: float) -> Proof | None:
        """The load relaxation, for the whole slice in a thread beside the search: first the plain one, once that
        is proven the one with the feeding constraints (a tighter bound where pools borrow an encoder)."""
        inst = self.inst
        if inst.n > RELAX_MAX_CLIPS or (self._relaxed and (self._fed or not inst.borrowers)):
            return None
        hint = min(self._pool)[1] if self._pool else None
        return Proof(
            inst, self._left(deadline), workers=self.workers, hint=hint, feeding=self._relaxed, floor=self.best.proven
        )

    def _end_proof(self, starts: bool = True) -> None:
        """Stop the slice's relaxation: its bound is proven, its best counts a start (``starts``)."""
        proof, self._proof = self._proof, None
        if proof is None:
            return
        relaxed = proof.result()
        if relaxed.optimal:
            if proof.feeding:
                self._fed = True
            else:
                self._relaxed = True
        self._prove(relaxed.bound, "load relaxation")
        if starts and relaxed.counts is not None:
            self._relaxation_start(relaxed.counts)

    def _prove_on(self) -> None:
        """The slice's relaxation ended early (proven): keep the second core on the next one (the feeding
        constraints), rather than idle until the next slice."""
        if self._proof is not None and self._proof.done:
            self._end_proof()
            if self._left(self._until) > 0.05:
                self._proof = self._start_proof(self._until)

    def prove_beside(self, deadline: float) -> None:
        """Solve the relaxation in a thread until :meth:`settle` or ``deadline`` (unless one runs already), while
        the caller does other work (the plan's pay-off scan leaves the second core mostly idle)."""
        if self.optimal or self._proof is not None or len(self.clips) < 2:
            return
        self._proof = self._start_proof(deadline)

    def settle(self) -> Best:
        """Stop the relaxation left running (:meth:`prove_beside`, ``step(prove_until=...)``) and keep its
        bound (its counts are not timed: the schedule may have been reported on already)."""
        began = time.perf_counter()
        self._end_proof(starts=False)
        self._finish(began)
        return self.best

    def _relaxation_start(self, counts: list[list[int]] | None) -> bool:
        """Time the relaxation's counts as a start, unless already tried; whether they were new."""
        if counts is None or self.optimal or repr(counts) in self._tried:
            return False
        self._tried.add(repr(counts))
        self._counts_start(counts, "load relaxation")
        return True

    def _left(self, deadline: float) -> float:
        return max(0.0, deadline - time.perf_counter())

    def starts(self) -> Best:
        """The cheap starts (milliseconds): whole clips per pool balanced from the better heuristic's assignment and
        from the fractional-load LP's split, each sequenced longest first and keeping borrowers fed."""
        if self._pool is not None or self.optimal or len(self.clips) < 2:
            return self.best
        from h3flow.planner.bounds import balanced_counts
        from h3flow.planner.relax import balance_counts

        began = time.perf_counter()
        inst = self.inst
        assert self._seqs is not None
        self._pool = []
        for counts in (counts_of(inst, self._seqs), balanced_counts(inst)):
            self._counts_start(balance_counts(inst, counts), "load balance")
        self._finish(began)
        return self.best

    def _first(self, deadline: float) -> None:
        from h3flow.planner.assign import climb

        inst = self.inst
        n = inst.n
        pool = self._pool
        assert pool is not None
        proof = self._proof
        if proof is not None:  # its counts are the best start more often than not: wait for them (it goes on)
            proof.wait(self._left(deadline) * RELAX_WAIT[n > SMALL])
            self._relaxation_start(proof.counts)
            self._prove_on()
        if self.optimal:
            return
        # the best distinct starts, each improved on real schedules
        seen: set[str] = set()
        tops = []
        for key, counts, how in sorted(pool):
            if repr(counts) not in seen:
                seen.add(repr(counts))
                tops.append((key, counts, how))
        share = self._left(deadline) * (0.15 if n <= SMALL else 0.35)
        for i, (_, counts, _) in enumerate(tops[:3]):  # the best start gets half, the next two a quarter each
            part = share * (0.5 if i == 0 else 0.25)
            key, _, seqs = climb(inst, counts, deadline=time.perf_counter() + part, seed=self.seed + i)
            self._take(seqs, key[0], "assignment search")
        self._search(deadline)

    def _counts_start(self, counts: list[list[int]], how: str) -> None:
        from h3flow.planner.assign import timed

        key, seqs = timed(self.inst, counts)
        if how == "load relaxation":
            self._relaxed_start = seqs
        self._take(seqs, key[0], how)
        if self._pool is not None:
            self._pool.append((key, counts, how))

    def _search(self, deadline: float) -> None:
        from h3flow.planner.improve import improve

        inst = self.inst
        n = inst.n
        assert self._seqs is not None
        if self.optimal:
            return
        # CP-SAT closes small batches; past SMALL clips the first slice is all local search (CP-SAT rarely finds
        # a shorter schedule there within seconds), later slices share it
        if n <= SMALL:
            share = 0.2
        elif n <= CP_MAX_CLIPS and self._slices > 0:
            share = 0.5
        else:
            share = 1.0
        # from the relaxation's newest counts where it found some, though their sequences time longer than the best:
        # the sequencers cannot see what the relaxation sees (how an encoder pool's own clips and the encodes it
        # lends fit together), the local search can
        start = self._relaxed_start if self._relaxed_start is not None else self._seqs
        self._relaxed_start = None
        found, value = improve(inst, start, seconds=self._left(deadline) * share, seed=self.seed + self._slices)
        self._take(found, value, "local search")
        self._prove_on()
        if n <= CP_MAX_CLIPS and not self.optimal and self._left(deadline) > 0.05:
            self._cp_sat(deadline)

    def _more(self, deadline: float) -> None:
        """A later slice: more search (another seed, CP-SAT again), and a climb from the relaxation's counts when
        the slice's relaxation (its feeding constraints, once the plain one is proven) finds new ones."""
        from h3flow.planner.assign import climb

        proof = self._proof
        if proof is not None:
            proof.found.wait(self._left(deadline) * 0.05)
            if self._relaxation_start(proof.counts) and not self.optimal:
                assert proof.counts is not None
                key, _, seqs = climb(
                    self.inst,
                    proof.counts,
                    deadline=time.perf_counter() + self._left(deadline) * 0.2,
                    seed=self._slices,
                )
                self._take(seqs, key[0], "assignment search")
        self._search(deadline)

    def _cp_sat(self, deadline: float) -> None:
        from h3flow.planner.sequence import delivery_runs, sampler_runs
        from h3flow.planner.solver import solve_cp

        inst = self.inst
        assert self._seqs is not None
        cp = solve_cp(
            inst,
            seconds=self._left(deadline),
            hint=self._seqs,
            known_bound=self.best.proven,
            workers=self.workers,
            seed=self.seed,
        )
        self._prove(cp.bound, "CP-SAT")
        if cp.timeline is None or cp.delivery is None or cp.sequences is None:
            return
        retimed = makespan(inst, cp.sequences)
        if retimed <= cp.delivery.makespan:
            self._take(cp.sequences, retimed, "CP-SAT")
        elif cp.delivery.makespan < self.best.schedule.makespan * (1 - TOLERANCE) - 1e-9:
            res = self.planner.resources
            ids = [c.id for c in inst.clips]
            self.best.schedule = Schedule(
                res.topology,
                "CP-SAT",
                ids,
                sampler_runs(inst, cp.timeline) + delivery_runs(inst, cp.delivery),
                {c: res.samplers[cp.timeline.pool_of[j]].name for j, c in enumerate(ids)},
                {c: res.decoders[cp.delivery.decoder[j]].name for j, c in enumerate(ids)},
            )
            self.best.method = "CP-SAT"


def best_schedule(
    planner: Planner,
    clips: Sequence[ClipLike],
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
    seed: int = 0,
    workers: int = 1,
) -> Best:
    """The best schedule found within ``time_limit`` seconds, its proven bound and the gap (0: heuristics only)."""
    search = Search(planner, clips, seed=seed, workers=workers)
    return search.step(time_limit - search.best.seconds) if time_limit > 0 else search.best


def counts_of(inst: Instance, seqs: Sequences) -> list[list[int]]:
    """How many clips of each kind each pool takes in ``seqs``: [pool][kind]."""
    counts = [[0] * (max(inst.kind) + 1) for _ in range(inst.pools)]
    for p, seq in enumerate(seqs):
        for item in seq:
            if item >= 0:
                counts[p][inst.kind[item]] += 1
    return counts
