"""``h3flow calibrate RUN_ID…``: refit the planner's profile from what runs measured.

For each sampler pool and decoder, what a clip really cost it is read off the runs as
throughput (see :func:`occupancy`), so the overheads of a real run — flow-run
start-up, API round trips — are in the profile and the planner predicts what the
cluster delivers. The profile's stage for that (GPU model, degree, spec) is set so the
simulated cost equals the median measured one. Everything else is
copied from the base profile. The result is a TOML file `plan --profile` reads.
"""

from __future__ import annotations

import statistics
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

from h3flow.config import LocalConfig
from h3flow.errors import ConfigError
from h3flow.fsutil import atomic_write_text
from h3flow.manifest import Manifest
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile

MIN_SECONDS = 0.01


def occupancy(manifests: list[Manifest], lane: str) -> dict[tuple[str, str], list[float]]:
    """(pool or decoder, spec) -> seconds per clip it really cost. ``lane``: "sample" or "decode".

    Measured as throughput, as the operator experiences it: a resource that took clips
    from its first submission to its last completion over span S for n clips cost S/n
    per clip — flow-run start-up, API round trips and whatever the queue-ahead did not
    hide included. Runs without the dispatcher's timeline fall back to the executed
    stage seconds (encode start to sample end; decode).
    """
    start_key, end_key = ("sample_submitted", "sampled") if lane == "sample" else ("decode_submitted", "delivered")
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for manifest in manifests:
        spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for rec in manifest.clips.values():
            resource = rec.pool if lane == "sample" else rec.decoder
            if not resource or rec.state != "delivered":
                continue
            if start_key in rec.timeline and end_key in rec.timeline:
                spans[(resource, rec.clip.spec)].append((rec.timeline[start_key], rec.timeline[end_key]))
                continue
            first, last = (rec.stages.get("encode"), rec.stages.get("sample")) if lane == "sample" else (
                rec.stages.get("decode"), rec.stages.get("decode"))
            if first and last and first.started is not None and last.started is not None and not last.cached:
                out[(resource, rec.clip.spec)].append(last.started + (last.seconds or 0.0) - first.started)
        for key, runs in spans.items():
            span = max(end for _, end in runs) - min(start for start, _ in runs)
            out[key].extend([span / len(runs)] * len(runs))
    return out


def fit(config: LocalConfig, manifests: list[Manifest], base: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """The base profile with the measured entries replaced; and one line per change."""
    base_path = Path(base) if base else DEFAULT_PROFILE
    raw = tomllib.loads(base_path.read_text(encoding="utf-8"))
    profile = load_profile(base_path)
    notes: list[str] = []
    samples: dict[tuple[str, int, str], list[float]] = defaultdict(list)  # pools of one GPU model pool their data
    for (pool_name, spec), seconds in occupancy(manifests, "sample").items():
        pool = config.pool(pool_name)
        samples[(pool.gpu_model, pool.ulysses_degree, spec)].extend(seconds)
    for (model, degree, spec), seconds in sorted(samples.items()):
        held = statistics.median(seconds)
        others = sum(
            lookup(lambda stage=stage: getattr(profile, stage)(model, spec, "calibrate")) for stage in ("encode", "offload")
        ) + lookup(lambda: profile.handoff(spec, "calibrate"))
        value = round(max(held - others, MIN_SECONDS), 3)
        raw.setdefault("gpu", {}).setdefault(model, {}).setdefault("sample", {}).setdefault(spec, {})[str(degree)] = value
        notes.append(f"gpu.{model}.sample.{spec}.{degree} = {value} s (median of {len(seconds)} clips held {held:.2f} s)")
    decodes: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (decoder, spec), seconds in occupancy(manifests, "decode").items():
        decodes[(config.pool(decoder).gpu_model, spec)].extend(seconds)
    for (model, spec), seconds in sorted(decodes.items()):
        held = statistics.median(seconds)
        value = round(max(held - lookup(lambda: profile.mux(model, spec, "calibrate")), MIN_SECONDS), 3)
        raw.setdefault("gpu", {}).setdefault(model, {}).setdefault("decode", {})[spec] = value
        notes.append(f"gpu.{model}.decode.{spec} = {value} s (median of {len(seconds)} clips held {held:.2f} s)")
    if not notes:
        raise ConfigError("nothing to calibrate: the runs have no executed (uncached) stages")
    return raw, notes


def lookup(get: Any) -> float:
    try:
        return float(get())
    except ConfigError:
        return 0.0


def to_toml(data: dict[str, Any], header: str) -> str:
    """A small TOML writer for the profile's shape: tables of numbers and strings."""
    lines = [f"# {line}" for line in header.splitlines()]

    def key(name: str) -> str:
        return name if name.replace("_", "").replace("-", "").isalnum() else f'"{name}"'

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        raise TypeError(f"cannot write {type(v).__name__} to TOML")

    def emit(table: dict[str, Any], path: list[str]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if path and (scalars or not table):
            lines.append("")
            lines.append("[" + ".".join(key(p) for p in path) + "]")
        lines.extend(f"{key(k)} = {value(v)}" for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                emit(v, [*path, k])

    emit(data, [])
    return "\n".join(lines) + "\n"


def run_calibrate(run_ids: list[str], config_path: Path, output: Path, base: Path | None) -> list[str]:
    from h3flow.config import load_local_config
    from h3flow.manifest import load_manifest

    config = load_local_config(config_path)
    manifests = [load_manifest(config.runs_dir, run_id) for run_id in run_ids]
    data, notes = fit(config, manifests, base)
    header = "h3flow profile calibrated from runs " + ", ".join(run_ids) + "\n" + "\n".join(notes)
    text = to_toml(data, header)
    from h3flow.planner.profile import parse_profile

    parse_profile(tomllib.loads(text), str(output))  # never write a profile `plan` cannot read
    atomic_write_text(output, text)
    return notes
