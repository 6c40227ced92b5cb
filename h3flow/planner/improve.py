"""Local search over sequences: move and swap clips between pools, reorder them, shift borrowed encodes.

Every candidate is timed in full by :func:`~h3flow.planner.sequence.evaluate` and kept
only if it is better: a shorter makespan, or the same makespan with the pools' finish
times lower (compared largest first) — the tie-break that lets the search walk across
the plateaus a makespan objective has. It never returns worse sequences than it was
given. Randomised with a fixed seed, bounded by a number of evaluations and a deadline,
and restarted from a perturbed best (iterated local search) while budget is left.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator

from h3flow.planner import fastseq
from h3flow.planner.instance import Instance
from h3flow.planner.sequence import Sequences, evaluate

Key = tuple[float, ...]
PYTHON_EVALS = 50_000  # the default evaluation budget of improve() in Python (~1.5 s at 40 clips)
C_EVALS = 2_000_000  # ... with the C core (~1.2 s at 44 clips: the time limit binds first in a plan)
EPS = 1e-6


def key_of(inst: Instance, seqs: Sequences, cutoff: float = math.inf) -> Key | None:
    """Makespan, then the pools' finish times, largest first; None when the sequences deadlock or cannot end
    by ``cutoff`` (cut short: a candidate that cannot be taken is not timed in full — one that is timed may
    still end after it)."""
    timed = _timed(inst, seqs, cutoff)
    return timed[0] if timed is not None else None


def _timed(inst: Instance, seqs: Sequences, cutoff: float = math.inf) -> tuple[Key, list[float]] | None:
    """:func:`key_of` and the pools' finish times (which the moves read)."""
    if fastseq.AVAILABLE:
        timed = fastseq.evaluate(inst, seqs, cutoff)
        if timed is None:
            return None
        span, finish = timed
    else:
        done = evaluate(inst, seqs, cutoff)
        if done is None:
            return None
        span, finish = done[1].makespan, done[1].finish
    return (round(span, 6), *sorted((round(f, 6) for f in finish), reverse=True)), finish


def _copy(seqs: Sequences) -> Sequences:
    return [list(s) for s in seqs]


def _clip_pools(inst: Instance, seqs: Sequences) -> dict[int, tuple[int, int]]:
    """clip -> (pool, position in the pool's list)."""
    out = {}
    for p, seq in enumerate(seqs):
        for i, item in enumerate(seq):
            if item >= 0:
                out[item] = (p, i)
    return out


def _remove(inst: Instance, seqs: Sequences, j: int, p: int) -> None:
    seqs[p].remove(j)
    if not inst.own[p]:
        seqs[inst.encoder[p]].remove(~j)


def _encode_slots(inst: Instance, seqs: Sequences, q: int, pos: int) -> range:
    """Where, in the encoder's list, the borrowed encode of a clip inserted at ``pos`` on borrower ``q`` may go
    (between the encodes of its neighbours in ``q``'s order)."""
    enc = seqs[inst.encoder[q]]
    where = {~item: i for i, item in enumerate(enc) if item < 0}
    before = [where[j] for j in seqs[q][:pos] if j in where]
    after = [where[j] for j in seqs[q][pos + 1 :] if j in where]
    lo = max(before) + 1 if before else 0
    hi = min(after) if after else len(enc)
    return range(lo, hi + 1)


def _insertions(inst: Instance, seqs: Sequences, j: int, q: int, pos: int, rng: random.Random) -> Iterator[Sequences]:
    """``seqs`` (with ``j`` removed) with ``j`` inserted at ``pos`` on pool ``q`` (and its encode placed)."""
    base = _copy(seqs)
    base[q].insert(pos, j)
    if inst.own[q]:
        yield base
        return
    slots = list(_encode_slots(inst, base, q, pos))
    if len(slots) > 3:  # the earliest, the latest and one between
        slots = [slots[0], slots[-1], rng.choice(slots[1:-1])]
    for s in slots:
        out = _copy(base)
        out[inst.encoder[q]].insert(s, ~j)
        yield out


