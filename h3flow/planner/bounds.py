"""Lower bounds on a batch's makespan, valid for every policy the simulator can run.

For identical clips, with pool i busy ``S_i`` per clip, transfer ``T`` and decode ``D``
(the issue's formula): throughput <= min(sum 1/S_i, 1/D) and

    LB(n) = max(t*(n) + T + D,  min_i S_i + T + n * D)

where t*(n) is the earliest t at which the pools can have handed off n clips. It is
generalised here to mixed clips, borrowed encoders and several decoders:

- *sampling*: t* is the larger of (a) the n-th earliest handoff if every clip were the
  cheapest one of the batch (pool i hands off its k-th clip at ``k*S_i``, a borrowing
  pool at ``E + k*S_i``) and (b) a fractional bound: for any weights ``w_i`` summing to 1,
  the busiest pool's load >= sum over clips of min_i (w_i * cost_i(clip)), where a
  borrower's cost also charges its encoder pool the encode; weights proportional to each
  pool's speed on each kind of clip are tried. The last handoff is still followed by
  the cheapest transfer + decode.
- *decoding*: nothing is decoded before the first latent can arrive; after that the m
  decoders share the whole decode work: first arrival + sum of D / m.
- *one clip*: the longest single clip's own critical path.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from h3flow.planner.timing import ClipLike, Planner


@dataclass(frozen=True)
class Bound:
    seconds: float
    binding: str  # "sampling", "decoding" or "critical path"
    clips_per_hour: float  # steady-state throughput bound for clips like the batch's


def _kth_handoff(starts_periods: list[tuple[float, float]], n: int) -> float:
    """The n-th smallest of the sequences ``start + k*period`` (k >= 1)."""
    heap = [(s + p, s, p, 1) for s, p in starts_periods]
    heapq.heapify(heap)
    value = 0.0
    for _ in range(n):
        value, s, p, k = heapq.heappop(heap)
        heapq.heappush(heap, (s + p * (k + 1), s, p, k + 1))
    return value


def lower_bound(planner: Planner, clips: Sequence[ClipLike]) -> Bound:
    res = planner.resources
    pools = res.samplers
    kinds: dict[tuple[str, int], list[ClipLike]] = {}
    for c in clips:
        kinds.setdefault((c.spec, c.frames), []).append(c)
    reps = {k: v[0] for k, v in kinds.items()}

    occupancy: dict[tuple[tuple[str, int], str], float] = {}  # busy time on the pool itself
    encoder_cost: dict[tuple[tuple[str, int], str], float] = {}  # extra busy time on its encoder
    path: dict[tuple[str, int], float] = {}
    tail: dict[tuple[str, int], float] = {}
    first_arrival: dict[tuple[str, int], float] = {}
    decode_min: dict[tuple[str, int], float] = {}
    for k, c in reps.items():
        best_path, best_arrival = float("inf"), float("inf")
        for p in pools:
            t = planner.sampler_times(c, p)
            own = p.encoder == p.name
            occupancy[(k, p.name)] = t.total if own else t.sample + t.handoff
            encoder_cost[(k, p.name)] = 0.0 if own else t.encode + t.offload
            best_path = min(best_path, t.total)
            for lk in res.links:
                if lk.source == p.host:
                    best_arrival = min(best_arrival, t.total + planner.transfer_time(c, lk))
        decode_min[k] = min(sum(planner.decoder_times(c, d)) for d in res.decoders)
        transfer_min = min(planner.transfer_time(c, lk) for lk in res.links)
        path[k] = best_path
        tail[k] = transfer_min + decode_min[k]
        first_arrival[k] = best_arrival

    n = len(clips)
    # one clip's critical path
    critical = max(path[k] + tail[k] for k in reps)
    # sampling, (a): every clip as cheap as the cheapest kind
    seqs = []
    for p in pools:
        occ = min(occupancy[(k, p.name)] for k in reps)
        start = min(encoder_cost[(k, p.name)] for k in reps)
        seqs.append((start, occ))
    t_star = _kth_handoff(seqs, n)
    # sampling, (b): fractional loads with speed-proportional weights per kind of clip
    for ref in reps:
        speed = {p.name: 1.0 / occupancy[(ref, p.name)] for p in pools}
        total = sum(speed.values())
        w = {name: s / total for name, s in speed.items()}
        load = 0.0
        for k, members in kinds.items():
            cheapest = min(w[p.name] * occupancy[(k, p.name)] + w[p.encoder] * encoder_cost[(k, p.name)] for p in pools)
            load += cheapest * len(members)
        t_star = max(t_star, load)
    sampling = t_star + min(tail.values())
    # decoding
    m = len(res.decoders)
    decoding = min(first_arrival.values()) + sum(decode_min[k] * len(v) for k, v in kinds.items()) / m
    seconds, binding = max((critical, "critical path"), (sampling, "sampling"), (decoding, "decoding"))
    # steady state: per clip of the batch's mix
    mix = {k: len(v) / n for k, v in kinds.items()}
    pool_rate = sum(1.0 / sum(mix[k] * (occupancy[(k, p.name)]) for k in reps) for p in pools)
    dec_rate = m / sum(mix[k] * decode_min[k] for k in reps)
    return Bound(seconds, binding, 3600.0 * min(pool_rate, dec_rate))
