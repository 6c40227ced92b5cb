"""Orchestration benchmark: what running clips through Prefect costs, against pure work.

    .venv/bin/python bench/orchestration.py [--scales tiny production] [--json] [--figures DIR]

Starts the embedded default (a real Prefect server, process workers, pool runners, the
latent receiver) in a scratch work dir and, per scale, runs two batches of
reference-model clips through it:

1. a calibration batch (6 clips): the profile is fitted from it alone — its stages'
   pure work and the orchestration's gaps around them (``h3flow calibrate``);
2. a measured batch (other seeds; 24 tiny or 12 production-shaped clips). For it:

   - ``executed_s``: batch submitted -> last clip delivered;
   - ``ideal_s``: the planner's best schedule of the same batch on the same topology
     with the stage durations *this* run measured and no orchestration at all: the
     floor, what the same work would take if Prefect cost nothing;
   - ``predicted_s``: the planner's best schedule with the profile fitted on the
     calibration batch (plus its start-up): a prediction of a run it never saw;
   - per-clip figures (median, max): a pool's idle gap between two clips when the
     next was already waiting, a decoder's start latency (latent verified on its host
     -> decode starts, decoder idle), the first start (submitted -> first encode), and
     the dispatcher's own API time per clip.

Scales: ``tiny`` is the demo's clips (sub-second stages: orchestration dominates);
``production`` is HD clips at 24 steps, about 15 s of real reference-model compute per
sample on a 2-core CPU: stages long next to Prefect's overheads, as on the real cluster
where a clip samples for 77-235 s. Load averages are printed: on a busy machine every
figure is worse.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.table import Table

from h3flow.cli.config import render
from h3flow.config.adapt import adapt, local_host_map
from h3flow.config.models import DATABASES, LocalConfig
from h3flow.core.fsutil import atomic_write_json
from h3flow.ops.lifecycle import start_services, stop_services
from h3flow.pipeline.calibration import RunTimes, fit, measure
from h3flow.pipeline.manifest import Manifest
from h3flow.pipeline.runs import load_run, start_run, watch_run
from h3flow.planner import Planner, Resources, best_schedule, parse_profile
from h3flow.planner.timing import PlanClip

PROMPTS = ["slow pan left, calm", "fast zoom in, energetic", "tilt up, happy", "zoom out, melancholic"]
IMAGES = sorted((ROOT / "examples" / "images").glob("*.png"))
PLAN_SECONDS = 5.0  # the planner's time limit per schedule (a few clips: it proves optimality sooner)


@dataclass(frozen=True)
class Scale:
    name: str
    spec: str
    steps: int
    measured_clips: int


SCALES = {
    "tiny": Scale("tiny", "tiny", 6, 24),
    "production": Scale("production", "hd", 24, 12),
}
CALIBRATION_CLIPS = 6


def batch_file(folder: Path, scale: Scale, n: int, seed: int) -> Path:
    clips = [
        {
            "id": f"{scale.name[:4]}-{seed}-{i:02d}",
            "prompt": f"{PROMPTS[i % len(PROMPTS)]}, take {seed + i}",  # every clip encodes: no cache hits
            "image": str(IMAGES[i % len(IMAGES)]),
            "spec": scale.spec,
            "seconds": 5,
            "steps": scale.steps,
            "seed": seed + i,
        }
        for i in range(n)
    ]
    path = folder / f"bench-{scale.name}-{seed}.json"
    path.write_text(json.dumps({"name": f"bench-{scale.name}-{seed}", "clips": clips}))
    return path


def run_batch(config_path: Path, path: Path) -> Manifest:
    run_id = start_run(path, config_path)
    progress = watch_run(run_id, config_path, timeout=3600)
    manifest = load_run(run_id, config_path)
    if progress.state != "COMPLETED" or len(manifest.delivered) != len(manifest.clips):
        raise SystemExit(f"run {run_id} ended {progress.state}: {len(manifest.delivered)}/{len(manifest.clips)}")
    return manifest


def makespan(config: LocalConfig, manifest: Manifest, raw: dict[str, Any]) -> float:
    """The planner's best schedule of ``manifest``'s clips with profile ``raw``, plus its start-up."""
    profile = parse_profile(raw)
    planner = Planner(profile, Resources.from_config(config))
    clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
    return best_schedule(planner, clips, time_limit=PLAN_SECONDS).schedule.makespan + profile.start_up


def spread(values: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(values), max(values)) if values else (None, None)


def figures(scale: Scale, config: LocalConfig, calibration: Manifest, manifest: Manifest) -> dict[str, Any]:
    times: RunTimes = measure(manifest, config)
    ideal_raw, _ = fit(config, [manifest], overheads=False)
    predicted_raw, _ = fit(config, [calibration])
    executed = times.executed or float("nan")
    ideal = makespan(config, manifest, ideal_raw)
    predicted = makespan(config, manifest, predicted_raw)
    gap, gap_max = spread(times.pool_gaps)
    latency, latency_max = spread(times.decode_latencies)
    samples = [s for (_, stage, _), secs in times.work.items() if stage == "sample" for s in secs]
    return {
        "scale": scale.name,
        "database": config.prefect.database.kind if config.prefect.database else "sqlite",
        "spec": scale.spec,
        "steps": scale.steps,
        "clips": len(manifest.clips),
        "calibration_clips": len(calibration.clips),
        "executed_s": round(executed, 2),
        "ideal_s": round(ideal, 2),
        "executed_over_ideal": round(executed / ideal, 3),
        "predicted_s": round(predicted, 2),
        "predicted_over_executed": round(predicted / executed, 3),
        "pool_gap_s_median": gap,
        "pool_gap_s_max": gap_max,
        "decoder_start_latency_s_median": latency,
        "decoder_start_latency_s_max": latency_max,
        "first_start_s": times.first_start,
        "dispatcher_api_ms_per_clip": round(1000 * (times.api_s_per_clip or 0.0), 1),
        "sample_s_median": statistics.median(samples) if samples else None,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "run_id": manifest.run_id,
    }


def show(console: Console, rows: list[dict[str, Any]]) -> None:
    def f(v: Any, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    table = Table(title="orchestration: executed vs ideal (pure work) vs predicted (held-out calibration)")
    for col in ("scale", "clips", "executed s", "ideal s", "exec/ideal", "pred/exec", "pool gap s", "decoder lat s",
                "first start s", "API ms/clip", "load"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["scale"],
            str(r["clips"]),
            f(r["executed_s"], 1),
            f(r["ideal_s"], 1),
            f(r["executed_over_ideal"], 3),
            f(r["predicted_over_executed"], 3),
            f"{f(r['pool_gap_s_median'])} / {f(r['pool_gap_s_max'])}",
            f"{f(r['decoder_start_latency_s_median'])} / {f(r['decoder_start_latency_s_max'])}",
            f(r["first_start_s"]),
            f(r["dispatcher_api_ms_per_clip"], 1),
            f(r["load_avg_1m"]),
        )
    console.print(table)
    console.print(
        "gaps and latencies: median / max per clip. goals: production exec/ideal <= 1.05, pool gap and decoder "
        "latency medians <= 1 s; tiny exec/ideal <= 3; pred/exec within 0.90-1.10"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", choices=sorted(SCALES), default=["tiny", "production"])
    parser.add_argument("--json", action="store_true", help="print one JSON object per measured batch")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--figures", type=Path, default=None, help="copy each measured run's executed Gantt here")
    parser.add_argument("--database", choices=DATABASES, default="sqlite", help="the Prefect server's database")
    args = parser.parse_args()
    console = Console(highlight=False, stderr=args.json)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3flow-bench-"))
    workdir.chmod(0o755)  # PostgreSQL runs as its own user when this runs as root: it must pass through
    hm = local_host_map(workdir, base_port=random.randint(30000, 50000), database=args.database)
    config = adapt(hm, work_dir=str(workdir.resolve()))
    config_path = workdir / "local.json"
    atomic_write_json(config_path, render(config))
    t0 = time.monotonic()
    start_services(config, config_path, console=console, timeout=120)
    console.print(f"cluster up in {time.monotonic() - t0:.1f} s ({workdir}), load {os.getloadavg()[0]:.2f}")
    rows = []
    try:
        for name in args.scales:
            scale = SCALES[name]
            calibration = run_batch(config_path, batch_file(workdir, scale, CALIBRATION_CLIPS, 1000))
            manifest = run_batch(config_path, batch_file(workdir, scale, scale.measured_clips, 5000))
            row = figures(scale, config, calibration, manifest)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            if args.figures:
                args.figures.mkdir(parents=True, exist_ok=True)
                gantt = Path(config.runs_dir) / manifest.run_id / "gantt.png"
                if gantt.exists():
                    shutil.copyfile(gantt, args.figures / f"orchestration-{name}.png")
    finally:
        stop_services(config, config_path, console=console)
    show(console, rows)


if __name__ == "__main__":
    main()
