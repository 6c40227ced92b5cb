"""The batch's load-balancing relaxation, solved exactly: how many clips of each kind each pool takes.

It keeps what decides a batch's length — integer numbers of whole clips per pool, the
encodes an encoder pool does for its borrowers, a borrower's wait for its first
encode, the transfer + decode after each pool's last latent, and a single decoder
having to decode the pools' last clips one after another — and drops the order of
work inside a pool. Every real schedule is a solution of it (with each pool's last
handoff as ``L_p``), so its optimum, and CP-SAT's proven bound on it when the time
limit stops the search first, are lower bounds on the makespan. Its counts are also
the solver's starting assignment. Durations are rounded *down* to milliseconds, so
the bound stays valid for the real (unrounded) times.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from h3flow.planner.instance import Instance

SCALE = 1000  # CP-SAT works in integer milliseconds
FULL_LP_FROM = 41
"""Clips: from this many, CP-SAT builds the relaxation's linear relaxation in full (linearization level 2). On
development batches of 44-50 clips its bound after 0.3-3 s was 0-0.7% higher; at 16-40 clips the default level
proves the optimum sooner (its bound was up to 3% higher at 0.3 s)."""

TURN = (31, 0.2)
"""From this many clips, after this share of a :class:`Proof`'s time, a relaxation not yet proven turns from
finding counts to raising the bound (CP-SAT's objective lower-bound search, every constraint linearized). On 24
development batches of 36-50 clips whole plans went from 1.0111 to 1.0065 times their bound (worst 1.027 ->
1.013; turning after 0.1, 0.35, 0.5 of the time: 1.0073, 1.0077, 1.0083). Up to 30 clips the default search
proves the optimum in about 0.5 s and turning early lowered the bounds (mean 1.0046 -> 1.0077 at 12-30 clips)."""


@dataclass(frozen=True)
class Relaxation:
    bound: float  # seconds: no schedule finishes sooner
    counts: list[list[int]] | None  # [pool][kind] in its best solution (None: none found in time)
    optimal: bool
    value: float = float("inf")  # the relaxation's makespan for ``counts``


def _down(x: float) -> int:
    return math.floor(x * SCALE + 1e-9)


def solve_relaxation(
    inst: Instance,
    seconds: float = 0.3,
    workers: int = 1,
    hint: list[list[int]] | None = None,
    stagger: bool = True,
    feeding: bool = False,
    floor: float = 0.0,
) -> Relaxation:
    """Solve the relaxation within ``seconds``; ``hint``: counts to start from ([pool][kind]); ``feeding``:
    with the encoder pools' feeding constraints (tighter, slower); ``floor``: a known lower bound."""
    model, y = _model(inst, hint, stagger, feeding, floor)
    return _solve(model, y, seconds, workers, floor, full_lp=inst.n >= FULL_LP_FROM)


class Proof:
    """The relaxation solved in a thread beside the search — CP-SAT releases the GIL, so on a second core it
    costs the search nothing — until ``seconds`` pass or :meth:`result` stops it; its best counts so far can be
    read while it runs (they are a start for the search). Not proven after part of its time (``TURN``), it goes on
    with a search that raises the bound (the counts it has are kept)."""

    def __init__(
        self,
        inst: Instance,
        seconds: float,
        *,
        workers: int = 1,
        hint: list[list[int]] | None = None,
        feeding: bool = False,
        floor: float = 0.0,
    ) -> None:
        from ortools.sat.python import cp_model

        self.feeding = feeding
        self.counts: list[list[int]] | None = None  # the best solution so far
        self._value = math.inf  # ... its makespan in the relaxation
        self.found = threading.Event()  # set at its first solution, and when it ends
        self._lock = threading.Lock()  # guards the solver being run and the stop
        self._solver = cp_model.CpSolver()
        self._stopped = False
        self._result: Relaxation | None = None
        self._error: Exception | None = None
        self._thread = threading.Thread(
            target=self._run, args=(inst, seconds, workers, hint, feeding, floor), name="h3flow-relaxation", daemon=True
        )
        self._thread.start()

    def _run(
        self, inst: Instance, seconds: float, workers: int, hint: list[list[int]] | None, feeding: bool, floor: float
    ) -> None:
        from ortools.sat.python import cp_model

        try:
            end = time.perf_counter() + seconds
            model, y = _model(inst, hint, True, feeding, floor)
            full = inst.n >= FULL_LP_FROM
            turn = seconds * TURN[1] if inst.n >= TURN[0] else seconds
            first = _solve(model, y, turn, workers, floor, self._solver, self._found, full_lp=full)
            self._result = first
            with self._lock:
                if first.optimal or self._stopped or time.perf_counter() >= end:
                    return
                self._solver = cp_model.CpSolver()
            model, y = _model(inst, first.counts or hint, True, feeding, first.bound)
            second = _solve(
                model, y, end - time.perf_counter(), workers, first.bound, self._solver, self._found, raise_bound=True
            )
            # the counts: the best either search found (what _found kept)
            self._result = Relaxation(max(first.bound, second.bound), self.counts, second.optimal, self._value)
        except Exception as exc:  # noqa: BLE001 - raised again in the caller's thread, by result()
            self._error = exc
        finally:
            self.found.set()

    def _found(self, counts: list[list[int]], value: float) -> None:
        if value < self._value:  # the bound search may find worse solutions than the first search had
            self.counts, self._value = counts, value
        self.found.set()

    @property
    def done(self) -> bool:
        """It ended: proven, out of time or failed (:meth:`result` says which)."""
        return not self._thread.is_alive()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for it to end (proven, or out of time); whether it did."""
        self._thread.join(max(seconds, 0.0))
        return not self._thread.is_alive()

    def result(self) -> Relaxation:
        """Stop the search (if still running) and return what it proved and found."""
        while self._thread.is_alive():  # asked again: a stop that comes before CP-SAT starts its search is lost
            with self._lock:
                self._stopped = True
                self._solver.stop_search()
            self._thread.join(0.05)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _model(
    inst: Instance, hint: list[list[int]] | None, stagger: bool, feeding: bool, floor: float
) -> tuple[Any, list[list[Any]]]:
    """The relaxation as a CP-SAT model, and its count variables ([pool][kind])."""
    from ortools.sat.python import cp_model

    n_kinds = max(inst.kind) + 1
    rep = [inst.kind.index(k) for k in range(n_kinds)]  # one clip of each kind
    count = [inst.kind.count(k) for k in range(n_kinds)]
    pools = range(inst.pools)
    kinds = range(n_kinds)
    held = [[_down(inst.held(rep[k], p)) for k in kinds] for p in pools]
    prep = [[_down(inst.prep[rep[k]][p]) if not inst.own[p] else 0 for k in kinds] for p in pools]
    tail = [
        [_down(min(inst.transfer[rep[k]][lk] + inst.decode[rep[k]][d] for d, lk in inst.routes[p])) for k in kinds]
        for p in pools
    ]
    transfer = [[_down(min(inst.transfer[rep[k]][lk] for _, lk in inst.routes[p])) for k in kinds] for p in pools]
    decode = [_down(min(inst.decode[rep[k]])) for k in kinds]
    single_decoder = len(inst.decode[0]) == 1
    borrowers_of = {e: [b for b in inst.borrowers if inst.encoder[b] == e] for e in pools}

    horizon = (
        sum(max(held[p][k] + prep[p][k] for p in pools) * count[k] for k in kinds)
        + 2 * max(max(row) for row in tail)
        + sum(decode[k] * count[k] for k in kinds)
    )
    m = cp_model.CpModel()
    # rounding every duration down loses at most 1 ms per clip and per pool in any constraint
    lowest = max(0, min(_down(floor) - inst.n - inst.pools - 3, horizon))
    makespan = m.new_int_var(lowest, horizon, "makespan")
    y = [[m.new_int_var(0, count[k], f"y{p}_{k}") for k in kinds] for p in pools]
    for k in kinds:
        m.add(sum(y[p][k] for p in pools) == count[k])
    last: list[tuple] = []
    for p in pools:
        used = m.new_bool_var(f"used{p}")
        m.add(sum(y[p]) >= 1).only_enforce_if(used)
        m.add(sum(y[p]) == 0).only_enforce_if(used.negated())
        z = [m.new_bool_var(f"z{p}_{k}") for k in kinds]  # the kind of the pool's last clip
        for k in kinds:
            m.add(y[p][k] >= 1).only_enforce_if(z[k])
        m.add(sum(z) == 1).only_enforce_if(used)
        m.add(sum(z) == 0).only_enforce_if(used.negated())
        own_work = sum(held[p][k] * y[p][k] for k in kinds)
        release = 0 if inst.own[p] else min(prep[p])
        lent = [prep[b][k] * y[b][k] for b in borrowers_of[p] for k in kinds]
        last_handoff = m.new_int_var(0, horizon, f"L{p}")  # the pool's last latent is written then
        m.add(last_handoff >= release + own_work).only_enforce_if(used)
        m.add(last_handoff == 0).only_enforce_if(used.negated())
        own_tail = sum(z[k] * tail[p][k] for k in kinds)
        if lent:
            # the encoder's last item may be a borrowed encode: its work ends no sooner than this
            after_lent = min(
                [min(tail[p])]
                + [min(inst_w + tl for inst_w, tl in zip(held[b], tail[b], strict=True)) for b in borrowers_of[p]]
            )
            m.add(makespan >= own_work + sum(lent) + after_lent)
        m.add(makespan >= last_handoff + own_tail).only_enforce_if(used)
        m.add(makespan >= release + own_work + min(tail[p]))  # the same, linear: what the LP relaxation sees
        last.append((used, last_handoff, z))
    for e in pools:
        if borrowers_of[e]:
            _encoder(m, e, borrowers_of[e], y, last, held, prep, horizon)
    if feeding:
        for e in pools:
            for b in borrowers_of[e]:
                _feed(m, inst, e, b, y, last, held, prep, tail, makespan, horizon)
    if single_decoder and stagger:  # the pools' last clips reach one decoder: it decodes them one after another
        arrive = min(min(row) for row in transfer)  # any last clip may be decoded first: the cheapest transfer
        intervals = []
        for p, (used_p, lp, zp) in enumerate(last):
            size = m.new_int_var(0, max(decode), f"d{p}")
            m.add(size == sum(zp[k] * decode[k] for k in kinds))
            begin = m.new_int_var(0, horizon, f"s{p}")
            finish = m.new_int_var(0, horizon, f"f{p}")
            m.add(begin >= lp + arrive)
            intervals.append(m.new_optional_interval_var(begin, size, finish, used_p, f"last{p}"))
            m.add(makespan >= finish).only_enforce_if(used_p)
            if feeding:  # (slower to solve: with the feeding constraints only, which run after the plain one)
                intervals.append(
                    _second_last(m, p, y, lp, zp, held, prep, decode, arrive, makespan, horizon, inst.own[p])
                )
        m.add_no_overlap(intervals)
    for p, q in _twins(inst):  # interchangeable pools: the first carries at least the second's load
        m.add(sum(held[p][k] * y[p][k] for k in kinds) >= sum(held[q][k] * y[q][k] for k in kinds))
    m.minimize(makespan)
    if hint is not None:
        for p in pools:
            for k in kinds:
                m.add_hint(y[p][k], hint[p][k])
    return m, y


def _solve(
    model: Any,
    y: list[list[Any]],
    seconds: float,
    workers: int,
    floor: float,
    solver: Any = None,
    found: Callable[[list[list[int]], float], None] | None = None,
    full_lp: bool = False,
    raise_bound: bool = False,
) -> Relaxation:
    """Solve ``model`` within ``seconds``; ``found`` is told the counts (and value) of each better solution; ``full_lp``:
    linearize every constraint (a stronger bound early on large batches, slower proofs on small ones);
    ``raise_bound``: search for a higher lower bound rather than for solutions (and linearize fully)."""
    from ortools.sat.python import cp_model

    solver = solver or cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    if full_lp or raise_bound:
        solver.parameters.linearization_level = 2
    if raise_bound:
        solver.parameters.use_objective_lb_search = True
    callback = None
    if found is not None:
        tell = found

        class Tell(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                tell([[int(self.value(v)) for v in row] for row in y], self.objective_value / SCALE)

        callback = Tell()
    status = solver.solve(model, callback)
    if status == cp_model.INFEASIBLE:  # only if the floor was wrong: keep what is known
        return Relaxation(floor, None, False)
    bound = max(solver.best_objective_bound / SCALE, floor)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Relaxation(bound, None, False)
    counts = [[int(solver.value(v)) for v in row] for row in y]
    return Relaxation(bound, counts, status == cp_model.OPTIMAL, solver.objective_value / SCALE)


def _encoder(m, e: int, borrowers: list[int], y, last, held, prep, horizon: int) -> None:
    """What an encoder pool's timeline adds: (1) it encodes its borrowers' first clips one after another, so they
    start sampling one after another; (2) its last item ends after all its own work and every encode it lends:
    either that item is one of its own clips (its last latent is written then) or a lent encode (and that
    borrower still samples the clip after it)."""
    kinds = range(len(held[e]))
    used = {p: last[p][0] for p in [e, *borrowers]}
    firsts = []
    for b in borrowers:
        size = min(prep[b])
        begin = m.new_int_var(0, horizon, f"first{b}")
        end = m.new_int_var(size, horizon, f"r{b}")
        firsts.append(m.new_optional_fixed_size_interval_var(begin, size, used[b], f"firstenc{b}"))
        m.add(end == begin + size)
        m.add(last[b][1] >= end + sum(held[b][k] * y[b][k] for k in kinds)).only_enforce_if(used[b])
    m.add_no_overlap(firsts)
    total = sum(held[e][k] * y[e][k] for k in kinds) + sum(prep[b][k] * y[b][k] for b in borrowers for k in kinds)
    ends = m.new_bool_var(f"ends_own{e}")
    m.add_implication(ends, used[e])
    m.add(last[e][1] >= total).only_enforce_if(ends)
    lent_last = []
    for b in borrowers:
        c = m.new_bool_var(f"ends_lending{e}_{b}")
        m.add_implication(c, used[b])
        m.add(last[b][1] >= total + min(held[b])).only_enforce_if(c)
        lent_last.append(c)
    nothing = m.new_bool_var(f"idle{e}")  # neither it nor its borrowers take a clip
    for p in used:
        m.add_implication(nothing, used[p].negated())
    m.add_exactly_one([ends, *lent_last, nothing])


def _at_least(m, total, k: int, name: str) -> Any:
    """A Boolean that is true exactly when ``total`` (an integer expression) is at least ``k``."""
    b = m.new_bool_var(name)
    m.add(total >= k).only_enforce_if(b)
    m.add(total <= k - 1).only_enforce_if(b.negated())
    return b


def _second_last(m, p: int, y, lp, z, held, prep, decode, arrive: int, makespan, horizon: int, own: bool) -> Any:
    """The decode of pool ``p``'s second-last clip, as an optional interval for the decoder: with all its clips
    but the last one (kind ``z``) sampled by then, it is handed off no sooner than release + own work - the last
    clip, and at least the last clip's work before ``lp``."""
    kinds = range(len(decode))
    two = _at_least(m, sum(y[p]), 2, f"two{p}")
    z2 = [m.new_bool_var(f"z2_{p}_{k}") for k in kinds]  # its kind
    for k in kinds:
        m.add(y[p][k] - z[k] >= 1).only_enforce_if(z2[k])
    m.add(sum(z2) == 1).only_enforce_if(two)
    m.add(sum(z2) == 0).only_enforce_if(two.negated())
    last_work = sum(z[k] * held[p][k] for k in kinds)
    handed = m.new_int_var(0, horizon, f"h2_{p}")
    release = 0 if own else min(prep[p])
    m.add(handed >= release + sum(held[p][k] * y[p][k] for k in kinds) - last_work).only_enforce_if(two)
    m.add(lp >= handed + last_work).only_enforce_if(two)
    size = m.new_int_var(0, max(decode), f"d2_{p}")
    m.add(size == sum(z2[k] * decode[k] for k in kinds))
    begin = m.new_int_var(0, horizon, f"s2_{p}")
    finish = m.new_int_var(0, horizon, f"f2_{p}")
    m.add(begin >= handed + arrive)
    m.add(makespan >= finish).only_enforce_if(two)
    return m.new_optional_interval_var(begin, size, finish, two, f"second{p}")


def _twins(inst: Instance) -> list[tuple[int, int]]:
    """Pairs of pools (p, q), p < q, that no schedule can tell apart: same durations, encoder and routes,
    neither lending encodes to the other (each pool paired with the next one like it)."""
    lends = {inst.encoder[b] for b in inst.borrowers}
    out = []
    for q in range(inst.pools):
        for p in range(q - 1, -1, -1):
            if (
                p not in lends
                and q not in lends
                and ((inst.own[p] and inst.own[q]) or inst.encoder[p] == inst.encoder[q])
                and inst.routes[p] == inst.routes[q]
                and all(row[p] == row[q] for row in inst.work)
                and all(row[p] == row[q] for row in inst.prep)
            ):
                out.append((p, q))
                break
    return out


def _feed(m, inst: Instance, e: int, b: int, y, last, held, prep, tail, makespan, horizon: int) -> None:
    """Borrower ``b`` is fed by encoder pool ``e``: while ``e`` runs one of its own clips (encode to
    handoff, length ``L``) it encodes nothing, and ``b`` holds at most ``AHEAD`` encoded clips, so if
    that block ends before ``b``'s last encode ``E_b``, ``b`` idles at least ``L - AHEAD * w_max``
    (``w_max``: ``b``'s longest clip) during it. Blocks after ``E_b`` cost no idle but come after
    everything ``e`` encodes for ``b``; and ``b``'s last encode waits until all but ``AHEAD`` of its clips are
    sampled. All are lower bounds on what any schedule does."""
    from h3flow.planner.sequence import AHEAD

    kinds = range(len(held[e]))
    used_b = last[b][0]
    present = []
    for k in kinds:
        u = m.new_bool_var(f"u{b}_{k}")
        m.add(y[b][k] >= 1).only_enforce_if(u)
        m.add(y[b][k] == 0).only_enforce_if(u.negated())
        present.append(u)
    top = [m.new_bool_var(f"top{b}_{k}") for k in kinds]  # the kind of b's longest clip
    m.add(sum(top) == 1).only_enforce_if(used_b)
    m.add(sum(top) == 0).only_enforce_if(used_b.negated())
    for k in kinds:
        m.add_implication(top[k], present[k])
        longer = [top[k2] for k2 in kinds if held[b][k2] >= held[b][k]]
        m.add_bool_or(longer).only_enforce_if(present[k])
    before = [m.new_int_var(0, inst.kind.count(k), f"before{e}_{b}_{k}") for k in kinds]
    for k in kinds:
        m.add(before[k] <= y[e][k])
    idle = m.new_int_var(0, horizon, f"idle{b}")
    for k2 in kinds:
        cost = [max(0, held[e][k] - AHEAD * held[b][k2]) for k in kinds]
        if any(cost):
            m.add(idle >= sum(c * before[k] for k, c in zip(kinds, cost, strict=True))).only_enforce_if(top[k2])
    release = min(prep[b])
    own_b = sum(held[b][k] * y[b][k] for k in kinds)
    m.add(last[b][1] >= release + own_b + idle).only_enforce_if(used_b)
    m.add(makespan >= release + own_b + idle + min(tail[b])).only_enforce_if(used_b)
    last_encode = m.new_int_var(0, horizon, f"E{b}")
    after = [y[e][k] - before[k] for k in kinds]
    m.add(last_encode >= sum(held[e][k] * before[k] + prep[b][k] * y[b][k] for k in kinds)).only_enforce_if(used_b)
    # when b's last encode starts, at most AHEAD - 1 of its other clips are in flight: with more than AHEAD
    # clips, the rest (one at least) are sampled, so it ends no sooner than release + own_b - (b's AHEAD longest
    # clips: r, which the search sets as high as it can) + an encode
    r = [m.new_int_var(0, min(AHEAD, inst.kind.count(k)), f"r{b}_{k}") for k in kinds]
    m.add(sum(r) <= AHEAD)
    for k in kinds:
        m.add(r[k] <= y[b][k])
    more = _at_least(m, sum(y[b]), AHEAD + 1, f"more{b}")
    ahead = sum(held[b][k] * r[k] for k in kinds)
    m.add(last_encode >= release + own_b - ahead + min(prep[b])).only_enforce_if(more)
    m.add(makespan >= last_encode + min(h + t for h, t in zip(held[b], tail[b], strict=True))).only_enforce_if(used_b)
    any_after = m.new_bool_var(f"after{e}_{b}")
    m.add(sum(after) >= 1).only_enforce_if(any_after)
    m.add(sum(after) == 0).only_enforce_if(any_after.negated())
    rest = sum(held[e][k] * after[k] for k in kinds)
    m.add(makespan >= last_encode + rest).only_enforce_if(used_b)
    m.add(makespan >= last_encode + rest + min(tail[e])).only_enforce_if([used_b, any_after])
    m.add(last[e][1] >= last_encode + rest).only_enforce_if([used_b, any_after])


Tables = tuple[list[list[float]], list[list[float]], list[list[float]], list[float], float]


def _tables(inst: Instance) -> Tables:
    """Per pool and kind: held time, lent encode, tail; per kind: decode; the cheapest transfer (computed once
    per instance: the count searches call this thousands of times)."""
    cached: Tables | None = inst.__dict__.get("_relax_tables")
    if cached is None:
        cached = _compute_tables(inst)
        object.__setattr__(inst, "_relax_tables", cached)
    return cached


def _compute_tables(inst: Instance) -> Tables:
    n_kinds = max(inst.kind) + 1
    rep = [inst.kind.index(k) for k in range(n_kinds)]
    pools, kinds = range(inst.pools), range(n_kinds)
    held = [[inst.held(rep[k], p) for k in kinds] for p in pools]
    prep = [[0.0 if inst.own[p] else inst.prep[rep[k]][p] for k in kinds] for p in pools]
    tail = [
        [min(inst.transfer[rep[k]][lk] + inst.decode[rep[k]][d] for d, lk in inst.routes[p]) for k in kinds]
        for p in pools
    ]
    decode = [min(inst.decode[rep[k]]) for k in kinds]
    return held, prep, tail, decode, min(min(inst.transfer[r]) for r in rep)


def relaxed_makespan(inst: Instance, counts: list[list[int]]) -> float:
    """The relaxation's makespan for fixed counts (the last clip of each pool its cheapest-to-finish kind)."""
    held, prep, tail, decode, transfer = _tables(inst)
    kinds = range(len(decode))
    worst = 0.0
    ends: list[tuple[float, float]] = []  # (last handoff, decode of the last clip) of each used pool
    for p in range(inst.pools):
        used = [k for k in kinds if counts[p][k]]
        own = sum(held[p][k] * counts[p][k] for k in kinds)
        lent = sum(prep[b][k] * counts[b][k] for b in inst.borrowers if inst.encoder[b] == p for k in kinds)
        if lent:
            after = min(
                [min(tail[p])]
                + [held[b][k] + tail[b][k] for b in inst.borrowers if inst.encoder[b] == p for k in kinds]
            )
            worst = max(worst, own + lent + after)
        if not used:
            continue
        last = min(used, key=lambda k: (tail[p][k], decode[k]))
        release = 0.0 if inst.own[p] else min(prep[p])
        ends.append((release + own, decode[last]))
        worst = max(worst, release + own + tail[p][last])
    if len(inst.decode[0]) == 1:
        for lp, dp in ends:
            worst = max(worst, lp + transfer + dp + sum(dq for lq, dq in ends if lq >= lp) - dp)
    return worst


def balance_counts(inst: Instance, counts: list[list[int]]) -> list[list[int]]:
    """Hill-climb the counts on :func:`relaxed_makespan`: move one clip of a kind between two pools, or
    exchange clips of two kinds between them."""
    best = [list(row) for row in counts]
    value = relaxed_makespan(inst, best)
    kinds = range(len(best[0]))
    pairs = [(p, q) for p in range(inst.pools) for q in range(inst.pools) if p != q]

    def moves():
        for p, q in pairs:
            for k in kinds:
                if best[p][k]:
                    yield ((p, q, k),)
                    for k2 in kinds:
                        if k2 != k and best[q][k2]:
                            yield ((p, q, k), (q, p, k2))

    improved = True
    while improved:
        improved = False
        for move in moves():
            for p, q, k in move:
                best[p][k] -= 1
                best[q][k] += 1
            v = relaxed_makespan(inst, best)
            if v < value - 1e-9:
                value, improved = v, True
                break
            for p, q, k in move:
                best[p][k] += 1
                best[q][k] -= 1
    return best
