"""What one extra host adds: at the batch size, over batch sizes of the same mix, and in steady state.

A gain compares the best topology *with* the host against the best *without* it (each
the best of its group at that size, not the two that happen to win the asked batch).
Every figure says what it rests on:

- from the best schedules found: ``with / without - 1`` of their clips/h;
- proven: the same ratio with the proven bounds on the wrong sides — the gain is at
  least ``min bound without / best makespan with - 1`` and at most
  ``best makespan without / min bound with - 1``, whatever the true optima are;
- in steady state: the ratio of the throughput bounds (the linear programs a long batch
  of the mix approaches) — bounds both, so a guide rather than a proof.

The batch sizes from which the host adds at least the threshold are found by scanning
sizes from the largest down (1-16, 20, 24, 32, 40, 48 clips: the batch's clips in turn),
once on the best schedules found and once proven. Each scanned size gets the heuristics
and the cheap whole-clip starts (:meth:`~h3flow.planner.best.Search.starts`, milliseconds)
whatever the time; sizes where the found and the proven gain disagree about the threshold
are searched further while the time lasts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from h3flow.planner.best import Search
from h3flow.planner.bounds import lower_bound, quick_bound
from h3flow.planner.timing import PlanClip, Planner

SIZES = (*range(1, 17), 20, 24, 32, 40, 48)  # batch sizes scanned for "pays off from n clips"
LEADERS = 1  # topologies per side planned at each scanned size: the fastest at the batch size (+ in steady state)
REFINE_SLICE = 0.05  # seconds of search per ambiguous size and side


@dataclass(frozen=True)
class Side:
    """One side of a comparison at one batch size: its best schedule and the lowest proven bound."""

    name: str  # the topology with the best schedule
    makespan: float
    bound: float  # the smallest proven bound over the side's topologies: no topology of it is faster

    @property
    def exact(self) -> bool:
        return self.makespan <= self.bound * (1 + 1e-9)


@dataclass(frozen=True)
class Gain:
    clips: int
    with_: Side
    without: Side

    @property
    def value(self) -> float:
        """From the best schedules found."""
        return self.without.makespan / self.with_.makespan - 1

    @property
    def low(self) -> float:
        """Proven: the true gain is at least this."""
        return self.without.bound / self.with_.makespan - 1

    @property
    def high(self) -> float:
        """Proven: the true gain is at most this."""
        return self.without.makespan / self.with_.bound - 1

    def as_json(self) -> dict[str, Any]:
        return {
            "clips": self.clips,
            "gain": round(self.value, 5),
            "proven_at_least": round(self.low, 5),
            "proven_at_most": round(self.high, 5),
            "with": self.with_.name,
            "without": self.without.name,
        }


@dataclass(frozen=True)
class Payoff:
    """One extra host: the gain at the asked size, from which size it pays (found and proven), in steady state."""

    host: str
    at_size: Gain
    steady_gain: float
    steady_with: str
    steady_without: str
    pays_from: int | None  # on the best schedules found: the smallest size from which every scanned size pays
    proven_from: int | None  # the same, on the proven gains
    threshold: float
    scan: tuple[Gain, ...] = field(default=())

    @property
    def with_host(self) -> str:
        return self.at_size.with_.name

    @property
    def without_host(self) -> str:
        return self.at_size.without.name

    @property
    def gain(self) -> float:
        return self.at_size.value

    def sentence(self) -> str:
        pct = f"{self.threshold:.0%}"
        g = self.at_size
        at = f"the {self.host} host adds {g.value:+.1%} at {g.clips} clips ({_basis(g)})"
        steady = f"{self.steady_gain:+.1%} in steady state (throughput bounds)"
        if self.steady_gain < self.threshold and self.pays_from is None:
            return f"{at}; never {pct}: {steady}"
        if self.pays_from is None:
            when = f">= {pct} only beyond {SIZES[-1]} clips"
        else:
            when = f">= {pct} from {self.pays_from} clips on the best schedules found"
            if self.proven_from == self.pays_from:
                when += " (proven)"
            elif self.proven_from is not None:
                when += f", proven from {self.proven_from}"
            else:
                when += f", not proven up to {SIZES[-1]} clips"
        return f"{at}; {when}; {steady}"

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "with": self.with_host,
            "without": self.without_host,
            "clips": self.at_size.clips,
            "gain": round(self.gain, 5),
            "gain_proven_at_least": round(self.at_size.low, 5),
            "gain_proven_at_most": round(self.at_size.high, 5),
            "steady_state_gain": round(self.steady_gain, 5),
            "steady_state_basis": f"throughput bounds of {self.steady_with} and {self.steady_without}",
            "pays_off_from_clips": self.pays_from,
            "pays_off_from_clips_proven": self.proven_from,
            "scan": [g.as_json() for g in sorted(self.scan, key=lambda g: g.clips)],
        }


def _basis(g: Gain) -> str:
    if g.with_.exact and g.without.exact:
        return "both proven optimal"
    if abs(g.high - g.low) < 0.0005:
        return f"proven {g.low:+.1%}"
    return f"proven between {g.low:+.1%} and {g.high:+.1%}"


def side(searches: Sequence[tuple[str, Search]], others: Sequence[float] = ()) -> Side:
    """The best schedule of the searched topologies; the bound is the lowest over them and ``others`` (the
    analytic bounds of the side's topologies not searched at this size)."""
    name, best = min(((n, s.best) for n, s in searches), key=lambda nb: nb[1].schedule.makespan)
    return Side(name, best.schedule.makespan, min([s.best.proven for _, s in searches] + list(others)))


def resized(clips: Sequence[PlanClip], size: int) -> list[PlanClip]:
    """A batch of ``size`` clips in the same mix: the batch's clips in turn."""
    return [PlanClip(f"n{i}", clips[i % len(clips)].spec, clips[i % len(clips)].frames) for i in range(size)]


@dataclass
class Group:
    """The topologies on one side: each one's name, planner and search of the batch at the asked size."""

    members: list[tuple[str, Planner, Search]]
    steady: dict[str, float]  # name -> steady-state clips/h

    def leaders(self) -> list[tuple[str, Planner]]:
        """Planned at each scanned size: the fastest at the batch size, and the fastest in steady state."""
        by_rate = sorted(self.members, key=lambda m: m[2].best.schedule.makespan)
        by_steady = sorted(self.members, key=lambda m: -self.steady[m[0]])
        out: list[tuple[str, Planner]] = []
        for name, planner, _ in [*by_rate[:LEADERS], *by_steady[:1]]:
            if all(name != o for o, _ in out):
                out.append((name, planner))
        return out

    def at(self, batch: list[PlanClip]) -> tuple[list[tuple[str, Search]], list[float]]:
        """The leaders' searches of ``batch`` and the other members' analytic bounds."""
        leaders = self.leaders()
        names = {name for name, _ in leaders}
        searches = [(name, Search(p, batch, design=False)) for name, p in leaders]
        for _, search in searches:
            search.starts()
        floor = min(search.best.proven for _, search in searches)
        others = []
        for name, p, _ in self.members:
            if name not in names:  # the cheap bound first; the linear program only where it could be the lowest
                quick = quick_bound(p, batch)
                others.append(quick if quick >= floor else max(quick, lower_bound(p, batch, steady=False).seconds))
        return searches, others


def payoff(
    host: str, with_: Group, without: Group, clips: Sequence[PlanClip], threshold: float, deadline: float
) -> Payoff:
    """The host's gain at the batch size, scanned over sizes within ``deadline``, and in steady state."""
    n = len(clips)
    at_size = Gain(n, side([(m[0], m[2]) for m in with_.members]), side([(m[0], m[2]) for m in without.members]))
    sw = max(with_.steady, key=with_.steady.__getitem__)
    so = max(without.steady, key=without.steady.__getitem__)
    steady = with_.steady[sw] / without.steady[so] - 1 if without.steady[so] else 0.0
    gains: dict[int, Gain] = {n: at_size}
    scans: dict[int, Scan] = {}
    sizes = sorted(set(SIZES) | {n}, reverse=True)
    turn = 0
    while True:
        for size in sizes:  # from the largest down, while the found gain pays
            if size not in gains:  # the cheap pass always completes: the deadline is for searching further
                a, oa = with_.at(resized(clips, size))
                b, ob = without.at(resized(clips, size))
                scans[size] = Scan(a, oa, b, ob)
                gains[size] = scans[size].gain(size)
            if gains[size].value < threshold:
                break
        turn += 1
        if not _refine(gains, scans, threshold, deadline, turn) or time.perf_counter() >= deadline:
            break
    return Payoff(
        host,
        gains[n],
        steady,
        sw,
        so,
        _from(gains, threshold, lambda g: g.value),
        _from(gains, threshold, lambda g: g.low),
        threshold,
        tuple(gains.values()),
    )


@dataclass
class Scan:
    """One scanned size: each side's searches and the analytic bounds of the rest of it."""

    with_: list[tuple[str, Search]]
    with_others: list[float]
    without: list[tuple[str, Search]]
    without_others: list[float]

    def gain(self, size: int) -> Gain:
        return Gain(size, side(self.with_, self.with_others), side(self.without, self.without_others))


def _from(gains: dict[int, Gain], threshold: float, value: Any) -> int | None:
    """The smallest size from which every larger scanned size pays (None: not even the largest)."""
    out = None
    for size in sorted(gains, reverse=True):
        if value(gains[size]) < threshold:
            break
        out = size
    return out


def _refine(gains: dict[int, Gain], scans: dict[int, Scan], threshold: float, deadline: float, turn: int) -> bool:
    """Search further, within ``deadline``, at one size where the found and the proven gain disagree about the
    threshold — in turn the largest such size (the proof goes on from the top) and the one whose found gain is
    closest to the threshold (where the found pay-off size is decided); False when there is none."""
    open_ = [s for s, g in gains.items() if s in scans and g.low < threshold <= g.high]
    if not open_ or time.perf_counter() >= deadline:
        return False
    closest = min(open_, key=lambda s: (abs(gains[s].value - threshold), s))
    size = closest if turn % 2 else max(open_)
    scan = scans[size]
    before = gains[size]
    for _, search in scan.with_ + scan.without:
        if time.perf_counter() < deadline and not search.optimal:
            search.step(min(REFINE_SLICE, deadline - time.perf_counter()))
    gains[size] = scan.gain(size)
    if gains[size] == before:
        del scans[size]  # no progress there: leave it
    return True
