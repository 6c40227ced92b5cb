"""Reference schedulers to hold the planner against, written apart from it.

Nothing here imports the planner's own search code (``sequence``, ``improve``, ``relax``,
``solver``, ``bounds``, ``best``): only the durations (``Planner``) and the resources, and
the schedules it returns are checked by ``validate`` — so a comparison with the planner
never pits a method against one of its own parts.

- :func:`plain_local_search`: simulated annealing over (a pool per clip, one priority
  order of all clips), decoded by its own event timing: each pool works through its
  items in priority order, each as soon as its pool is free and its inputs exist.
- :func:`exhaustive`: every assignment and every order (identical clips taken once), for
  batches small enough to enumerate: the true optimum of the model.

The model is the one ``docs/planner.md`` states: a pool that encodes for itself runs a
clip's encode, offload, sample and handoff back to back; a borrower's clip is encoded on
its encoder pool first; at most ``AHEAD`` clips per borrower are encoded and not yet
handed off; each link carries one latent at a time and each decoder decodes one at a
time; latents go to the decoder that finishes them first.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from h3flow.core.contracts import AHEAD
from h3flow.planner.schedule import Schedule, StageRun
from h3flow.planner.timing import PlanClip, Planner


@dataclass(frozen=True)
class _Tables:
    """Durations looked up once: [clip][pool] encode+offload, sample+handoff; routes per pool."""

    pools: list[str]
    encoder: list[int]
    own: list[bool]
    enc: list[list[float]]
    smp: list[list[float]]
    routes: list[list[tuple[int, int]]]  # per pool: (decoder, link)
    xfer: list[list[float]]  # [clip][link]
    dec: list[list[float]]  # [clip][decoder]


def _tables(planner: Planner, clips: Sequence[PlanClip]) -> _Tables:
    res = planner.resources
    names = [p.name for p in res.samplers]
    links = [lk.name for lk in res.links]
    enc, smp, xfer, dec = [], [], [], []
    for c in clips:
        times = [planner.sampler_times(c, p) for p in res.samplers]
        enc.append([t.encode + t.offload for t in times])
        smp.append([t.sample + t.handoff for t in times])
        xfer.append([planner.transfer_time(c, lk) for lk in res.links])
        dec.append([sum(planner.decoder_times(c, d)) for d in res.decoders])
    routes = [[(d, links.index(lk.name)) for d, (_, lk) in enumerate(res.routes(p))] for p in res.samplers]
    encoder = [names.index(p.encoder) for p in res.samplers]
    return _Tables(names, encoder, [encoder[i] == i for i in range(len(names))], enc, smp, routes, xfer, dec)


@dataclass
class _Timed:
    makespan: float
    finish: list[float]  # per pool
    pool: list[int]
    enc_start: list[float]
    smp_start: list[float]
    handed: list[float]
    link: list[int]
    sent: list[float]
    decoder: list[int]
    dec_start: list[float]


def _time(tb: _Tables, pool: list[int], prio: list[int]) -> _Timed | None:
    """Time a solution: each pool's items in priority order, each as early as it may start."""
    n, npools = len(pool), len(tb.pools)
    rank = {j: r for r, j in enumerate(prio)}
    queue: list[list[tuple[str, int]]] = [[] for _ in range(npools)]
    sampled: list[list[int]] = [[] for _ in range(npools)]  # each pool's clips in order
    for j in sorted(range(n), key=rank.__getitem__):
        p = pool[j]
        sampled[p].append(j)
        if tb.own[p]:
            queue[p].append(("block", j))
        else:
            queue[tb.encoder[p]].append(("lend", j))
            queue[p].append(("sample", j))
    nth = {j: k for p in range(npools) for k, j in enumerate(sampled[p])}
    enc_end: dict[int, float] = {}
    enc_start = [0.0] * n
    smp_start = [0.0] * n
    handed: dict[int, float] = {}
    free = [0.0] * npools
    head = [0] * npools
    left = sum(len(q) for q in queue)
    while left:
        progress = False
        for p in range(npools):
            while head[p] < len(queue[p]):
                what, j = queue[p][head[p]]
                if what == "block":
                    enc_start[j] = smp_start[j] = free[p]
                    free[p] += tb.enc[j][p] + tb.smp[j][p]
                    handed[j] = free[p]
                elif what == "lend":
                    b, k = pool[j], nth[j]
                    gate = 0.0
                    if k >= AHEAD:
                        before = sampled[b][k - AHEAD]
                        if before not in handed:
                            break
                        gate = handed[before]
                    enc_start[j] = max(free[p], gate)
                    free[p] = enc_end[j] = enc_start[j] + tb.enc[j][b]
                else:
                    if j not in enc_end:
                        break
                    smp_start[j] = max(free[p], enc_end[j])
                    free[p] = handed[j] = smp_start[j] + tb.smp[j][p]
                head[p] += 1
                left -= 1
                progress = True
        if not progress:
            return None  # a borrowed encode waits on work queued behind it
    ndec, nlinks = len(tb.dec[0]), len(tb.xfer[0])
    link_free, dec_free = [0.0] * nlinks, [0.0] * ndec
    link, sent, decoder, dec_start = [0] * n, [0.0] * n, [0] * n, [0.0] * n
    arrive = [0.0] * n
    for j in sorted(range(n), key=lambda j: (handed[j], rank[j])):
        best = None
        for d, lk in tb.routes[pool[j]]:
            s = max(handed[j], link_free[lk])
            a = s + tb.xfer[j][lk]
            f = max(a, dec_free[d]) + tb.dec[j][d]
            if best is None or (f, a) < best[0]:
                best = ((f, a), d, lk, s)
        assert best is not None
        (_, a), d, lk, s = best
        link_free[lk] = a
        dec_free[d] = max(a, dec_free[d]) + tb.dec[j][d]  # projected: refined in arrival order below
        link[j], sent[j], decoder[j], arrive[j] = lk, s, d, a
    dec_free = [0.0] * ndec
    finish = [0.0] * npools
    for j in sorted(range(n), key=lambda j: (arrive[j], handed[j], rank[j])):
        d = decoder[j]
        dec_start[j] = max(arrive[j], dec_free[d])
        dec_free[d] = dec_start[j] + tb.dec[j][d]
        finish[pool[j]] = max(finish[pool[j]], dec_free[d])
    return _Timed(
        max(dec_free), finish, pool, enc_start, smp_start, [handed[j] for j in range(n)], link, sent, decoder, dec_start
    )


