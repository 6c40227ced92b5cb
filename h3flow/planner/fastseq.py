"""The local search's inner loop in C (``_fastseq.c``), when it was compiled; Python otherwise.

The C core times sequences exactly as :func:`~h3flow.planner.sequence.evaluate` does (the
same additions in the same order: equal to the last bit) and runs the late-acceptance
search of :mod:`~h3flow.planner.improve` with the same moves, 10-40× more evaluations per
second, without Python's lock. ``pip install`` compiles it where a C compiler and Python's
headers exist (``setup.py``: optional); ``AVAILABLE`` says whether it did, and ``h3flow
plan`` runs either way (the Python search makes fewer evaluations in the same time).
"""

from __future__ import annotations

from typing import Any

from h3flow.planner.instance import Instance
from h3flow.planner.sequence import AHEAD, Sequences

try:
    from h3flow.planner import _fastseq  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - where no C compiler was found at install time
    _fastseq = None

AVAILABLE = _fastseq is not None


def tables(inst: Instance) -> Any:
    """The instance's durations as C arrays, built once per instance."""
    cached = inst.__dict__.get("_fastseq_tables")
    if cached is None:
        assert _fastseq is not None
        n, pools = inst.n, inst.pools
        links = len(inst.transfer[0])
        decoders = len(inst.decode[0])
        cached = _fastseq.tables(
            n,
            pools,
            links,
            decoders,
            AHEAD,
            inst.encoder,
            [int(o) for o in inst.own],
            inst.kind,
            [d for p in range(pools) for d, _ in inst.routes[p]],
            [lk for p in range(pools) for _, lk in inst.routes[p]],
            [x for row in inst.prep for x in row],
            [x for row in inst.work for x in row],
            [x for row in inst.tail for x in row],
            [x for row in inst.transfer for x in row],
            [x for row in inst.decode for x in row],
        )
        object.__setattr__(inst, "_fastseq_tables", cached)
    return cached


def evaluate(inst: Instance, seqs: Sequences, cutoff: float) -> tuple[float, list[float]] | None:
    """The makespan and each pool's finish time, or None (deadlock, or cut off as the Python timing cuts)."""
    assert _fastseq is not None
    return _fastseq.evaluate(tables(inst), seqs, cutoff)


def late_acceptance(
    inst: Instance, seqs: Sequences, *, seconds: float, max_evals: int, seed: int, history: int
) -> tuple[Sequences, int]:
    """The best sequences met, and how many candidates were timed."""
    assert _fastseq is not None
    return _fastseq.late_acceptance(tables(inst), seqs, seconds, max_evals, seed, history)
