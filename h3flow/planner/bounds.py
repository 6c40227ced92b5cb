"""Lower bounds on a batch's makespan, valid for every schedule of the model (any policy, the solver).

Four bounds, each an argument about what any valid schedule must do; the bound is the
largest (``binding`` names it):

- *split point* (handoff order and decode tails): pool ``p`` cannot hand off its i-th
  clip before ``r_p`` + the i cheapest clips' time on it (``r_p``: a borrower first
  waits for an encode), so the k-th latent of the batch is written no sooner than the
  k-th smallest of all those times, ``t(k)``. The n - k + 1 clips written from then on
  still cross a link and are decoded: makespan >= t(k) + the cheapest transfer + the
  smallest n - k + 1 decodes (shared by the decoders). Taken over every split point k.
  For identical clips this is the exact ``max(t*(n) + T + D, ..., min S + T + n D)``.
- *sampling* (fractional loads, solved as a linear program): clips split fractionally
  over the pools; each pool's work (an encoder pool's includes the encodes it lends)
  plus its release, plus the cheapest transfer + decode after its last latent.
- *decoding*: nothing is decoded before the first latent can arrive; then the decoders
  share all the decode work.
- *critical path*: the slowest clip's own path on its fastest route.

``throughput`` is the steady-state bound (n -> infinity) for clips in the batch's mix:
the largest rate the pools, encoders, links and decoders sustain together (a linear
program); a long batch of that mix approaches it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from h3flow.planner.instance import Instance
from h3flow.planner.timing import ClipLike, Planner


@dataclass(frozen=True)
class Bound:
    seconds: float
    binding: str  # "split point", "sampling", "decoding" or "critical path"
    clips_per_hour: float  # steady-state throughput bound for clips in the batch's mix


def lower_bound(planner: Planner, clips: Sequence[ClipLike], *, steady: bool = True) -> Bound:
    """The analytic bound; with ``steady``, the steady-state throughput bound too (else 0)."""
    inst = Instance.of(planner, clips)
    candidates = [
        (critical_path(inst), "critical path"),
        (split_point(inst), "split point"),
        (fractional_loads(inst), "sampling"),
        (decoding(inst), "decoding"),
    ]
    seconds, binding = max(candidates)
    return Bound(seconds, binding, 3600.0 * throughput(inst) if steady else 0.0)


def quick_bound(planner: Planner, clips: Sequence[ClipLike]) -> float:
    """The analytic bound without its linear program (critical path, split point, decoding): cheaper, weaker."""
    inst = Instance.of(planner, clips)
    return max(critical_path(inst), split_point(inst), decoding(inst))


def _release(inst: Instance, p: int) -> float:
    """The earliest a pool can start sampling: a borrower waits for its first encode."""
    return 0.0 if inst.own[p] else min(row[p] for row in inst.prep)


def _tail(inst: Instance, j: int, p: int) -> float:
    return min(inst.transfer[j][lk] + inst.decode[j][d] for d, lk in inst.routes[p])


def critical_path(inst: Instance) -> float:
    return max(
        min(inst.prep[j][p] + inst.work[j][p] + _tail(inst, j, p) for p in range(inst.pools)) for j in range(inst.n)
    )


def split_point(inst: Instance) -> float:
    n = inst.n
    # t(k): the k-th smallest of r_p + (sum of the i cheapest clips on p), i = 1..n, over the pools
    heap = []
    costs = []
    for p in range(inst.pools):
        cost = sorted(inst.held(j, p) for j in range(n))
        costs.append(cost)
        heap.append((_release(inst, p) + cost[0], p, 1))
    heapq.heapify(heap)
    written = []
    for _ in range(n):
        t, p, i = heapq.heappop(heap)
        written.append(t)
        if i < n:
            heapq.heappush(heap, (t + costs[p][i], p, i + 1))
    transfer = min(min(row) for row in inst.transfer)
    decoders = len(inst.decode[0])
    decodes = sorted(min(row) for row in inst.decode)
    best = 0.0
    tail_sum = 0.0
    for k in range(n, 0, -1):  # the last n - k + 1 latents: the cheapest decodes that many could be
        tail_sum += decodes[n - k]
        shared = max(tail_sum / decoders, decodes[0])
        best = max(best, written[k - 1] + transfer + shared)
    return best


def decoding(inst: Instance) -> float:
    first = min(
        inst.prep[j][p] + inst.work[j][p] + min(inst.transfer[j][lk] for _, lk in inst.routes[p])
        for j in range(inst.n)
        for p in range(inst.pools)
    )
    decoders = len(inst.decode[0])
    return first + sum(min(row) for row in inst.decode) / decoders


def _kinds(inst: Instance) -> tuple[list[int], list[int]]:
    """One clip of each kind, and how many clips each kind has."""
    reps: dict[int, int] = {}
    count: dict[int, int] = {}
    for j, k in enumerate(inst.kind):
        reps.setdefault(k, j)
        count[k] = count.get(k, 0) + 1
    kinds = sorted(reps)
    return [reps[k] for k in kinds], [count[k] for k in kinds]


def _lp():
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    assert solver is not None
    return solver


def fractional_loads(inst: Instance) -> float:
    """The fractional-load LP: clips split over pools and decoders, each resource's work + release + tail."""
    return _fractional(inst)[0]


