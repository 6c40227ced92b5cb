"""Dispatch policies: which sampler pool takes a clip. The live dispatcher calls these too.

A policy sees a :class:`State` — when each resource is next free, *relative to now*
(0 or less: free now), which pools are gone or full (no free slot), and measured
durations that override the profile — and names a pool, or ``None`` to wait for a slot.
The simulator builds the same state from its own projections.

- :class:`RoundRobin` is the design's: pools take clips in turn, in batch order.
- :class:`EarliestFinish` projects each clip through every pool (its encoder pool, the
  link, the decoder queue) and picks the one whose video would be finished first (it
  waits for a full pool when that pool would still finish first); it dispatches the
  batch longest-first so short clips fill the gaps at the end.
- :class:`FollowPlan` starts from a plan (the solver's schedule: its pool per clip) and
  adapts online — dead pools, durations measured so far — through earliest-finish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from h3flow.core.errors import ConfigError
from h3flow.planner.schedule import Schedule
from h3flow.planner.timing import ClipLike, Measured, Planner

C = TypeVar("C", bound=ClipLike)


@dataclass
class State:
    """What a policy knows at a decision: resource -> seconds until free, gone/full pools, measurements."""

    busy_until: Mapping[str, float] = field(default_factory=dict)
    gone: frozenset[str] | set[str] = frozenset()
    full: frozenset[str] | set[str] = frozenset()
    measured: Measured = field(default_factory=dict)
    encode_free: Mapping[str, float] = field(default_factory=dict)
    """Seconds until an encoder pool could start a borrowed encode (it serves those first);
    defaults to its ``busy_until``."""

    def free_in(self, resource: str) -> float:
        return max(0.0, self.busy_until.get(resource, 0.0))

    def encode_in(self, encoder: str) -> float:
        return max(0.0, self.encode_free.get(encoder, self.busy_until.get(encoder, 0.0)))


class Policy(Protocol):
    name: str

    def reset(self) -> None:
        """Forget earlier decisions (a new batch starts)."""

    def order(self, clips: Sequence[C]) -> list[C]:
        """The order clips are dispatched in."""

    def choose_pool(self, clip: ClipLike, state: State) -> str | None:
        """The sampler pool that takes ``clip`` now, or None to wait until a pool has a free slot."""


def _live(planner: Planner, state: State) -> list[str]:
    if not state.gone:
        return [p.name for p in planner.resources.samplers]
    pools = [p.name for p in planner.resources.samplers if p.name not in state.gone and p.encoder not in state.gone]
    if not pools:
        raise ConfigError("every sampler pool is gone: nothing can sample")
    return pools


class RoundRobin:
    """The design's policy: pools take clips in turn (batch order); one FIFO decode queue."""

    name = "design"
    needs_state = False  # it only looks at which pools are full or gone

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self._turn = 0

    def reset(self) -> None:
        self._turn = 0

    def order(self, clips: Sequence[C]) -> list[C]:
        return list(clips)

    def choose_pool(self, clip: ClipLike, state: State) -> str | None:
        pools = [p.name for p in self.planner.resources.samplers]
        live = set(_live(self.planner, state))
        while pools[self._turn % len(pools)] not in live:
            self._turn += 1
        name = pools[self._turn % len(pools)]
        if name in state.full:
            return None  # its turn, but its slots are taken: the batch waits (strict turns)
        self._turn += 1
        return name


@dataclass(frozen=True, slots=True)
class Projection:
    """Where a clip would go and when its stages would end, if sent to ``pool`` now."""

    pool: str
    encoded: float
    handed_off: float
    decoder: str
    link: str
    arrived: float
    finished: float


def project(planner: Planner, clip: ClipLike, pool_name: str, state: State) -> Projection:
    """Follow ``clip`` through ``pool_name``: encoder pool, pool, link, the decoder that finishes it first."""
    pool = planner.resources.pool(pool_name)
    busy, gone = state.busy_until, state.gone
    t, routes = planner.routes(clip, pool, state.measured)
    if pool.encoder == pool_name:
        encoded = max(0.0, busy.get(pool_name, 0.0)) + t.encode + t.offload
        handed = encoded + t.sample + t.handoff
    else:
        encoded = state.encode_in(pool.encoder) + t.encode + t.offload
        handed = max(busy.get(pool_name, 0.0), encoded) + t.sample + t.handoff
    best: tuple[float, float, str, str] | None = None
    for dec, link, transfer, decode in routes:
        if dec in gone:
            continue
        arrived = max(handed, busy.get(link, 0.0)) + transfer
        finished = max(arrived, busy.get(dec, 0.0)) + decode
        if best is None or finished < best[0]:
            best = (finished, arrived, dec, link)
    if best is None:
        raise ConfigError("every decoder is gone: nothing can decode")
    return Projection(pool_name, encoded, handed, best[2], best[3], best[1], best[0])


