"""``h3flow calibrate``: what finished runs cost each pool and decoder, fitted into a profile.

The run side of calibration: read the runs' manifests, measure per resource and spec
what a clip cost it (:func:`occupancy`), and hand that to the planner's
:func:`~h3flow.planner.calibrate.fit_profile`.
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.fsutil import atomic_write_text
from h3flow.pipeline.manifest import Manifest, load_manifest
from h3flow.planner.calibrate import Occupancy, fit_profile, to_toml
from h3flow.planner.profile import parse_profile


def occupancy(manifests: list[Manifest], lane: str) -> Occupancy:
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
            first, last = (
                (rec.stages.get("encode"), rec.stages.get("sample"))
                if lane == "sample"
                else (rec.stages.get("decode"), rec.stages.get("decode"))
            )
            if first and last and first.started is not None and last.started is not None and not last.cached:
                out[(resource, rec.clip.spec)].append(last.started + (last.seconds or 0.0) - first.started)
        for key, runs in spans.items():
            span = max(end for _, end in runs) - min(start for start, _ in runs)
            out[key].extend([span / len(runs)] * len(runs))
    return out


def fit(config: LocalConfig, manifests: list[Manifest], base: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """The base profile with the entries these runs measured replaced; and one line per change."""
    return fit_profile(config, occupancy(manifests, "sample"), occupancy(manifests, "decode"), base)


def run_calibrate(run_ids: list[str], config_path: Path, output: Path, base: Path | None) -> list[str]:
    config = load_local_config(config_path)
    manifests = [load_manifest(config.runs_dir, run_id) for run_id in run_ids]
    data, notes = fit(config, manifests, base)
    header = "h3flow profile calibrated from runs " + ", ".join(run_ids) + "\n" + "\n".join(notes)
    text = to_toml(data, header)
    parse_profile(tomllib.loads(text), str(output))  # never write a profile `plan` cannot read
    atomic_write_text(output, text)
    return notes
