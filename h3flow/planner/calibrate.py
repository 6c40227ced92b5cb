"""Refit the planner's profile from what runs measured (``h3flow calibrate RUN_ID…``).

Stage times are set from the runs' pure work (each stage's own seconds, medians per GPU
model, Ulysses degree and spec — pools of one GPU model pool their data), and the
profile's ``[orchestration]`` table from the gaps around it (what Prefect added:
:mod:`h3flow.pipeline.calibration` measures both). Kept apart, the planner can simulate a
batch with the orchestration (a prediction) or without it (the ideal). Everything else is
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
from h3flow.core.specs import frames_for_seconds
from h3flow.planner.profile import DEFAULT_PROFILE, Orchestration, load_profile
from h3flow.planner.resources import Resources

__all__ = ["MIN_SECONDS", "Orchestration", "Work", "fit_profile", "lookup", "to_toml"]

MIN_SECONDS = 0.01

Work = dict[tuple[str, str, str], list[float]]
"""(pool, decoder or link name; stage; spec) -> the stage's measured seconds, one per clip."""


def fit_profile(
    config: LocalConfig, work: Work, orchestration: Orchestration, base: Path | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The base profile with the measured entries replaced; and one line per change."""
    base_path = Path(base) if base else DEFAULT_PROFILE
    raw = tomllib.loads(base_path.read_text(encoding="utf-8"))
    profile = load_profile(base_path)
    notes: list[str] = []
    grouped: dict[tuple[str, ...], list[float]] = defaultdict(list)
    transfers: list[float] = []
    links = {lk.name: lk for lk in Resources.from_config(config).links}
    for (resource, stage, spec), seconds in work.items():
        if stage == "transfer":
            gbit_s = links[resource].gbit_s
            wire = profile.latent_bytes(spec, frames_for_seconds(profile.data.clip_seconds)) * 8 / (gbit_s * 1e9)
            transfers += [s - wire for s in seconds]
            continue
        pool = config.pool(resource)
        degree = (str(pool.ulysses_degree),) if stage == "sample" else ()
        grouped[(pool.gpu_model, stage, spec, *degree)].extend(seconds)
    for key, seconds in sorted(grouped.items()):
        model, stage, spec = key[:3]
        held = statistics.median(seconds)
        # the handoff (writing the latent) is inside the sample stage, the mux inside the decode
        inside = lookup(profile.handoff, spec, "calibrate") if stage == "sample" else 0.0
        inside = lookup(profile.mux, model, spec, "calibrate") if stage == "decode" else inside
        value = round(max(held - inside, MIN_SECONDS), 3)
        table = raw.setdefault("gpu", {}).setdefault(model, {}).setdefault(stage, {})
        if stage == "sample":
            table.setdefault(spec, {})[key[3]] = value
        else:
            table[spec] = value
        entry = ".".join(("gpu", model, stage, spec, *key[3:]))
        _measured(raw, entry)
        notes.append(f"{entry} = {value} s (median of {len(seconds)} clips: {held:.3f} s)")
    if transfers:
        value = round(max(statistics.median(transfers), MIN_SECONDS), 3)
        raw.setdefault("transfer", {})["overhead_s"] = value
        notes.append(f"transfer.overhead_s = {value} s (median of {len(transfers)} latents, wire time taken out)")
    if not notes:
        raise ConfigError("nothing to calibrate: the runs have no executed (uncached) stages")
    raw["orchestration"] = {k: round(v, 3) for k, v in orchestration.model_dump().items()}
    notes.append(
        "orchestration: "
        + ", ".join(f"{k} = {v:.3f} s" for k, v in orchestration.model_dump().items())
        + " (medians of the gaps around the stages)"
    )
    return raw, notes


def _measured(raw: dict[str, Any], entry: str) -> None:
    """A calibrated entry is measured now: no longer listed as fitted or modelled, and no other fit changes it."""
    if entry in raw.get("fitted", []):
        raw["fitted"] = [e for e in raw["fitted"] if e != entry]
    raw.get("modelled", {}).pop(entry, None)
    for name, alt in list(raw.get("alternatives", {}).items()):
        if entry in alt.get("set", {}):
            del raw["alternatives"][name]


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