def _moves(inst: Instance, seqs: Sequences, finish: list[float], rng: random.Random) -> Iterator[Sequences]:
    """Candidate neighbours of ``seqs``: work taken off the pool that finishes last (and off its encoder)."""
    where = _clip_pools(inst, seqs)
    order = sorted(range(inst.pools), key=lambda p: -finish[p])
    late = order[0]
    focus = {late} | ({inst.encoder[late]} if not inst.own[late] else set())
    clips = [j for j in where if where[j][0] in focus]
    others = [j for j in where if where[j][0] not in focus]
    rng.shuffle(clips)
    rng.shuffle(others)
    for j in clips:
        p, i = where[j]
        rest = _copy(seqs)
        _remove(inst, rest, j, p)
        for q in order[::-1]:
            if q == p:
                continue
            length = len(rest[q])
            for pos in sorted({length, max(length - 1, 0), 0, rng.randint(0, length)}, reverse=True):
                yield from _insertions(inst, rest, j, q, pos, rng)
        for k in others:  # swap with a clip of another pool, of another kind
            if inst.kind[k] != inst.kind[j]:
                yield _swapped(seqs, j, k)
        length = len(rest[p])  # reorder within the pool: to the end, to the front, one step either way
        for pos in sorted({0, length, max(i - 1, 0), min(i + 1, length)} - {i}):
            yield from _insertions(inst, rest, j, p, pos, rng)
    for b in inst.borrowers:  # shift each borrowed encode one place in its encoder's list
        e = inst.encoder[b]
        for i, item in enumerate(seqs[e]):
            if item < 0:
                for k in (i - 1, i + 1):
                    if 0 <= k < len(seqs[e]) and seqs[e][k] >= 0:
                        out = _copy(seqs)
                        out[e][i], out[e][k] = out[e][k], out[e][i]
                        yield out


def _swapped(seqs: Sequences, a: int, b: int) -> Sequences:
    swap = {a: b, b: a, ~a: ~b, ~b: ~a}
    return [[swap.get(item, item) for item in seq] for seq in seqs]


def _perturb(inst: Instance, seqs: Sequences, rng: random.Random, strength: int) -> Sequences:
    out = _copy(seqs)
    for _ in range(strength):
        where = _clip_pools(inst, out)
        a, b = rng.sample(sorted(where), 2) if len(where) > 1 else (None, None)
        if a is None or b is None:
            break
        out = _swapped(out, a, b)
    return out


def _random_move(
    inst: Instance, seqs: Sequences, where: dict[int, tuple[int, int]], finish: list[float], rng: random.Random
) -> Sequences | None:
    """One random neighbour: relocate a clip (half the time one of the pool that finishes last), swap two, or
    shift a borrowed encode. ``where``: each clip's pool and place in ``seqs`` (kept by the caller)."""
    clips = list(where)
    r = rng.random()
    if r < 0.45:
        late = max(range(inst.pools), key=lambda p: finish[p])
        pick = [j for j in clips if where[j][0] == late] if rng.random() < 0.5 else clips
        j = rng.choice(pick or clips)
        p = where[j][0]
        rest = _copy(seqs)
        _remove(inst, rest, j, p)
        q = rng.randrange(inst.pools)
        options = list(_insertions(inst, rest, j, q, rng.randint(0, len(rest[q])), rng))
        return rng.choice(options) if options else None
    if r < 0.9 and len(clips) > 1:
        a, b = rng.sample(clips, 2)
        return _swapped(seqs, a, b) if inst.kind[a] != inst.kind[b] or where[a][0] == where[b][0] else None
    if not inst.borrowers:
        return None
    e = inst.encoder[rng.choice(inst.borrowers)]
    lent = [i for i, item in enumerate(seqs[e]) if item < 0]
    if not lent:
        return None
    i = rng.choice(lent)
    k = i + rng.choice((-1, 1))
    if not 0 <= k < len(seqs[e]):
        return None
    out = _copy(seqs)
    out[e][i], out[e][k] = out[e][k], out[e][i]
    return out


