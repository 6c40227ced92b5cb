"""Refit the planner's profile from what runs measured (``h3flow calibrate RUN_ID…``).

For each sampler pool and decoder, what a clip really cost it is read off the runs as
throughput (:func:`h3flow.pipeline.calibration.occupancy`), so the overheads of a real run — flow-run
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

from h3flow.config.models import LocalConfig
from h3flow.core.errors import ConfigError
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile

MIN_SECONDS = 0.01


Occupancy = dict[tuple[str, str], list[float]]  # (pool or decoder, spec) -> seconds per clip it cost


def fit_profile(
    config: LocalConfig, sampled: Occupancy, decoded: Occupancy, base: Path | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The base profile with the measured entries replaced; and one line per change."""
    base_path = Path(base) if base else DEFAULT_PROFILE
    raw = tomllib.loads(base_path.read_text(encoding="utf-8"))
    profile = load_profile(base_path)
    notes: list[str] = []
    samples: dict[tuple[str, int, str], list[float]] = defaultdict(list)  # pools of one GPU model pool their data
    for (pool_name, spec), seconds in sampled.items():
        pool = config.pool(pool_name)
        samples[(pool.gpu_model, pool.ulysses_degree, spec)].extend(seconds)
    for (model, degree, spec), seconds in sorted(samples.items()):
        held = statistics.median(seconds)
        others = (
            lookup(profile.encode, model, spec, "calibrate")
            + lookup(profile.offload, model, spec, "calibrate")
            + lookup(profile.handoff, spec, "calibrate")
        )
        value = round(max(held - others, MIN_SECONDS), 3)
        raw.setdefault("gpu", {}).setdefault(model, {}).setdefault("sample", {}).setdefault(spec, {})[str(degree)] = (
            value
        )
        _measured(raw, f"gpu.{model}.sample.{spec}.{degree}")
        notes.append(
            f"gpu.{model}.sample.{spec}.{degree} = {value} s (median of {len(seconds)} clips held {held:.2f} s)"
        )
    decodes: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (decoder, spec), seconds in decoded.items():
        decodes[(config.pool(decoder).gpu_model, spec)].extend(seconds)
    for (model, spec), seconds in sorted(decodes.items()):
        held = statistics.median(seconds)
        value = round(max(held - lookup(profile.mux, model, spec, "calibrate"), MIN_SECONDS), 3)
        raw.setdefault("gpu", {}).setdefault(model, {}).setdefault("decode", {})[spec] = value
        _measured(raw, f"gpu.{model}.decode.{spec}")
        notes.append(f"gpu.{model}.decode.{spec} = {value} s (median of {len(seconds)} clips held {held:.2f} s)")
    if not notes:
        raise ConfigError("nothing to calibrate: the runs have no executed (uncached) stages")
    return raw, notes


def _measured(raw: dict[str, Any], entry: str) -> None:
    """A calibrated entry is measured now: no longer listed as fitted."""
    if entry in raw.get("fitted", []):
        raw["fitted"] = [e for e in raw["fitted"] if e != entry]


def lookup(get: Any, *args: Any) -> float:
    """A profile value, or 0 where the profile has none."""
    try:
        return float(get(*args))
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
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
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
