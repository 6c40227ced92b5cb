"""Sequences for clips already assigned to pools, keeping borrowers fed.

A pool that encodes for itself cannot encode for a borrower while it runs one of its own
clips (encode to handoff, one block), and a borrower holds at most ``AHEAD`` encoded
clips: an own block longer than the borrower's clips in hand starves it. So an encoder
pool here picks its next own clip by what fits before the next borrowed encode is due
(the longest that fits), serves borrowed encodes as soon as their slot frees (most
starved borrower first), and — when nothing fits — waits for the slot or runs its
shortest clip, whichever projects the earlier finish (its own remaining work against
each borrower's, the most urgent one starved by the overrun). Borrowers sample their clips longest first
(long clips leave the encoder long gaps), pools that lend nothing run longest first.
"""

from __future__ import annotations

from h3flow.planner.instance import Instance
from h3flow.planner.sequence import AHEAD, Sequences


def fed(inst: Instance, lists: list[list[int]]) -> Sequences:
    """Sequences giving pool ``p`` the clips ``lists[p]`` (any order): see the module's docstring."""
    seqs: Sequences = [_longest_first(inst, lst, p) for p, lst in enumerate(lists)]
    for e in range(inst.pools):
        borrowers = [b for b in inst.borrowers if inst.encoder[b] == e and seqs[b]]
        if borrowers:
            seqs[e] = _interleave(inst, e, seqs[e], {b: seqs[b] for b in borrowers})
    return seqs


def _longest_first(inst: Instance, clips: list[int], p: int) -> list[int]:
    return sorted(clips, key=lambda j: (-inst.held(j, p), j))


def _interleave(inst: Instance, e: int, own: list[int], lent: dict[int, list[int]]) -> list[int]:
    """Encoder pool ``e``'s work: its own clips and the encodes it lends, in the order it does them."""
    own = list(own)
    nxt = dict.fromkeys(lent, 0)
    handed: dict[int, list[float]] = {b: [] for b in lent}
    free = dict.fromkeys(lent, 0.0)  # when each borrower has sampled what it holds
    out: list[int] = []
    t = 0.0

    def gate(b: int) -> float:
        k = nxt[b]
        return 0.0 if k < AHEAD else handed[b][k - AHEAD]

    def remaining_encodes() -> float:
        return sum(inst.prep[i][b] for b in lent for i in lent[b][nxt[b] :])

    def due(b: int) -> float:
        """The latest start of b's next encode that keeps b sampling."""
        return free[b] - inst.prep[lent[b][nxt[b]]][b]

    while True:
        pending = [b for b in lent if nxt[b] < len(lent[b])]
        ready = [b for b in pending if gate(b) <= t + 1e-9]
        if ready:
            b = min(ready, key=lambda b: (due(b), b))
            j = lent[b][nxt[b]]
            out.append(~j)
            t += inst.prep[j][b]
            start = max(t, free[b])
            free[b] = start + inst.work[j][b]
            handed[b].append(free[b])
            nxt[b] += 1
            continue
        if not own:
            if not pending:
                break
            t = min(gate(b) for b in pending)
            continue
        if not pending:
            out.extend(own)
            break
        slack = min(due(b) for b in pending) - t
        fits = [j for j in own if inst.held(j, e) <= slack + 1e-9]
        if fits:
            j = max(fits, key=lambda j: (inst.held(j, e), -j))
        else:
            j = min(own, key=lambda j: (inst.held(j, e), j))
            opens = min(gate(b) for b in pending)
            # project both choices to the end: waiting idles the encoder pool, running the block starves the
            # most urgent borrower for as long as it overruns; keep whichever projects the earlier finish
            work = sum(inst.held(i, e) for i in own) + remaining_encodes()
            ends = {b: free[b] + sum(inst.work[i][b] for i in lent[b][nxt[b] :]) for b in pending}
            urgent = min(pending, key=due)
            starved = dict(ends)
            starved[urgent] += inst.held(j, e) - (due(urgent) - t)
            if max(opens + work, *ends.values()) <= max(t + work, *starved.values()):
                t = opens
                continue
        own.remove(j)
        out.append(j)
        t += inst.held(j, e)
    return out
