"""Schedules as sequences: the order of work on each sampler pool, timed as early as it can run.

A :data:`Sequences` value lists, per sampler pool, what it does in order: a clip index
``j`` (the clip's sampling — with its encode first when the pool encodes for itself),
or ``~j`` (a *borrowed encode*: the encode + offload of clip ``j`` for a pool that
cannot hold the encoder). :func:`timeline` starts every item as soon as its pool is free
and its inputs exist: a borrower samples a clip once its encode is done, and the
encode of a borrower's k-th clip waits until its (k - ``AHEAD``)-th clip is handed off
(at most ``AHEAD`` clips in flight per pool, as the live dispatcher keeps).
:func:`deliver` sends the latents over their links in handoff order and decodes them
in arrival order, each on the decoder that finishes it first — the same delivery rule
the simulator uses. The local search and the solver both produce sequences; this module
turns them into a :class:`~h3flow.planner.simulate.Schedule`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from h3flow.core.contracts import AHEAD  # clips in flight per sampler pool, as the live dispatcher keeps
from h3flow.planner.instance import Instance
from h3flow.planner.schedule import Schedule, StageRun

Sequences = list[list[int]]
CUT_TOLERANCE = 1e-6
"""Seconds: a cut-off evaluation drops a schedule only when it must end this much after the cut-off (sums of
the same durations in another order differ in their last bits)."""


@dataclass(frozen=True, slots=True)
class Timeline:
    """When each clip's work on its pool starts, its borrowed encode starts, and its latent is written."""

    pool_of: list[int]
    start: list[float]  # own pool: encode start; borrower: sample start
    encoded_at: list[float]  # borrowed encode's start (own pools: the block's start)
    handed: list[float]  # handoff end


@dataclass(frozen=True, slots=True)
class Delivery:
    link: list[int]
    sent: list[float]  # transfer start
    arrived: list[float]
    decoder: list[int]
    decoded: list[float]  # decode start
    makespan: float
    finish: list[float]  # per sampler pool: when its last clip is muxed (0 when it has none)


def timeline(inst: Instance, seqs: Sequences, ahead: int = AHEAD, cutoff: float = math.inf) -> Timeline | None:
    """Time every pool's items as early as possible; None when the sequences deadlock, or as soon as a latent
    is handed off too late to be delivered by ``cutoff`` (the local search rejects those unseen)."""
    n, own, prep, work, tail = inst.n, inst.own, inst.prep, inst.work, inst.tail
    pool_of = [-1] * n
    rank = [0] * n
    for p, seq in enumerate(seqs):
        k = 0
        for item in seq:
            if item >= 0:
                pool_of[item] = p
                rank[item] = k
                k += 1
    start = [0.0] * n
    encoded_at = [0.0] * n
    enc_end: list[float | None] = [None] * n
    handed: list[float | None] = [None] * n
    free = [0.0] * len(seqs)
    ptr = [0] * len(seqs)
    left = sum(len(s) for s in seqs)
    while left:
        moved = 0
        for p, seq in enumerate(seqs):
            i, t, size, own_p = ptr[p], free[p], len(seq), own[p]
            while i < size:
                item = seq[i]
                if item >= 0:
                    if own_p:
                        start[item] = encoded_at[item] = t
                        t += prep[item][p] + work[item][p]
                    else:
                        e = enc_end[item]
                        if e is None:
                            break
                        t = t if t > e else e
                        start[item] = t
                        t += work[item][p]
                    handed[item] = t
                    if t + tail[item][p] > cutoff + CUT_TOLERANCE:
                        return None
                else:
                    j = ~item
                    b = pool_of[j]
                    k = rank[j]
                    if k >= ahead:
                        gate = handed[seqs[b][k - ahead]]
                        if gate is None:
                            break
                        if gate > t:
                            t = gate
                    encoded_at[j] = t
                    t += prep[j][b]
                    enc_end[j] = t
                i += 1
            if i != ptr[p]:
                moved += i - ptr[p]
                ptr[p], free[p] = i, t
        if not moved:
            return None
        left -= moved
    return Timeline(pool_of, start, encoded_at, handed)  # type: ignore[arg-type]


