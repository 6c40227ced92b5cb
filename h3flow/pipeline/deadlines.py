"""Every stage's deadline, from the profile: a stage that runs far past what it should is stopped.

A stage's deadline is ``H3FLOW_DEADLINE_MARGIN`` (4) times what the planner's profile
expects of it on its pool (``h3flow calibrate`` refits the profile from real runs), and
never under ``H3FLOW_DEADLINE_FLOOR_S`` (120 s: a tiny clip's expected seconds are noise
next to a slow disk or a busy host). The flows give each stage's Prefect task that ``timeout_seconds``:
Prefect stops a stage that overruns (an exception raised in its thread), the flow fails
with kind ``timeout`` and the dispatcher sends the clip again. A stage whose devices the
profile does not cover gets the floor. ``status`` uses the expected figures to name a
clip that has been in flight longer than expected, and for how long.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from h3flow.config.models import LocalConfig
from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.manifest import Manifest

STAGES = ("encode", "offload", "sample", "transfer", "decode")
EXPECTED_FLOOR_S = 30.0
"""``status`` calls a clip slow only past this (a tiny clip's expected seconds are noise next to a queue)."""


@dataclass(frozen=True)
class Deadlines:
    """What each stage of one clip should take on its pools (``expected``), and may take (``limit``)."""

    expected: dict[str, float]
    limit: dict[str, float]

    def of(self, stage: str) -> float:
        return self.limit[stage]

    @property
    def offload(self) -> float:
        return self.limit["offload"]

    def expected_for(self, kind: str) -> float:
        """A whole sample-clip (``sample``) or decode-clip (``decode``) run, as expected (floored)."""
        stages = ("encode", "offload", "sample", "transfer") if kind == "sample" else ("decode",)
        return max(EXPECTED_FLOOR_S, sum(self.expected[s] for s in stages))


@functools.lru_cache(maxsize=8)
def _planner(config_json: str) -> object | None:
    from h3flow.config.models import LocalConfig
    from h3flow.planner import Planner, Resources, load_profile

    try:
        return Planner(load_profile(), Resources.from_config(LocalConfig.model_validate_json(config_json)))
    except H3FlowError:
        return None  # the profile does not cover this cluster's devices: every stage gets the floor


def deadlines(config: LocalConfig, clip: Clip, pool: str, decoder: str) -> Deadlines:
    """``clip``'s stage deadlines on sampler ``pool`` with ``decoder``."""
    from h3flow.config.settings import settings
    from h3flow.planner import Planner

    planner = _planner(config.model_dump_json())
    expected = dict.fromkeys(STAGES, 0.0)
    if isinstance(planner, Planner):
        try:
            sampler = planner.resources.pool(pool)
            times, routes = planner.routes(clip, sampler)
            expected.update(encode=times.encode, offload=times.offload, sample=times.sample + times.handoff)
            for name, _link, transfer, decode in routes:
                if name == decoder:
                    expected.update(transfer=transfer, decode=decode)
        except (H3FlowError, KeyError):
            pass  # a pool or decoder the profile cannot time: the floor

    margin, floor = settings().deadline_margin, settings().deadline_floor_s
    limit = {stage: round(max(floor, margin * seconds), 1) for stage, seconds in expected.items()}
    return Deadlines({stage: round(seconds, 2) for stage, seconds in expected.items()}, limit)


@dataclass(frozen=True)
class Slow:
    """A clip in flight for longer than its stages are expected to take."""

    clip: str
    state: str  # sampling | decoding
    pool: str
    seconds: float  # since its run was submitted
    expected: float

    def line(self) -> str:
        return (
            f"{self.clip}: {self.state} on {self.pool} for {duration(self.seconds)}, "
            f"longer than expected ({duration(self.expected)})"
        )


def slow_clips(manifest: Manifest, config: LocalConfig, now: float) -> list[Slow]:
    """The clips of a running run whose sample or decode run has gone on longer than expected."""
    if manifest.state != "running":
        return []
    out = []
    for cid, rec in manifest.clips.items():
        kind = {"sampling": "sample", "decoding": "decode"}.get(rec.state)
        since = rec.timeline.get(f"{kind}_submitted") if kind else None
        if kind is None or since is None or rec.pool is None or rec.decoder is None:
            continue
        expected = deadlines(config, rec.clip, rec.pool, rec.decoder).expected_for(kind)
        if now - since > expected:
            out.append(Slow(cid, rec.state, rec.pool if kind == "sample" else rec.decoder, now - since, expected))
    return out


def duration(seconds: float) -> str:
    """``42 s``, ``6 min 05 s``, ``2 h 03 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