def _schedule(planner: Planner, clips: Sequence[PlanClip], tb: _Tables, t: _Timed, name: str) -> Schedule:
    res = planner.resources
    runs: list[StageRun] = []
    for j, c in enumerate(clips):
        p = t.pool[j]
        pool = res.samplers[p]
        st = planner.sampler_times(c, pool)
        e = t.enc_start[j]
        enc = res.samplers[tb.encoder[p]].name
        runs += [
            StageRun(c.id, "encode", enc, e, e + st.encode),
            StageRun(c.id, "offload", enc, e + st.encode, e + st.encode + st.offload),
        ]
        s = e + st.encode + st.offload if tb.own[p] else t.smp_start[j]
        runs += [
            StageRun(c.id, "sample", pool.name, s, s + st.sample),
            StageRun(c.id, "handoff", pool.name, s + st.sample, t.handed[j]),
        ]
        lk = res.links[t.link[j]]
        runs.append(StageRun(c.id, "transfer", lk.name, t.sent[j], t.sent[j] + tb.xfer[j][t.link[j]]))
        dec = res.decoders[t.decoder[j]]
        decode, mux = planner.decoder_times(c, dec)
        d0 = t.dec_start[j]
        runs += [
            StageRun(c.id, "decode", dec.name, d0, d0 + decode),
            StageRun(c.id, "mux", dec.name, d0 + decode, d0 + decode + mux),
        ]
    ids = [c.id for c in clips]
    return Schedule(
        res.topology,
        name,
        ids,
        runs,
        {c: tb.pools[t.pool[j]] for j, c in enumerate(ids)},
        {c: res.decoders[t.decoder[j]].name for j, c in enumerate(ids)},
    )


def _key(t: _Timed) -> tuple[float, float]:
    return (t.makespan, sum(sorted(t.finish, reverse=True)[1:]))


def _greedy(tb: _Tables, n: int) -> tuple[list[int], list[int]]:
    """Longest clip first, each to the pool that finishes the partial batch soonest."""
    order = sorted(range(n), key=lambda j: -max(tb.enc[j][p] + tb.smp[j][p] for p in range(len(tb.pools))))
    pool: list[int] = []
    placed: list[int] = []
    full = [0] * n
    for j in order:
        best = None
        for p in range(len(tb.pools)):
            trial = [*placed, j]
            assign = [full[c] if c != j else p for c in trial]
            t = _time(_sub(tb, trial), assign, list(range(len(trial))))
            if t is not None and (best is None or _key(t) < best[0]):
                best = (_key(t), p)
        assert best is not None
        full[j] = best[1]
        placed.append(j)
    pool = [full[j] for j in range(n)]
    return pool, order