def balanced_counts(inst: Instance) -> list[list[int]]:
    """Whole numbers of clips of each kind per pool, rounded from the fractional-load LP's split
    (the local search's balanced starting point: each kind goes where it is relatively cheapest)."""
    share = _fractional(inst)[1]
    _, count = _kinds(inst)
    counts = [[0] * len(count) for _ in share]
    for k, total in enumerate(count):
        parts = [row[k] for row in share]
        floors = [int(v + 1e-9) for v in parts]
        left = total - sum(floors)
        by_rest = sorted(range(len(parts)), key=lambda p: -(parts[p] - floors[p]))
        for p in by_rest[:left]:
            floors[p] += 1
        for p, v in enumerate(floors):
            counts[p][k] = v
    return counts


def _fractional(inst: Instance) -> tuple[float, list[list[float]]]:
    reps, count = _kinds(inst)
    kinds = range(len(reps))
    pools = range(inst.pools)
    decoders = len(inst.decode[0])
    lp = _lp()
    inf = lp.infinity()
    makespan = lp.NumVar(0, inf, "makespan")
    # w[p][d][k]: clips of kind k sampled on p and decoded on d
    w = [[[lp.NumVar(0, inf, "") for _ in kinds] for _ in range(decoders)] for _ in pools]
    for k in kinds:
        lp.Add(sum(w[p][d][k] for p in pools for d in range(decoders)) == count[k])
    on = [[sum(w[p][d][k] for d in range(decoders)) for k in kinds] for p in pools]
    for p in pools:
        held = sum(on[p][k] * inst.held(reps[k], p) for k in kinds)
        tail = min(_tail(inst, reps[k], p) for k in kinds)
        lp.Add(makespan >= _release(inst, p) + held + tail)
        lent = [b for b in inst.borrowers if inst.encoder[b] == p]
        if lent:
            after = min([tail] + [inst.work[reps[k]][b] + _tail(inst, reps[k], b) for b in lent for k in kinds])
            lp.Add(makespan >= held + sum(on[b][k] * inst.prep[reps[k]][b] for b in lent for k in kinds) + after)
    first = min(
        inst.prep[reps[k]][p] + inst.work[reps[k]][p] + inst.transfer[reps[k]][lk]
        for k in kinds
        for p in pools
        for _, lk in inst.routes[p]
    )
    for d in range(decoders):
        lp.Add(makespan >= first + sum(w[p][d][k] * inst.decode[reps[k]][d] for p in pools for k in kinds))
    lp.Minimize(makespan)
    lp.Solve()
    share = [[float(sum(w[p][d][k].solution_value() for d in range(decoders))) for k in kinds] for p in pools]
    return float(makespan.solution_value()) * (1 - 1e-9), share


def throughput(inst: Instance) -> float:
    """The largest steady rate (clips/s) of the batch's mix: pools (and lent encodes), links, decoders."""
    reps, count = _kinds(inst)
    total = sum(count)
    mix = [c / total for c in count]
    kinds = range(len(reps))
    pools = range(inst.pools)
    decoders = len(inst.decode[0])
    links = len(inst.transfer[0])
    lp = _lp()
    inf = lp.infinity()
    rate = lp.NumVar(0, inf, "rate")
    w = [[[lp.NumVar(0, inf, "") for _ in kinds] for _ in range(decoders)] for _ in pools]
    for k in kinds:
        lp.Add(sum(w[p][d][k] for p in pools for d in range(decoders)) == rate * mix[k])
    on = [[sum(w[p][d][k] for d in range(decoders)) for k in kinds] for p in pools]
    for p in pools:
        lent = [b for b in inst.borrowers if inst.encoder[b] == p]
        busy = sum(on[p][k] * inst.held(reps[k], p) for k in kinds)
        busy += sum(on[b][k] * inst.prep[reps[k]][b] for b in lent for k in kinds)
        lp.Add(busy <= 1)
    for d in range(decoders):
        lp.Add(sum(w[p][d][k] * inst.decode[reps[k]][d] for p in pools for k in kinds) <= 1)
    for lk in range(links):
        uses = [(p, d) for p in pools for d, via in inst.routes[p] if via == lk]
        if uses:
            lp.Add(sum(w[p][d][k] * inst.transfer[reps[k]][lk] for p, d in uses for k in kinds) <= 1)
    lp.Maximize(rate)
    lp.Solve()
    return float(rate.solution_value())
