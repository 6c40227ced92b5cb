"""A clip's lifecycle: its states and the one function that moves it between them.

Every change of a clip's state — the dispatcher collecting a child, a pool lost, a
retry, a cancelled run, ``resume`` continuing from what the hosts hold — goes through
:func:`move`, which refuses a transition the table does not list. So a path that would
strand a clip (say, "delivered" back to "sampling" without a resume) is a loud error
where it happens, not a run that never ends.
"""

from __future__ import annotations

from typing import Literal, Protocol, TypeVar

from h3flow.core.errors import H3FlowError

ClipState = Literal["pending", "sampling", "sampled", "decoding", "delivered", "failed", "cancelled"]
CLIP_STATES: tuple[ClipState, ...] = ("pending", "sampling", "sampled", "decoding", "delivered", "failed", "cancelled")
FINAL: frozenset[ClipState] = frozenset({"delivered", "failed", "cancelled"})
"""States a run's dispatcher never moves a clip out of (only ``resume`` does)."""

RESUMED: frozenset[ClipState] = frozenset({"pending", "sampled"})
"""Where ``resume`` may restart any clip from: sample again, or decode the latent its decoder holds."""

ALLOWED: dict[ClipState, frozenset[ClipState]] = {
    "pending": frozenset({"sampling", "cancelled", "sampled"}),  # sampled: resume found its latent
    "sampling": frozenset({"sampled", "pending", "failed", "cancelled"}),  # pending: re-sent (crash, pool lost)
    "sampled": frozenset({"decoding", "pending", "cancelled"}),  # pending: its latent is gone (resume)
    "decoding": frozenset({"delivered", "sampled", "pending", "failed", "cancelled"}),  # pending: re-transfer
    "delivered": RESUMED,  # resume found the MP4 missing or damaged
    "failed": RESUMED,
    "cancelled": RESUMED,
}
"""From each state, the states a clip may move to (staying where it is is always allowed)."""


class IllegalTransition(H3FlowError):
    """A clip asked to move where its lifecycle does not go: a defect, never an operator's error."""


class HasState(Protocol):
    state: ClipState


R = TypeVar("R", bound=HasState)


def can_move(current: ClipState, to: ClipState) -> bool:
    return to == current or to in ALLOWED[current]


def move(record: R, to: ClipState, clip_id: str = "?") -> R:
    """Set ``record.state`` to ``to`` if the lifecycle allows it; raise otherwise."""
    if not can_move(record.state, to):
        raise IllegalTransition(f"clip {clip_id}: {record.state} -> {to} is not a transition of its lifecycle")
    record.state = to
    return record
