"""How many clips of each kind each pool takes, searched on real schedules.

The load relaxation balances work but cannot see how an encoder pool's own clips and the
encodes it lends fit together, so several of its optima sequence badly. Here each set of
counts is turned into sequences two ways (keeping borrowers fed,
:func:`~h3flow.planner.feed.fed`, and longest first) and the better is timed in full;
a hill climb moves one clip of a kind between two pools, or exchanges clips of two
kinds, while that shortens the schedule (ties: the pools' finish times, largest first).
"""

from __future__ import annotations

import math
import random
import time

from h3flow.planner.feed import fed
from h3flow.planner.improve import Key, key_of
from h3flow.planner.instance import Instance
from h3flow.planner.sequence import Sequences, from_counts

Counts = list[list[int]]


def lists_of(inst: Instance, counts: Counts) -> list[list[int]]:
    """Clips for each pool: ``counts[p][k]`` clips of kind ``k`` (in batch order)."""
    by_kind: dict[int, list[int]] = {}
    for j, k in enumerate(inst.kind):
        by_kind.setdefault(k, []).append(j)
    lists: list[list[int]] = [[] for _ in range(inst.pools)]
    for k, members in by_kind.items():
        it = iter(members)
        for p in range(inst.pools):
            lists[p].extend(next(it) for _ in range(counts[p][k]))
    return lists


def timed(inst: Instance, counts: Counts) -> tuple[Key, Sequences]:
    """The better sequences for ``counts`` — keeping borrowers fed, or longest first with each borrowed encode
    as early as it may go (neither wins everywhere) — and their key (makespan, then pool finish times, largest
    first)."""
    options = (fed(inst, lists_of(inst, counts)), from_counts(inst, counts))
    keyed = [(key, seqs) for seqs in options if (key := key_of(inst, seqs)) is not None]
    return min(keyed, key=lambda kv: kv[0]) if keyed else ((math.inf,), options[0])  # these orders never deadlock


def climb(inst: Instance, counts: Counts, *, deadline: float, seed: int = 0) -> tuple[Key, Counts, Sequences]:
    """First-improvement hill climb on the counts until no move helps or the deadline passes."""
    rng = random.Random(seed)
    best = [list(row) for row in counts]
    key, seqs = timed(inst, best)
    kinds = range(len(best[0]))
    pools = range(inst.pools)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        moves: list[tuple[tuple[int, int, int], ...]] = []
        for p in pools:
            for q in pools:
                if p == q:
                    continue
                for k in kinds:
                    if best[p][k]:
                        moves.append(((p, q, k),))
                        moves += [((p, q, k), (q, p, k2)) for k2 in kinds if k2 != k and best[q][k2] and p < q]
        rng.shuffle(moves)
        for move in moves:
            if time.perf_counter() >= deadline:
                break
            for p, q, k in move:
                best[p][k] -= 1
                best[q][k] += 1
            k2, s2 = timed(inst, best)
            if k2 < key:
                key, seqs, improved = k2, s2, True
                break
            for p, q, k in move:
                best[p][k] += 1
                best[q][k] -= 1
    return key, best, seqs