class EarliestFinish:
    """Send each clip where its video would be finished first (then: sampled first), longest clips first."""

    name = "earliest-finish"

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.projections: dict[str, Projection] = {}  # the last decision's, per pool

    def reset(self) -> None:
        self.projections = {}

    def order(self, clips: Sequence[C]) -> list[C]:
        fastest = self.planner.resources.samplers
        work = {(c.spec, c.frames): min(self.planner.sampler_times(c, p).total for p in fastest) for c in clips}
        return sorted(clips, key=lambda c: -work[(c.spec, c.frames)])

    def choose_pool(self, clip: ClipLike, state: State) -> str | None:
        best: tuple[float, float, int] | None = None
        choice = None
        self.projections = {}
        for i, name in enumerate(_live(self.planner, state)):
            p = self.projections[name] = project(self.planner, clip, name, state)
            key = (round(p.finished, 9), round(p.handed_off, 9), i)
            if best is None or key < best:
                best, choice = key, name
        # a full pool that would still finish first is worth waiting for
        return None if choice in state.full else choice


class FollowPlan:
    """Start from a plan (the solver's schedule) and adapt online.

    Each clip goes to the pool the plan gave it, and waits for a free slot there, unless
    the live state breaks the plan's assumptions: a clip whose planned pool (or its
    encoder pool) is gone, that comes back for another attempt, or whose planned pool
    was measured more than ``slack`` slower, relative to the plan, than another pool,
    goes where earliest-finish sends it (with the measured durations). Clips are
    dispatched in the plan's order of sampling starts.
    """

    name = "plan"

    def __init__(self, planner: Planner, pool_of: Mapping[str, str], starts: Mapping[str, float], slack: float = 0.1):
        self.planner = planner
        self.pool_of = dict(pool_of)
        self.starts = dict(starts)
        self.slack = slack
        self.fallback = EarliestFinish(planner)
        self.sent: set[str] = set()

    @classmethod
    def of(cls, planner: Planner, schedule: Schedule, slack: float = 0.1) -> FollowPlan:
        starts = {r.clip: r.start for r in schedule.runs if r.stage == "sample"}
        return cls(planner, schedule.pool_of, starts, slack)

    def reset(self) -> None:
        self.sent = set()
        self.fallback.reset()

    def order(self, clips: Sequence[C]) -> list[C]:
        return sorted(clips, key=lambda c: self.starts.get(c.id, float("inf")))

    def _slower_than_planned(self, pool: str, clip: ClipLike, state: State) -> bool:
        """The pool's measured time against the plan's is more than ``slack`` worse than the best pool's
        (a ratio, so overheads every pool pays alike — process start-up, the API — do not count)."""

        def ratio(name: str) -> float | None:
            seen = state.measured.get((name, "sample", clip.spec))
            if seen is None:
                return None
            t = self.planner.sampler_times(clip, self.planner.resources.pool(name))
            return seen / t.total

        mine = ratio(pool)
        others = [r for p in self.planner.resources.samplers if p.name != pool and (r := ratio(p.name)) is not None]
        return mine is not None and bool(others) and mine > min(others) * (1 + self.slack)

    def choose_pool(self, clip: ClipLike, state: State) -> str | None:
        planned = self.pool_of.get(clip.id)
        usable = planned is not None and planned in set(_live(self.planner, state))
        again = clip.id in self.sent
        if not usable or again or self._slower_than_planned(planned, clip, state):  # type: ignore[arg-type]
            self.sent.add(clip.id)
            return self.fallback.choose_pool(clip, state)
        if planned in state.full:
            return None  # it waits for its planned pool
        self.sent.add(clip.id)
        return planned
