"""Orchestration benchmark: executed makespan vs the planner's prediction, dispatch overhead.

    .venv/bin/python bench/orchestration.py [--clips 6 24] [--workdir DIR]

Starts the embedded default (a real Prefect server, workers, receiver) in a scratch
work dir, runs batches of tiny reference-model clips through it, then calibrates the
planner's profile from each run's own measured stage durations and simulates the same
batch on the same topology with it. Prints executed ÷ planned (goal <= 1.05) and the
dispatcher's own work per clip (submitting its two flow runs and reading their
records through the API) in ms.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from h3flow.cli.config import render
from h3flow.config.adapt import adapt, local_host_map
from h3flow.core.fsutil import atomic_write_json
from h3flow.ops.lifecycle import start_services, stop_services
from h3flow.pipeline.calibration import fit
from h3flow.pipeline.runs import load_run, start_run, watch_run
from h3flow.planner import Planner, Resources, make_policy, parse_profile, simulate
from h3flow.planner.timing import PlanClip

PROMPTS = ["slow pan left, calm", "fast zoom in, energetic", "tilt up, happy", "zoom out, melancholic"]
IMAGES = sorted((ROOT / "examples" / "images").glob("*.png"))


def batch_file(folder: Path, n: int, tag: str) -> Path:
    clips = [
        {
            "id": f"{tag}{i:02d}",
            "prompt": PROMPTS[i % len(PROMPTS)],
            "image": str(IMAGES[i % len(IMAGES)]),
            "spec": "tiny",
            "seconds": 5,
            "seed": 1000 + i + 100 * n,
        }
        for i in range(n)
    ]
    path = folder / f"bench-{tag}.json"
    path.write_text(json.dumps({"name": f"bench-{tag}", "clips": clips}))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", type=int, nargs="+", default=[6, 24])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    console = Console(highlight=False)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3flow-bench-"))
    config = adapt(local_host_map(workdir, base_port=random.randint(30000, 50000)), work_dir=str(workdir.resolve()))
    config_path = workdir / "local.json"
    atomic_write_json(config_path, render(config))
    t0 = time.monotonic()
    start_services(config, config_path, console=console, timeout=120)
    console.print(f"cluster up in {time.monotonic() - t0:.1f} s ({workdir})")
    rows = []
    try:
        for n in args.clips:
            run_id = start_run(batch_file(workdir, n, f"n{n}-"), config_path)
            watch_run(run_id, config_path, timeout=1800)
            manifest = load_run(run_id, config_path)
            executed = (manifest.finished or 0) - (manifest.started or 0)
            raw, _ = fit(config, [manifest])
            profile = parse_profile(raw)
            planner = Planner(profile, Resources.from_config(config))
            clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
            planned = simulate(clips, planner, make_policy("best", planner)).makespan
            overhead_ms = 1000 * manifest.dispatch_overhead_s / n
            rows.append((n, executed, planned, executed / planned, overhead_ms, len(manifest.delivered)))
    finally:
        stop_services(config, config_path, console=console)
    console.print("\nclips  executed s  planned s (calibrated)  executed/planned  dispatch overhead ms/clip  delivered")
    for n, ex, pl, ratio, ov, ok in rows:
        console.print(f"{n:5d}  {ex:10.1f}  {pl:22.1f}  {ratio:16.3f}  {ov:25.1f}  {ok}/{n}")
    console.print("goal: executed/planned <= 1.05")


if __name__ == "__main__":
    main()
