"""What finished runs measured, split into pure stage work and the orchestration's own cost.

A run's stage records say how long each stage really computed (``StageResult.seconds``,
on the host that ran it); the gaps between them are what running clips through Prefect
added. :func:`measure` reads both off one manifest, :func:`fit` turns runs into a
profile (``h3flow calibrate``): stage times are medians of the pure work, and the
profile's ``[orchestration]`` table holds the median costs around it, so the planner can
predict a run (``overheads=True``) or simulate the same batch with no orchestration at
all (``overheads=False``, the ideal ``bench/orchestration.py`` compares a run against).

Clocks: stage times are wall-clock times of the hosts that ran them and the dispatcher's
timeline is its host's, so the cross-stage figures assume synchronised clocks (preflight
checks the skew; on the embedded default every host is this machine).
"""

from __future__ import annotations

import itertools
import statistics
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.fsutil import atomic_write_text
from h3flow.pipeline.manifest import ClipRecord, Manifest, load_manifest
from h3flow.pipeline.results import StageResult
from h3flow.planner.calibrate import Orchestration, Work, fit_profile, to_toml
from h3flow.planner.profile import parse_profile
from h3flow.planner.resources import Resources


@dataclass
class RunTimes:
    """One run, measured: pure work per (resource, stage, spec) and the orchestration's costs."""

    work: Work = field(default_factory=lambda: defaultdict(list))
    pool_gaps: list[float] = field(default_factory=list)  # a pool idle while its next clip was waiting
    decode_latencies: list[float] = field(default_factory=list)  # latent verified -> decode starts (decoder idle)
    first_start: float | None = None  # batch submitted -> the first stage that runs starts
    executed: float | None = None  # batch submitted -> last clip delivered (the dispatcher's clock)
    api_s_per_clip: float | None = None  # the dispatcher's own API work per clip

    @property
    def orchestration(self) -> Orchestration:
        return Orchestration(
            pool_gap_s=_median(self.pool_gaps),
            decode_latency_s=_median(self.decode_latencies),
            first_start_s=self.first_start or 0.0,
        )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _end(stage: StageResult) -> float:
    return (stage.started or 0.0) + (stage.seconds or 0.0)


def _executed(rec: ClipRecord, name: str) -> StageResult | None:
    """The stage if it ran in this run (cached or unrecorded stages measure nothing)."""
    stage = rec.stages.get(name)
    if stage is None or stage.cached or stage.started is None or stage.seconds is None:
        return None
    return stage


def measure(manifest: Manifest, config: LocalConfig) -> RunTimes:
    """Read one run's pure stage work and its orchestration gaps off its manifest."""
    res = Resources.from_config(config)
    out = RunTimes()
    done = [rec for rec in manifest.clips.values() if rec.state == "delivered"]
    device: dict[str, list[tuple[float, float, float]]] = defaultdict(list)  # pool -> (start, end, waiting since)
    decodes: dict[str, list[tuple[float, float, float]]] = defaultdict(list)  # decoder -> (arrived, start, end)
    for rec in done:
        spec = rec.clip.spec
        ran = {name: s for name in ("encode", "offload", "sample", "transfer", "decode") if (s := _executed(rec, name))}
        for name in ("encode", "offload"):
            if name in ran and rec.pool:
                encoder = config.pool(rec.pool).encoder_pool or rec.pool
                out.work[(ran[name].pool or encoder, name, spec)].append(ran[name].seconds or 0.0)
        if "sample" in ran and rec.pool:
            out.work[(rec.pool, "sample", spec)].append(ran["sample"].seconds or 0.0)
            first = min(s.started or 0.0 for n, s in ran.items() if n in ("encode", "offload", "sample"))
            waiting = rec.timeline.get("sample_submitted", first)
            device[rec.pool].append((first, _end(ran["sample"]), waiting))
        if "transfer" in ran and rec.pool and rec.decoder:
            link = res.link(config.pool(rec.pool).host, config.pool(rec.decoder).host)
            out.work[(link.name, "transfer", spec)].append(ran["transfer"].seconds or 0.0)
        if "decode" in ran and rec.decoder:
            out.work[(rec.decoder, "decode", spec)].append(ran["decode"].seconds or 0.0)
            if "transfer" in ran:
                decodes[rec.decoder].append((_end(ran["transfer"]), ran["decode"].started or 0.0, _end(ran["decode"])))
    for runs in device.values():
        runs.sort()
        for (_, end, _), (start, _, waiting) in itertools.pairwise(runs):
            if waiting < end:  # the next clip was already there when the pool freed
                out.pool_gaps.append(max(start - end, 0.0))
    for runs in decodes.values():
        runs.sort(key=lambda r: r[1])
        free = float("-inf")
        for arrived, start, end in runs:
            out.decode_latencies.append(max(start - max(arrived, free), 0.0))
            free = end
    starts = [s.started for rec in done for name in rec.stages if (s := _executed(rec, name)) and s.started]
    if manifest.submitted is not None and starts:  # the first stage that ran (an encode, or a sample when cached)
        out.first_start = max(min(starts) - manifest.submitted, 0.0)
    delivered = [rec.timeline["delivered"] for rec in done if "delivered" in rec.timeline]
    if manifest.submitted is not None and delivered and len(done) == len(manifest.clips):
        out.executed = max(delivered) - manifest.submitted
    if manifest.clips:
        out.api_s_per_clip = manifest.dispatch_overhead_s / len(manifest.clips)
    return out


def merge(runs: list[RunTimes]) -> RunTimes:
    """Several runs' measurements as one sample (for calibrating on more than one run)."""
    out = RunTimes()
    for one in runs:
        for key, seconds in one.work.items():
            out.work[key].extend(seconds)
        out.pool_gaps += one.pool_gaps
        out.decode_latencies += one.decode_latencies
    starts = [r.first_start for r in runs if r.first_start is not None]
    out.first_start = statistics.median(starts) if starts else None
    return out


def fit(
    config: LocalConfig, manifests: list[Manifest], base: Path | None = None, *, overheads: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """The base profile with the entries these runs measured replaced; and one line per change.

    ``overheads=False`` leaves the orchestration table at zero: the same stages with no
    Prefect around them.
    """
    times = merge([measure(m, config) for m in manifests])
    return fit_profile(config, times.work, times.orchestration if overheads else Orchestration(), base)


def run_calibrate(run_ids: list[str], config_path: Path, output: Path, base: Path | None) -> list[str]:
    config = load_local_config(config_path)
    manifests = [load_manifest(config.runs_dir, run_id) for run_id in run_ids]
    data, notes = fit(config, manifests, base)
    header = "h3flow profile calibrated from runs " + ", ".join(run_ids) + "\n" + "\n".join(notes)
    text = to_toml(data, header)
    parse_profile(tomllib.loads(text), str(output))  # never write a profile `plan` cannot read
    atomic_write_text(output, text)
    return notes
