"""The batch schedule as a CP-SAT model (OR-Tools): the optimum, or a schedule with a proven bound.

Interval variables, in integer milliseconds, per clip:

- which sampler pool takes it (one Boolean per pool); on a pool that encodes for
  itself one interval (encode + offload + sample + handoff); on a borrower an encode
  interval on its encoder pool and a sample interval on the borrower, the sample after
  the encode;
- the in-flight limit: on each borrower, the span from a clip's encode to its handoff is
  a demand of 1 on a cumulative of capacity ``AHEAD`` (at most two clips dispatched and
  not yet handed off — the encode of a pool that encodes for itself runs on the pool, so
  it holds one clip at a time anyway);
- which decoder takes it, hence which link it crosses; the transfer after the handoff,
  the decode + mux after the transfer; the decode order on each decoder is free;
- no overlap on each pool (its own blocks, the encodes it lends, its borrowed samples),
  each link and each decoder.

Durations are rounded *up* to the millisecond, so every solution is a valid schedule
at the real times. Its proven bound holds for the rounded times; for the real ones it
is lowered by one millisecond per interval (shifting every interval of a real schedule
later by its rank times 1 ms makes room for the rounding). Redundant linear constraints
(each pool's load, the decoders' load, the analytic bound) give the search a strong
linear relaxation; identical clips are written in batch order (symmetry breaking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from h3flow.planner.instance import Instance
from h3flow.planner.sequence import AHEAD, Delivery, Sequences, Timeline, evaluate

SCALE = 1000  # milliseconds


def _up(x: float) -> int:
    return math.ceil(x * SCALE - 1e-6)


@dataclass(frozen=True)
class Solved:
    timeline: Timeline | None  # the best solution found (real durations), None if none
    delivery: Delivery | None
    sequences: Sequences | None
    bound: float  # seconds, valid for the real durations
    optimal: bool
    status: str


def solve_cp(
    inst: Instance,
    *,
    seconds: float,
    hint: Sequences | None = None,
    known_bound: float = 0.0,
    workers: int = 1,
    seed: int = 0,
    max_deterministic: float | None = None,
) -> Solved:
    """Solve within ``seconds`` of wall time (and ``max_deterministic`` units of CP-SAT's
    deterministic time, which does not depend on the machine's load: for reproducible runs)."""
    from ortools.sat.python import cp_model

    n, pools = inst.n, range(inst.pools)
    decoders = range(len(inst.decode[0]))
    held = [[_up(inst.held(j, p)) for p in pools] for j in range(n)]
    prep = [[_up(inst.prep[j][p]) for p in pools] for j in range(n)]
    work = [[_up(inst.work[j][p]) for p in pools] for j in range(n)]
    transfer = [[_up(t) for t in row] for row in inst.transfer]
    decode = [[_up(t) for t in row] for row in inst.decode]
    horizon = sum(max(held[j][p] + prep[j][p] for p in pools) + max(transfer[j]) + max(decode[j]) for j in range(n))

    m = cp_model.CpModel()
    makespan = m.new_int_var(0, horizon, "makespan")
    m.add(makespan >= math.floor(known_bound * SCALE))
    on: dict[tuple[str, int], list] = {}  # ("pool" | "link" | "decoder", index) -> intervals
    inflight: dict[int, list] = {b: [] for b in inst.borrowers}
    choices: list[list[tuple]] = []  # per clip: (pool, decoder, link, literal, vars) of each route
    handed = []
    x: list[list] = []  # per clip: the literal of each pool
    n_intervals = 0
    for j in range(n):
        h = m.new_int_var(0, horizon, f"h{j}")
        handed.append(h)
        xj = []
        sample_side: dict[int, tuple] = {}
        for p in pools:
            lit = m.new_bool_var(f"x{j}_{p}")
            xj.append(lit)
            if inst.own[p]:
                s = m.new_int_var(0, horizon, "")
                on.setdefault(("pool", p), []).append(m.new_optional_fixed_size_interval_var(s, held[j][p], lit, ""))
                m.add(h == s + held[j][p]).only_enforce_if(lit)
                sample_side[p] = (s, s)
                n_intervals += 1
            else:
                e, s = m.new_int_var(0, horizon, ""), m.new_int_var(0, horizon, "")
                on.setdefault(("pool", inst.encoder[p]), []).append(
                    m.new_optional_fixed_size_interval_var(e, prep[j][p], lit, "")
                )
                on.setdefault(("pool", p), []).append(m.new_optional_fixed_size_interval_var(s, work[j][p], lit, ""))
                m.add(s >= e + prep[j][p]).only_enforce_if(lit)
                m.add(h == s + work[j][p]).only_enforce_if(lit)
                span = m.new_int_var(0, horizon, "")
                inflight[p].append(m.new_optional_interval_var(e, span, s + work[j][p], lit, ""))
                sample_side[p] = (e, s)
                n_intervals += 2
        m.add_exactly_one(xj)
        x.append(xj)
        routes = []
        for p in pools:
            for d, lk in inst.routes[p]:
                lit = xj[p] if len(decoders) == 1 else m.new_bool_var("")
                t, dstart = m.new_int_var(0, horizon, ""), m.new_int_var(0, horizon, "")
                on.setdefault(("link", lk), []).append(
                    m.new_optional_fixed_size_interval_var(t, transfer[j][lk], lit, "")
                )
                on.setdefault(("decoder", d), []).append(
                    m.new_optional_fixed_size_interval_var(dstart, decode[j][d], lit, "")
                )
                m.add(t >= h).only_enforce_if(lit)
                m.add(dstart >= t + transfer[j][lk]).only_enforce_if(lit)
                m.add(makespan >= dstart + decode[j][d]).only_enforce_if(lit)
                routes.append((p, d, lk, lit, sample_side[p], t, dstart))
        if len(decoders) > 1:
            for p in pools:
                m.add(sum(r[3] for r in routes if r[0] == p) == xj[p])
        n_intervals += 2
        choices.append(routes)
    for intervals in on.values():
        m.add_no_overlap(intervals)
    for intervals in inflight.values():
        if intervals:
            m.add_cumulative(intervals, [1] * len(intervals), AHEAD)
    # redundant, for the linear relaxation: each pool's load (an encoder's includes what it lends), the
    # decoder's, and what follows the last handoff
    if len(decoders) == 1:
        for p in pools:
            tail = min(transfer[j][lk] + decode[j][d] for j in range(n) for d, lk in inst.routes[p])
            release = 0 if inst.own[p] else min(prep[j][p] for j in range(n))
            load = sum(x[j][p] * (held[j][p] if inst.own[p] else work[j][p]) for j in range(n))
            m.add(makespan >= release + load + tail)
            lent = [(j, b) for b in inst.borrowers if inst.encoder[b] == p for j in range(n)]
            if lent:
                m.add(makespan >= load + sum(x[j][b] * prep[j][b] for j, b in lent))
        first = min(held[j][p] + (0 if inst.own[p] else prep[j][p]) for j in range(n) for p in pools)
        m.add(makespan >= first + sum(decode[j][0] for j in range(n)))
    # identical clips are interchangeable: write them in batch order
    last_of_kind: dict[int, int] = {}
    for j, k in enumerate(inst.kind):
        if k in last_of_kind:
            m.add(handed[last_of_kind[k]] <= handed[j])
        last_of_kind[k] = j
    m.minimize(makespan)

    if hint is not None:
        _add_hint(m, inst, hint, choices, handed, makespan)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(seconds, 0.01)
    if max_deterministic is not None:
        solver.parameters.max_deterministic_time = max_deterministic
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    slack = n_intervals / SCALE
    bound = max(known_bound, solver.best_objective_bound / SCALE - slack)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solved(None, None, None, bound, False, name)
    tl, dl = _extract(inst, solver, choices)
    seqs = _sequences(inst, tl)
    return Solved(tl, dl, seqs, bound, status == cp_model.OPTIMAL, name)


def _rounded(inst: Instance) -> Instance:
    """The instance with every duration rounded up to the millisecond (what the model sees)."""

    def up(rows: list[list[float]]) -> list[list[float]]:
        return [[_up(v) / SCALE for v in row] for row in rows]

    return Instance(
        inst.planner,
        inst.clips,
        inst.encoder,
        inst.own,
        inst.routes,
        up(inst.prep),
        up(inst.work),
        up(inst.transfer),
        up(inst.decode),
        inst.kind,
    )


def canonical(inst: Instance, seqs: Sequences) -> Sequences:
    """The same schedule with identical clips relabelled so they are handed off in batch order (what the
    model's symmetry breaking asks of a hint)."""
    done = evaluate(inst, seqs)
    if done is None:
        return seqs
    handed = done[0].handed
    by_kind: dict[int, list[int]] = {}
    for j, k in enumerate(inst.kind):
        by_kind.setdefault(k, []).append(j)
    rename: dict[int, int] = {}
    for members in by_kind.values():
        for old, new in zip(sorted(members, key=lambda j: (handed[j], j)), members, strict=True):
            rename[old] = new
    return [[rename[i] if i >= 0 else ~rename[~i] for i in seq] for seq in seqs]


def _add_hint(m, inst: Instance, seqs: Sequences, choices, handed, makespan) -> None:
    rounded = _rounded(inst)
    done = evaluate(rounded, canonical(rounded, seqs))
    if done is None:
        return
    tl, dl = done

    def ms(v: float) -> int:
        return round(v * SCALE)

    for j, routes in enumerate(choices):
        p, d = tl.pool_of[j], dl.decoder[j]
        hinted: set[int] = set()
        for q, dd, _, lit, (e, s), t, dstart in routes:
            chosen = q == p and dd == d
            if lit.index not in hinted:
                hinted.add(lit.index)
                m.add_hint(lit, chosen)
            if chosen:
                if e is not s:
                    m.add_hint(e, ms(tl.encoded_at[j]))
                m.add_hint(s, ms(tl.start[j]))
                m.add_hint(t, ms(dl.sent[j]))
                m.add_hint(dstart, ms(dl.decoded[j]))
        m.add_hint(handed[j], ms(tl.handed[j]))
    m.add_hint(makespan, ms(dl.makespan))


def _extract(inst: Instance, solver, choices) -> tuple[Timeline, Delivery]:
    """The solution at the real durations: each stage starts where the solver put it."""
    n = inst.n
    pool_of, starts, encoded, handed = [0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    link, sent_at, arrived, decoder, dec_at = [0] * n, [0.0] * n, [0.0] * n, [0] * n, [0.0] * n
    finish = [0.0] * inst.pools
    for j, routes in enumerate(choices):
        p, d, lk, _, (e, s), t, dstart = next(r for r in routes if solver.boolean_value(r[3]))
        pool_of[j], decoder[j], link[j] = p, d, lk
        starts[j] = solver.value(s) / SCALE
        encoded[j] = solver.value(e) / SCALE
        handed[j] = starts[j] + inst.work[j][p] + (inst.prep[j][p] if inst.own[p] else 0.0)
        sent_at[j] = solver.value(t) / SCALE
        arrived[j] = sent_at[j] + inst.transfer[j][lk]
        dec_at[j] = solver.value(dstart) / SCALE
        finish[p] = max(finish[p], dec_at[j] + inst.decode[j][d])
    tl = Timeline(pool_of, starts, encoded, handed)
    return tl, Delivery(link, sent_at, arrived, decoder, dec_at, max(finish), finish)


def _sequences(inst: Instance, tl: Timeline) -> Sequences:
    """The order of work on each pool in a timed solution. A borrower's encodes keep the slots the
    solution gave them on the encoder but follow the borrower's sampling order (the sequencer's
    in-flight rule counts clips in that order)."""
    items: list[list[tuple[float, int]]] = [[] for _ in range(inst.pools)]
    for j in range(inst.n):
        p = tl.pool_of[j]
        items[p].append((tl.start[j], j))
        if not inst.own[p]:
            items[inst.encoder[p]].append((tl.encoded_at[j], ~j))
    seqs = [[item for _, item in sorted(lst)] for lst in items]
    for b in inst.borrowers:
        e = inst.encoder[b]
        slots = [i for i, item in enumerate(seqs[e]) if item < 0 and tl.pool_of[~item] == b]
        for i, j in zip(slots, seqs[b], strict=True):
            seqs[e][i] = ~j
    return seqs