def deliver(
    inst: Instance, handed: Sequence[float], pool_of: Sequence[int], order: Sequence[int] | None = None
) -> Delivery:
    """Links in handoff order, each latent to the decoder that would finish it first; decoders in arrival order.

    ``order`` breaks ties between equal handoff times (default: the clips' indices).
    """
    n = inst.n
    if order is None:
        order = sorted(range(n), key=handed.__getitem__)  # stable: equal times keep index order
    link_free = [0.0] * len(inst.planner.resources.links)
    link = [0] * n
    sent = [0.0] * n
    arrived = [0.0] * n
    decoder = [0] * n
    transfer, decode, routes = inst.transfer, inst.decode, inst.routes
    if len(inst.decode[0]) == 1:  # one decoder: every latent goes there
        via = [r[0][1] for r in routes]
        for j in order:
            lk = via[pool_of[j]]
            h, free = handed[j], link_free[lk]
            s = h if h > free else free
            link_free[lk] = arrived[j] = s + transfer[j][lk]
            link[j], sent[j] = lk, s
    else:
        projected = [0.0] * len(inst.decode[0])
        for j in order:
            h = handed[j]
            best: tuple[float, float, int, int, float] | None = None
            for d, lk in routes[pool_of[j]]:
                s = h if h > link_free[lk] else link_free[lk]
                a = s + transfer[j][lk]
                f = (a if a > projected[d] else projected[d]) + decode[j][d]
                if best is None or (f, a) < (best[0], best[1]):
                    best = (f, a, d, lk, s)
            assert best is not None
            f, a, d, lk, s = best
            link_free[lk] = a
            projected[d] = f
            link[j], sent[j], arrived[j], decoder[j] = lk, s, a, d
    dec_free = [0.0] * len(inst.decode[0])
    decoded = [0.0] * n
    finish = [0.0] * inst.pools
    for j in sorted(order, key=arrived.__getitem__):  # stable: equal arrivals keep handoff order
        d = decoder[j]
        a, free = arrived[j], dec_free[d]
        s = a if a > free else free
        decoded[j] = s
        end = dec_free[d] = s + decode[j][d]
        p = pool_of[j]
        if end > finish[p]:
            finish[p] = end
    return Delivery(link, sent, arrived, decoder, decoded, max(dec_free, default=0.0), finish)


def evaluate(inst: Instance, seqs: Sequences, cutoff: float = math.inf) -> tuple[Timeline, Delivery] | None:
    """The sequences timed and delivered; None when they deadlock or (``cutoff``) a latent is handed off too
    late to be delivered by then — the schedule may then end later than ``cutoff``, never sooner."""
    tl = timeline(inst, seqs, cutoff=cutoff)
    if tl is None:
        return None
    return tl, deliver(inst, tl.handed, tl.pool_of)


def makespan(inst: Instance, seqs: Sequences) -> float:
    done = evaluate(inst, seqs)
    return done[1].makespan if done else float("inf")


def check(inst: Instance, seqs: Sequences) -> None:
    """Every clip sampled once; a borrower's clip encoded once, on its encoder pool."""
    seen: dict[int, int] = {}
    encodes: dict[int, int] = {}
    for p, seq in enumerate(seqs):
        for item in seq:
            target = seen if item >= 0 else encodes
            j = item if item >= 0 else ~item
            if j in target:
                raise ValueError(f"clip {j} appears twice")
            target[j] = p
    if sorted(seen) != list(range(inst.n)):
        raise ValueError("not every clip is sampled exactly once")
    for j, p in seen.items():
        if inst.own[p]:
            if j in encodes:
                raise ValueError(f"clip {j} on pool {p} encodes itself but has a borrowed encode")
        elif encodes.get(j) != inst.encoder[p]:
            raise ValueError(f"clip {j} on pool {p} needs its encode on pool {inst.encoder[p]}")
    if set(encodes) - {j for j, p in seen.items() if not inst.own[p]}:
        raise ValueError("a borrowed encode for a clip that does not borrow")


# --------------------------------------------------------------------------- to and from schedules
def sampler_runs(inst: Instance, tl: Timeline) -> list[StageRun]:
    """Encode, offload, sample and handoff of every clip, with the profile's stage times."""
    res = inst.planner.resources
    pools = res.samplers
    runs: list[StageRun] = []
    for j, clip in enumerate(inst.clips):
        p = tl.pool_of[j]
        pool = pools[p]
        t = inst.planner.sampler_times(clip, pool)
        enc = pools[inst.encoder[p]].name
        e = tl.encoded_at[j]
        runs.append(StageRun(clip.id, "encode", enc, e, e + t.encode))
        runs.append(StageRun(clip.id, "offload", enc, e + t.encode, e + t.encode + t.offload))
        s = e + t.encode + t.offload if inst.own[p] else tl.start[j]
        runs.append(StageRun(clip.id, "sample", pool.name, s, s + t.sample))
        runs.append(StageRun(clip.id, "handoff", pool.name, s + t.sample, tl.handed[j]))
    return runs


