"""A clip's lifecycle: every pair of states, allowed or refused exactly as the table says."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from h3flow.pipeline.lifecycle import ALLOWED, CLIP_STATES, FINAL, RESUMED, ClipState, IllegalTransition, move

EXPECTED: set[tuple[ClipState, ClipState]] = {
    ("pending", "sampling"),  # submitted to a sampler pool
    ("pending", "cancelled"),  # the run was cancelled
    ("pending", "sampled"),  # resume: its decoder holds its latent
    ("sampling", "sampled"),  # its sample run completed
    ("sampling", "pending"),  # crashed, vanished, withdrawn from a pool that is not ready: sent again
    ("sampling", "failed"),
    ("sampling", "cancelled"),
    ("sampled", "decoding"),  # submitted to its decoder
    ("sampled", "pending"),  # resume: its latent is gone
    ("sampled", "cancelled"),
    ("decoding", "delivered"),
    ("decoding", "sampled"),  # the decode run crashed: decode again
    ("decoding", "pending"),  # the latent was damaged on the decoder: sample (cached) and send again
    ("decoding", "failed"),
    ("decoding", "cancelled"),
    *((final, to) for final in FINAL for to in RESUMED),  # resume, from what the hosts hold
}


@dataclass
class Rec:
    state: ClipState


def test_the_table_is_exactly_the_lifecycle() -> None:
    table = {(a, b) for a, targets in ALLOWED.items() for b in targets}
    assert table == EXPECTED
    assert set(ALLOWED) == set(CLIP_STATES)


@pytest.mark.parametrize(("current", "to"), list(itertools.product(CLIP_STATES, CLIP_STATES)))
def test_every_pair_of_states(current: ClipState, to: ClipState) -> None:
    rec = Rec(current)
    if current == to or (current, to) in EXPECTED:
        assert move(rec, to, "c0").state == to
    else:
        with pytest.raises(IllegalTransition, match=f"clip c0: {current} -> {to}"):
            move(rec, to, "c0")
        assert rec.state == current, "a refused move changes nothing"


def test_a_final_clip_leaves_only_through_resume() -> None:
    for final in FINAL:
        assert ALLOWED[final] == RESUMED
