"""Dispatch policies: which sampler pool takes a clip. The live dispatcher calls these too.

A policy sees a :class:`State` — when each resource is next free, *relative to now*
(0 or less: free now), which pools are gone, and measured durations that override the
profile — and names a pool. The simulator builds the same state from its bookings.

- :class:`RoundRobin` is the design's: pools take clips in turn, in batch order.
- :class:`EarliestFinish` projects each clip through every pool (its encoder pool, the
  link, the decoder queue) and picks the one whose video would be finished first;
  it dispatches the batch longest-first so short clips fill the gaps at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from h3flow.errors import ConfigError
from h3flow.planner.timing import ClipLike, Measured, Planner

C = TypeVar("C", bound=ClipLike)


@dataclass
class State:
    """What a policy knows at a decision: resource -> seconds until free, gone pools, measurements."""

    busy_until: Mapping[str, float] = field(default_factory=dict)
    gone: frozenset[str] | set[str] = frozenset()
    measured: Measured = field(default_factory=dict)

    def free_in(self, resource: str) -> float:
        return max(0.0, self.busy_until.get(resource, 0.0))


class Policy(Protocol):
    name: str

    def reset(self) -> None:
        """Forget earlier decisions (a new batch starts)."""

    def order(self, clips: Sequence[C]) -> list[C]:
        """The order clips are dispatched in."""

    def choose_pool(self, clip: ClipLike, state: State) -> str:
        """The sampler pool that takes ``clip``."""


def _live(planner: Planner, state: State) -> list[str]:
    pools = [p.name for p in planner.resources.samplers if p.name not in state.gone and p.encoder not in state.gone]
    if not pools:
        raise ConfigError("every sampler pool is gone: nothing can sample")
    return pools


class RoundRobin:
    """The design's policy: pools take clips in turn (batch order); one FIFO decode queue."""

    name = "design"

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self._turn = 0

    def reset(self) -> None:
        self._turn = 0

    def order(self, clips: Sequence[C]) -> list[C]:
        return list(clips)

    def choose_pool(self, clip: ClipLike, state: State) -> str:
        pools = [p.name for p in self.planner.resources.samplers]
        live = set(_live(self.planner, state))
        while True:
            name = pools[self._turn % len(pools)]
            self._turn += 1
            if name in live:
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
    res = planner.resources
    pool = res.pool(pool_name)
    t = planner.sampler_times(clip, pool, state.measured)
    start = state.free_in(pool.encoder)
    encoded = start + t.encode + t.offload
    if pool.encoder == pool.name:
        handed = encoded + t.sample + t.handoff
    else:
        handed = max(state.free_in(pool.name), encoded) + t.sample + t.handoff
    best: Projection | None = None
    for dec in res.decoders:
        if dec.name in state.gone:
            continue
        link = res.link(pool.host, dec.host)
        arrived = max(handed, state.free_in(link.name)) + planner.transfer_time(clip, link, state.measured)
        decode, mux = planner.decoder_times(clip, dec, state.measured)
        finished = max(arrived, state.free_in(dec.name)) + decode + mux
        if best is None or finished < best.finished:
            best = Projection(pool.name, encoded, handed, dec.name, link.name, arrived, finished)
    if best is None:
        raise ConfigError("every decoder is gone: nothing can decode")
    return best


class EarliestFinish:
    """Send each clip where its video would be finished first (then: sampled first), longest clips first."""

    name = "earliest-finish"

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def reset(self) -> None:
        pass

    def order(self, clips: Sequence[C]) -> list[C]:
        fastest = self.planner.resources.samplers
        work = {
            (c.spec, c.frames): min(self.planner.sampler_times(c, p).total for p in fastest) for c in clips
        }
        return sorted(clips, key=lambda c: -work[(c.spec, c.frames)])

    def choose_pool(self, clip: ClipLike, state: State) -> str:
        best: tuple[float, float, int] | None = None
        choice = ""
        for i, name in enumerate(_live(self.planner, state)):
            p = project(self.planner, clip, name, state)
            key = (round(p.finished, 9), round(p.handed_off, 9), i)
            if best is None or key < best:
                best, choice = key, name
        return choice


POLICIES = {"design": RoundRobin, "earliest-finish": EarliestFinish}


def make_policy(name: str, planner: Planner) -> Policy:
    try:
        return POLICIES[name](planner)
    except KeyError:
        raise ConfigError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