def delivery_runs(inst: Instance, dl: Delivery) -> list[StageRun]:
    """Transfer, decode and mux of every clip."""
    res = inst.planner.resources
    runs: list[StageRun] = []
    for j, clip in enumerate(inst.clips):
        dec = res.decoders[dl.decoder[j]]
        runs.append(StageRun(clip.id, "transfer", res.links[dl.link[j]].name, dl.sent[j], dl.arrived[j]))
        decode, mux = inst.planner.decoder_times(clip, dec)
        s = dl.decoded[j]
        runs.append(StageRun(clip.id, "decode", dec.name, s, s + decode))
        runs.append(StageRun(clip.id, "mux", dec.name, s + decode, s + decode + mux))
    return runs


def to_schedule(inst: Instance, seqs: Sequences, method: str) -> Schedule:
    done = evaluate(inst, seqs)
    if done is None:
        raise ValueError("the sequences deadlock: a borrowed encode waits on work queued behind it")
    tl, dl = done
    res = inst.planner.resources
    ids = [c.id for c in inst.clips]
    return Schedule(
        res.topology,
        method,
        ids,
        sampler_runs(inst, tl) + delivery_runs(inst, dl),
        {c: res.samplers[tl.pool_of[j]].name for j, c in enumerate(ids)},
        {c: res.decoders[dl.decoder[j]].name for j, c in enumerate(ids)},
    )


def from_schedule(inst: Instance, schedule: Schedule) -> Sequences:
    """The order of work on each sampler pool in ``schedule`` (by start time)."""
    index = {p.name: i for i, p in enumerate(inst.planner.resources.samplers)}
    clip_index = {c.id: j for j, c in enumerate(inst.clips)}
    items: list[list[tuple[float, int]]] = [[] for _ in index]
    for run in schedule.runs:
        j = clip_index[run.clip]
        p = index[schedule.pool_of[run.clip]]
        if run.stage == "encode":
            items[index[run.resource]].append((run.start, j if inst.own[p] else ~j))
        elif run.stage == "sample" and not inst.own[p]:
            items[p].append((run.start, j))
    return [[item for _, item in sorted(lst)] for lst in items]


def arrange(inst: Instance, lists: list[list[int]], ahead: int = AHEAD) -> Sequences:
    """Sequences for clips already assigned and ordered per pool (``lists[p]``): each encoder pool
    does every borrowed encode it may (its borrower has a free slot) before its own next clip."""
    seqs: Sequences = [list(lst) for lst in lists]
    for e in range(inst.pools):
        borrowers = [b for b in inst.borrowers if inst.encoder[b] == e]
        if not borrowers:
            continue
        own_items = list(lists[e])
        nxt = dict.fromkeys(borrowers, 0)  # next clip of each borrower to encode
        handed: dict[int, list[float]] = {b: [] for b in borrowers}
        b_free = dict.fromkeys(borrowers, 0.0)
        out: list[int] = []
        t = 0.0

        def gate(b: int, nxt: dict[int, int] = nxt, handed: dict[int, list[float]] = handed) -> float | None:
            k = nxt[b]
            if k >= len(lists[b]):
                return None
            return 0.0 if k < ahead else handed[b][k - ahead]

        while True:
            served = True
            while served:
                served = False
                ready = [b for b in borrowers if (g := gate(b)) is not None and g <= t + 1e-9]
                if ready:
                    b = min(ready, key=lambda b: (b_free[b], b))
                    j = lists[b][nxt[b]]
                    out.append(~j)
                    t += inst.prep[j][b]
                    start = max(t, b_free[b])
                    b_free[b] = start + inst.work[j][b]
                    handed[b].append(b_free[b])
                    nxt[b] += 1
                    served = True
            if own_items:
                j = own_items.pop(0)
                out.append(j)
                t += inst.prep[j][e] + inst.work[j][e]
                continue
            gates = [g for b in borrowers if (g := gate(b)) is not None]
            if not gates:
                break
            t = max(t, min(gates))
        seqs[e] = out
    return seqs


def from_counts(inst: Instance, counts: list[list[int]]) -> Sequences:
    """Sequences giving pool ``p`` ``counts[p][k]`` clips of kind ``k``, longest first on each pool."""
    by_kind: dict[int, list[int]] = {}
    for j, k in enumerate(inst.kind):
        by_kind.setdefault(k, []).append(j)
    lists: list[list[int]] = [[] for _ in range(inst.pools)]
    for k, members in by_kind.items():
        it = iter(members)
        for p in range(inst.pools):
            lists[p].extend(next(it) for _ in range(counts[p][k]))
    for p, lst in enumerate(lists):
        lst.sort(key=lambda j: (-inst.held(j, p), j))
    return arrange(inst, lists)