def _sub(tb: _Tables, clips: list[int]) -> _Tables:
    return _Tables(
        tb.pools,
        tb.encoder,
        tb.own,
        [tb.enc[j] for j in clips],
        [tb.smp[j] for j in clips],
        tb.routes,
        [tb.xfer[j] for j in clips],
        [tb.dec[j] for j in clips],
    )


def plain_local_search(
    planner: Planner,
    clips: Sequence[PlanClip],
    *,
    seconds: float = 5.0,
    seed: int = 1,
    restarts: int = 2,
    max_evals: int | None = None,
) -> Schedule:
    """Simulated annealing over pool assignment and priority order; the best schedule it meets (within
    ``seconds``, or exactly ``max_evals`` candidate evaluations when given: reproducible)."""
    clips = list(clips)
    tb = _tables(planner, clips)
    n, npools = len(clips), len(tb.pools)
    rng = random.Random(seed)
    pool, prio = _greedy(tb, n)
    start = _time(tb, pool, prio)
    assert start is not None
    best_t, best = start, (list(pool), list(prio))
    deadline = time.perf_counter() + seconds
    per_run = seconds / max(restarts, 1)
    per_evals = max_evals // max(restarts, 1) if max_evals is not None else None
    for run in range(max(restarts, 1)):
        if run:
            pool, prio = list(best[0]), list(best[1])
        cur = _time(tb, pool, prio)
        assert cur is not None
        scale = cur.makespan * 0.01
        run_end = min(deadline, time.perf_counter() + per_run)
        began = time.perf_counter()
        step = 0
        while True:
            if per_evals is not None:
                if step >= per_evals:
                    break
                progress = step / per_evals
            else:
                now = time.perf_counter()
                if now >= run_end:
                    break
                progress = (now - began) / max(per_run, 1e-9)
            step += 1
            temp = scale * max(1e-3, 1 - progress)
            p2, o2 = list(pool), list(prio)
            r = rng.random()
            if r < 0.35 and npools > 1:
                p2[rng.randrange(n)] = rng.randrange(npools)
            elif r < 0.55 and n > 1:
                a, b = rng.sample(range(n), 2)
                p2[a], p2[b] = p2[b], p2[a]
            elif r < 0.85 and n > 1:
                j = o2.pop(rng.randrange(n))
                o2.insert(rng.randrange(n), j)
            elif n > 1:
                a, b = rng.sample(range(n), 2)
                o2[a], o2[b] = o2[b], o2[a]
            t = _time(tb, p2, o2)
            if t is None:
                continue
            delta = t.makespan - cur.makespan
            if delta <= 0 or rng.random() < math.exp(-delta / temp):
                pool, prio, cur = p2, o2, t
                if _key(t) < _key(best_t):
                    best_t, best = t, (list(p2), list(o2))
    return _schedule(planner, clips, tb, best_t, "plain local search")


def exhaustive(planner: Planner, clips: Sequence[PlanClip], *, limit: int = 3_000_000) -> Schedule:
    """The optimum over every assignment and priority order (identical clips counted once)."""
    clips = list(clips)
    tb = _tables(planner, clips)
    n, npools = len(clips), len(tb.pools)
    kind = {}
    kinds = [kind.setdefault((c.spec, c.frames), len(kind)) for c in clips]
    best: _Timed | None = None
    seen = 0
    orders = set()
    for perm in itertools.permutations(range(n)):
        sig = tuple(kinds[j] for j in perm)
        if sig in orders:
            continue
        orders.add(sig)
        for assign in itertools.product(range(npools), repeat=n):
            seen += 1
            if seen > limit:
                raise ValueError(f"more than {limit} solutions: too large to enumerate")
            pool = [0] * n
            for pos, j in enumerate(perm):
                pool[j] = assign[pos]
            t = _time(tb, pool, list(perm))
            if t is not None and (best is None or t.makespan < best.makespan - 1e-9):
                best = t
    assert best is not None
    return _schedule(planner, clips, tb, best, "exhaustive")
