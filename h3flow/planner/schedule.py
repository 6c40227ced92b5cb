"""A schedule: per clip and stage, the resource and the start and end (seconds from the batch's start).

Every way of planning — the simulator's policies, the local search, the CP-SAT solver —
produces one; ``validate`` checks it, the Gantt chart draws it, ``--json`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from h3flow.core.contracts import PLANNER_STAGES

STAGES = PLANNER_STAGES


@dataclass(frozen=True, slots=True)
class StageRun:
    clip: str
    stage: str
    resource: str
    start: float
    end: float


@dataclass
class Schedule:
    """Per clip, per stage: (resource, start, end). Times in seconds from the batch's start."""

    topology: str
    policy: str
    clips: list[str]
    runs: list[StageRun]
    pool_of: dict[str, str] = field(default_factory=dict)
    decoder_of: dict[str, str] = field(default_factory=dict)

    @cached_property
    def makespan(self) -> float:
        return max((r.end for r in self.runs), default=0.0)

    @property
    def clips_per_hour(self) -> float:
        return len(self.clips) * 3600.0 / self.makespan if self.makespan > 0 else 0.0

    def busy(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.runs:
            out[r.resource] = out.get(r.resource, 0.0) + (r.end - r.start)
        return out

    def utilisation(self, resources: Iterable[str]) -> dict[str, float]:
        busy, span = self.busy(), self.makespan or 1.0
        return {name: busy.get(name, 0.0) / span for name in resources}

    def idle_gaps(self, resource: str) -> float:
        """Seconds ``resource`` sits idle between its first start and its last end."""
        runs = [r for r in self.runs if r.resource == resource]
        if not runs:
            return 0.0
        span = max(r.end for r in runs) - min(r.start for r in runs)
        return max(0.0, span - sum(r.end - r.start for r in runs))

    def by_clip(self) -> dict[str, list[StageRun]]:
        out: dict[str, list[StageRun]] = {c: [] for c in self.clips}
        for r in self.runs:
            out[r.clip].append(r)
        return out

    def per_clip(self) -> list[dict[str, Any]]:
        """The schedule as JSON-ready rows: per clip, its pool and decoder, and each stage's resource, start, end."""
        rows = []
        for cid, runs in self.by_clip().items():
            rows.append(
                {
                    "clip": cid,
                    "pool": self.pool_of.get(cid),
                    "decoder": self.decoder_of.get(cid),
                    "stages": {
                        r.stage: {"resource": r.resource, "start_s": round(r.start, 3), "end_s": round(r.end, 3)}
                        for r in sorted(runs, key=lambda r: STAGES.index(r.stage))
                    },
                }
            )
        return rows
