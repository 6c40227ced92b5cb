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
from dataclasses import dataclass

from h3flow.planner.instance import Instance

SCALE = 1000  # CP-SAT works in integer milliseconds


@dataclass(frozen=True)
class Relaxation:
    bound: float  # seconds: no schedule finishes sooner
    counts: list[list[int]] | None  # [pool][kind] in its best solution (None: none found in time)
    optimal: bool


def _down(x: float) -> int:
    return math.floor(x * SCALE + 1e-9)


def solve_relaxation(
    inst: Instance,
    seconds: float = 0.3,
    workers: int = 1,
    hint: list[list[int]] | None = None,
    stagger: bool = True,
) -> Relaxation:
    """Solve the relaxation within ``seconds``; ``hint``: counts to start from ([pool][kind])."""
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
    makespan = m.new_int_var(0, horizon, "makespan")
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
    if single_decoder and stagger:  # the pools' last clips reach one decoder: it decodes them one after another
        for p, (used_p, lp, zp) in enumerate(last):
            behind = []
            for q, (_, lq, zq) in enumerate(last):
                if q == p:
                    continue
                later = m.new_bool_var(f"later{p}_{q}")
                m.add(lq >= lp).only_enforce_if(later)
                m.add(lq < lp).only_enforce_if(later.negated())
                extra = m.new_int_var(0, max(decode), f"extra{p}_{q}")
                m.add(extra == sum(zq[k] * decode[k] for k in kinds)).only_enforce_if(later)
                m.add(extra == 0).only_enforce_if(later.negated())
                behind.append(extra)
            # any of these last clips may be decoded first: it arrives no sooner than L_p + the cheapest transfer
            arrive = min(min(row) for row in transfer) + sum(zp[k] * decode[k] for k in kinds)
            m.add(makespan >= lp + arrive + sum(behind)).only_enforce_if(used_p)
    m.minimize(makespan)
    if hint is not None:
        for p in pools:
            for k in kinds:
                m.add_hint(y[p][k], hint[p][k])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    status = solver.solve(m)
    bound = solver.best_objective_bound / SCALE
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Relaxation(bound, None, False)
    counts = [[int(solver.value(y[p][k])) for k in kinds] for p in pools]
    return Relaxation(bound, counts, status == cp_model.OPTIMAL)


def _tables(inst: Instance) -> tuple[list[list[float]], list[list[float]], list[list[float]], list[float], float]:
    """Per pool and kind: held time, lent encode, tail; per kind: decode; the cheapest transfer."""
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
    return held, prep, tail, decode, min(min(row) for row in inst.transfer)


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