def late_acceptance(
    inst: Instance, seqs: Sequences, *, seconds: float, max_evals: int, seed: int = 0, history: int = 200
) -> tuple[Sequences, Key]:
    """Late-acceptance hill climbing over random moves: a candidate is taken if it is no worse than the
    current sequences or than the makespan ``history`` steps ago (it walks out of local optima)."""
    if fastseq.AVAILABLE:  # the same search in C
        found, _ = fastseq.late_acceptance(inst, seqs, seconds=seconds, max_evals=max_evals, seed=seed, history=history)
        found_key = key_of(inst, found)
        assert found_key is not None
        return found, found_key
    rng = random.Random(seed)
    deadline = time.perf_counter() + seconds
    current = _copy(seqs)
    current_key = key_of(inst, current)
    if current_key is None:
        raise ValueError("the starting sequences deadlock")
    best, best_key = current, current_key
    past = [current_key[0]] * history
    finish, where = _finish(inst, current), _clip_pools(inst, current)
    for step in range(max_evals):
        if step % 64 == 0 and time.perf_counter() >= deadline:
            break
        cand = _random_move(inst, current, where, finish, rng)
        if cand is None:
            continue
        slot = step % history
        timed = _timed(inst, cand, max(past[slot], current_key[0]) + EPS)  # None: deadlocks or cannot be taken
        if timed is not None and (timed[0][0] <= past[slot] or timed[0] <= current_key):
            current, (current_key, finish) = cand, timed
            where = _clip_pools(inst, current)
            if current_key < best_key:
                best, best_key = cand, current_key
        if current_key[0] < past[slot]:
            past[slot] = current_key[0]
    return best, best_key


def _finish(inst: Instance, seqs: Sequences) -> list[float]:
    done = evaluate(inst, seqs)
    assert done is not None
    return done[1].finish


def descend(inst: Instance, seqs: Sequences, *, seconds: float, max_evals: int, seed: int = 0) -> tuple[Sequences, Key]:
    """First-improvement descent over the systematic neighbourhood (:func:`_moves`) to a local optimum."""
    rng = random.Random(seed)
    deadline = time.perf_counter() + seconds
    current = _copy(seqs)
    current_key = key_of(inst, current)
    if current_key is None:
        raise ValueError("the starting sequences deadlock")
    evals = 0
    improved = True
    while improved and evals < max_evals and time.perf_counter() < deadline:
        improved = False
        for cand in _moves(inst, current, _finish(inst, current), rng):
            evals += 1
            k = key_of(inst, cand, current_key[0] + EPS)
            if k is not None and k < current_key:
                current, current_key, improved = cand, k, True
                break
            if evals >= max_evals or (evals % 64 == 0 and time.perf_counter() >= deadline):
                break
    return current, current_key


def improve(
    inst: Instance, seqs: Sequences, *, seconds: float = 0.5, max_evals: int | None = None, seed: int = 0
) -> tuple[Sequences, float]:
    """Better sequences than ``seqs`` (or ``seqs`` itself) and their makespan: rounds of late acceptance and a
    descent to the nearest local optimum, each later round started from the best so far perturbed by a few random
    swaps (iterated local search: late acceptance alone never takes a longer makespan, so it cannot leave a deep
    local optimum)."""
    if inst.n < 2:
        return seqs, key_of(inst, seqs)[0]  # type: ignore[index]
    rng = random.Random(seed)
    deadline = time.perf_counter() + seconds
    best, best_key = seqs, key_of(inst, seqs)
    assert best_key is not None
    current = seqs
    left = max_evals if max_evals is not None else (C_EVALS if fastseq.AVAILABLE else PYTHON_EVALS)
    for round_ in range(1_000_000):
        now = time.perf_counter()
        if left <= 0 or now >= deadline:
            break
        budget = left // 2 if round_ == 0 else min(left, max(left // 4, 400))
        span = (deadline - now) * (0.5 if round_ == 0 else 0.25)
        wide, _ = late_acceptance(inst, current, seconds=0.75 * span, max_evals=int(0.75 * budget), seed=seed + round_)
        local, key = descend(inst, wide, seconds=0.25 * span, max_evals=budget // 4, seed=seed + round_)
        left -= budget
        if key < best_key:
            best, best_key = local, key
        for _ in range(8):  # a perturbation that deadlocks is drawn again
            current = _perturb(inst, best, rng, 2 + round_ % 3)
            if key_of(inst, current) is not None:
                break
        else:
            current = best
    return best, best_key[0]
