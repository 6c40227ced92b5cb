"""Orchestration benchmark: what running clips through Prefect costs, against pure work.

    .venv/bin/python bench/orchestration.py [--scales demo tiny production] [--hog] [--json]
                                            [--checkout DIR] [--figures DIR]

Starts the embedded default (a real Prefect server on SQLite, the workers, the latent
receiver) of a checkout — this one, or ``--checkout DIR`` (another h3flow checkout, e.g.
a worktree of an older commit: driven through its own CLI, so the same figures measure
both) — in a scratch work dir and, per scale, runs batches of reference-model clips
through it with the workers already up:

- ``demo``: the demo's 6-clip batch (``examples/batches/demo.json``);
- ``tiny`` and ``production``: a 6-clip calibration batch (the profile is fitted from it
  alone), then a measured batch with other seeds and prompts (24 tiny clips, or 12
  production-shaped HD clips at 24 steps: ~15-30 s of real compute per sample on a
  2-core CPU, stages long next to Prefect's overheads as on the real cluster).

For each measured batch:

- ``executed_s``: batch submitted -> last clip delivered;
- ``ideal_s``: a **proven lower bound** of the same clips' measured stage work on the same
  topology (the planner's bound, with the stage durations this run measured and no
  orchestration at all): no schedule of that work can be shorter, so executed ÷ ideal
  counts every second of orchestration, start-up included;
- ``predicted_s``: the planner's best schedule with the profile fitted on the calibration
  batch (plus its start-up): a prediction of a run it never saw;
- per clip (median, max): a pool's idle gap when its next clip was already waiting, a
  decoder's start latency (latent verified on its host -> decode starts), the first
  start (submitted -> the first stage that runs), and the dispatcher's API time;
- ``api_calls_per_clip``: every HTTP request h3flow's processes (CLI, workers, flow runs)
  sent the Prefect API during the batch, over its clips (``bench/apicount``: a
  ``sitecustomize`` that counts httpx requests per process);
- the checkout's lines of runtime code (dispatcher, runner or worker, orphan handling,
  Prefect adapter).

``--hog`` keeps one core busy with a CPU-bound process for the whole run: overhead that
grows with load is what a busy controller host sees. Load averages are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.table import Table

from h3flow.config.models import DATABASES, LocalConfig, load_local_config
from h3flow.pipeline.calibration import RunTimes, fit, measure
from h3flow.pipeline.manifest import Manifest, load_manifest
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
    "demo": Scale("demo", "tiny", 6, 6),
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


RUNTIME_CODE = {
    "dispatcher": ["h3flow/pipeline/dispatcher.py"],
    "runner or worker": [
        "h3flow/pipeline/flows/runner.py",
        "h3flow/pipeline/worker.py",
        "h3flow/pipeline/stopping.py",
        "h3flow/pipeline/gpu_slot.py",
    ],
    "orphan handling": ["h3flow/pipeline/orphans.py", "h3flow/pipeline/automations.py"],
    "Prefect adapter": ["h3flow/pipeline/prefect_api.py"],
}
DEMO_BATCH = ROOT / "examples" / "batches" / "demo.json"


@dataclass(frozen=True)
class Checkout:
    """An h3flow checkout the benchmark drives through its own CLI (``h3flow`` on its venv)."""

    root: Path
    counts: Path  # where bench/apicount writes each process's request count

    @property
    def cli(self) -> str:
        own = self.root / ".venv" / "bin" / "h3flow"
        return str(own if own.exists() else Path(sys.prefix) / "bin" / "h3flow")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PYTHONPATH=os.pathsep.join(
                [str(ROOT / "bench" / "apicount"), str(self.root), str(self.root / "comfy_nodes")]
            ),
            H3FLOW_BENCH_COUNT_DIR=str(self.counts),
            DO_NOT_TRACK="1",
            COLUMNS="200",
        )
        return env

    def h3(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.cli, *args], capture_output=True, text=True, env=self.env(), timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"h3flow {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def lines_of_code(self) -> dict[str, int]:
        """Code lines (not blank, not comments) of the runtime modules this checkout has, per part."""
        out = {}
        for part, files in RUNTIME_CODE.items():
            lines = 0
            for rel in files:
                path = self.root / rel
                if path.exists():
                    lines += sum(
                        1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")
                    )
            out[part] = lines
        return out

    def requests(self) -> Requests:
        """Requests counted so far, over every process (bench/apicount), per endpoint."""
        total = Requests()
        for path in self.counts.glob("*.json"):
            try:
                counted = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            total.n += int(counted.get("requests", 0))
            for endpoint, row in counted.get("endpoints", {}).items():
                total.calls[endpoint] += row["n"]
                total.seconds[endpoint] += row["s"]
                total.retryable[endpoint] += sum(n for code, n in row["status"].items() if code in ("503", "None"))
        return total


@dataclass
class Requests:
    """HTTP requests to the Prefect API: how many, per endpoint, their seconds, the retryable answers
    (503: SQLite's "database is locked"; None: no answer), which Prefect's client waits 2, 4, 8 s on."""

    n: int = 0
    calls: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    retryable: Counter[str] = field(default_factory=Counter)

    def __sub__(self, other: Requests) -> Requests:
        return Requests(
            self.n - other.n, self.calls - other.calls, self.seconds - other.seconds, self.retryable - other.retryable
        )

    def top(self, clips: int, count: int = 8) -> list[dict[str, Any]]:
        """The endpoints with the most calls, per clip."""
        return [
            {
                "endpoint": endpoint,
                "calls_per_clip": round(n / clips, 1),
                "seconds_per_clip": round(self.seconds[endpoint] / clips, 2),
                "retryable": self.retryable[endpoint],
            }
            for endpoint, n in self.calls.most_common(count)
        ]


def settled_requests(checkout: Checkout) -> Requests:
    """The request counts once every process has written its latest (each writes every 0.5 s)."""
    time.sleep(1.2)  # two of the shim's write periods: a reading, not a wait for the run
    return checkout.requests()


def run_batch(checkout: Checkout, config: LocalConfig, config_path: Path, path: Path) -> tuple[Manifest, Requests]:
    """Submit and wait through the CLI; the manifest and the API requests the batch cost."""
    before = settled_requests(checkout)
    run_id = checkout.h3("run", str(path), "--background", "-c", str(config_path)).stdout.strip().splitlines()[-1]
    checkout.h3("wait", run_id, "-c", str(config_path))
    requests = settled_requests(checkout) - before
    manifest = load_manifest(config.runs_dir, run_id)
    if len(manifest.delivered) != len(manifest.clips):
        raise SystemExit(f"run {run_id} ended {manifest.state}: {len(manifest.delivered)}/{len(manifest.clips)}")
    return manifest, requests


def makespan(config: LocalConfig, manifest: Manifest, raw: dict[str, Any]) -> float:
    """The planner's best schedule of ``manifest``'s clips with profile ``raw``, plus its start-up."""
    profile = parse_profile(raw)
    planner = Planner(profile, Resources.from_config(config))
    clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
    return best_schedule(planner, clips, time_limit=PLAN_SECONDS).schedule.makespan + profile.start_up


def proven_bound(config: LocalConfig, manifest: Manifest, raw: dict[str, Any]) -> float:
    """A proven lower bound of the clips' work with profile ``raw`` (no start-up: pure work only)."""
    planner = Planner(parse_profile(raw), Resources.from_config(config))
    clips = [PlanClip.of(rec.clip) for rec in manifest.clips.values()]
    return best_schedule(planner, clips, time_limit=PLAN_SECONDS).proven


def this_runs_floor(config: LocalConfig, manifest: Manifest, time_limit: float = 30.0) -> float:
    """A proven lower bound of this very run: the shortest schedule of each clip's own measured
    stage seconds on the pools it ran on, solved by CP-SAT (its proven bound, so a lower bound
    even when the time limit stops it short of optimal). A sampler pool runs one clip's GPU
    stages (encode, offload, sample) at a time, the latent crosses, the decoder decodes one clip
    at a time. (The planner's bound of the fitted durations — medians per pool and spec — is
    no bound of one run whose clips vary around them: executed can fall below it.)"""
    from ortools.sat.python import cp_model

    def ms(rec: Any, *stages: str) -> int:
        return round(
            1000 * sum((rec.stages[s].seconds or 0.0) for s in stages if s in rec.stages and not rec.stages[s].cached)
        )

    clips = [rec for rec in manifest.clips.values() if rec.state == "delivered" and rec.pool and rec.decoder]
    model = cp_model.CpModel()
    horizon = sum(ms(rec, "encode", "offload", "sample", "transfer", "decode") for rec in clips) + 1
    on: dict[str, list[Any]] = {}
    ends = []
    for n, rec in enumerate(clips):
        gpu, cross, decode = ms(rec, "encode", "offload", "sample"), ms(rec, "transfer"), ms(rec, "decode")
        start = model.new_int_var(0, horizon, f"s{n}")
        decoded = model.new_int_var(0, horizon, f"d{n}")
        model.add(decoded >= start + gpu + cross)
        on.setdefault(f"pool {config.pool(str(rec.pool)).encoder_pool or rec.pool}", []).append(
            model.new_fixed_size_interval_var(start, gpu, f"g{n}")
        )
        on.setdefault(f"decoder {rec.decoder}", []).append(model.new_fixed_size_interval_var(decoded, decode, f"x{n}"))
        ends.append(decoded + decode)
    for intervals in on.values():
        model.add_no_overlap(intervals)
    makespan = model.new_int_var(0, horizon, "makespan")
    model.add_max_equality(makespan, ends)
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = 1
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0
    return solver.best_objective_bound / 1000


def spread(values: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(values), max(values)) if values else (None, None)


def figures(
    scale: Scale, config: LocalConfig, calibration: Manifest | None, manifest: Manifest, requests: Requests
) -> dict[str, Any]:
    times: RunTimes = measure(manifest, config)
    ideal_raw, _ = fit(config, [manifest], overheads=False)
    executed = times.executed or float("nan")
    ideal = proven_bound(config, manifest, ideal_raw)
    floor = this_runs_floor(config, manifest)
    predicted = makespan(config, manifest, fit(config, [calibration])[0]) if calibration is not None else None
    gap, gap_max = spread(times.pool_gaps)
    latency, latency_max = spread(times.decode_latencies)
    samples = [s for (_, stage, _), secs in times.work.items() if stage == "sample" for s in secs]
    return {
        "scale": scale.name,
        "database": config.prefect.database.kind if config.prefect.database else "sqlite",
        "spec": scale.spec,
        "steps": scale.steps,
        "clips": len(manifest.clips),
        "calibration_clips": len(calibration.clips) if calibration is not None else 0,
        "executed_s": round(executed, 2),
        "ideal_s": round(ideal, 2),
        "ideal_is": "proven lower bound of the measured stage work",
        "executed_over_ideal": round(executed / ideal, 3),
        "floor_s": round(floor, 2),
        "floor_is": "proven lower bound of this run's own per-clip stage seconds on the pools they ran on",
        "executed_over_floor": round(executed / floor, 3) if floor else None,
        "predicted_s": round(predicted, 2) if predicted is not None else None,
        "predicted_over_executed": round(predicted / executed, 3) if predicted is not None else None,
        "pool_gap_s_median": gap,
        "pool_gap_s_max": gap_max,
        "decoder_start_latency_s_median": latency,
        "decoder_start_latency_s_max": latency_max,
        "first_start_s": times.first_start,
        "dispatcher_api_ms_per_clip": round(1000 * (times.api_s_per_clip or 0.0), 1),
        "api_calls_per_clip": round(requests.n / len(manifest.clips), 1),
        "api_retryable_answers": sum(requests.retryable.values()),
        "api_top_endpoints": requests.top(len(manifest.clips)),
        "sample_s_median": statistics.median(samples) if samples else None,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "run_id": manifest.run_id,
    }


def show(console: Console, rows: list[dict[str, Any]], title: str) -> None:
    def f(v: Any, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    table = Table(title=title)
    for col in ("scale", "clips", "executed s", "ideal s", "exec/ideal", "pred/exec", "pool gap s", "decoder lat s",
                "first start s", "API ms/clip", "API calls/clip", "load"):  # fmt: skip
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
            f(r["api_calls_per_clip"], 1),
            f(r["load_avg_1m"]),
        )
    console.print(table)
    console.print(
        "ideal: a proven lower bound of the measured stage work. gaps and latencies: median / max per clip. "
        "goals: production exec/ideal <= 1.03, first start <= 3 s, pool gap median <= 0.5 s, decoder latency "
        "median <= 1 s; demo batch <= 25 s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", choices=sorted(SCALES), default=["demo", "tiny", "production"])
    parser.add_argument("--json", action="store_true", help="print one JSON object per measured batch, then a summary")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the h3flow checkout to measure (default: this)")
    parser.add_argument("--hog", action="store_true", help="keep one core busy with a CPU-bound process meanwhile")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--figures", type=Path, default=None, help="copy each measured run's executed Gantt here")
    parser.add_argument("--database", choices=DATABASES, default="sqlite", help="the Prefect server's database")
    args = parser.parse_args()
    console = Console(highlight=False, stderr=args.json)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3flow-bench-"))
    workdir.chmod(0o755)  # PostgreSQL runs as its own user when this runs as root: it must pass through
    (workdir / "api-counts").mkdir(parents=True, exist_ok=True)
    checkout = Checkout(args.checkout.resolve(), workdir / "api-counts")
    config_path = workdir / "local.json"
    checkout.h3(
        "config-adapt", "--local", "--workdir", str(workdir), "--base-port", str(random.randint(30000, 50000)),
        "--database", args.database, "-o", str(config_path),
    )  # fmt: skip
    config = load_local_config(config_path)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    t0 = time.monotonic()
    checkout.h3("start", "--local", "-c", str(config_path), timeout=600)
    console.print(f"cluster up in {time.monotonic() - t0:.1f} s ({workdir}), load {os.getloadavg()[0]:.2f}")
    rows = []
    try:
        for name in args.scales:
            scale = SCALES[name]
            calibration = None
            if name == "demo":
                batch = workdir / "demo.json"
                demo = json.loads(DEMO_BATCH.read_text())
                for clip in demo["clips"]:  # absolute image paths; other seeds, so nothing is cached
                    clip["image"] = str((DEMO_BATCH.parent / clip["image"]).resolve())
                    clip["seed"] = clip["seed"] + 7000
                batch.write_text(json.dumps(demo))
            else:
                calibration, _ = run_batch(
                    checkout, config, config_path, batch_file(workdir, scale, CALIBRATION_CLIPS, 1000)
                )
                batch = batch_file(workdir, scale, scale.measured_clips, 5000)
            manifest, requests = run_batch(checkout, config, config_path, batch)
            row = figures(scale, config, calibration, manifest, requests)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            if args.figures:
                args.figures.mkdir(parents=True, exist_ok=True)
                gantt = Path(config.runs_dir) / manifest.run_id / "gantt.png"
                if gantt.exists():
                    shutil.copyfile(gantt, args.figures / f"orchestration-{name}.png")
    finally:
        checkout.h3("stop", "--local", "-c", str(config_path), timeout=600)
        if hog is not None:
            hog.kill()
    code = checkout.lines_of_code()
    summary = {"checkout": str(checkout.root), "hog": args.hog, "runtime_code_lines": code, "total": sum(code.values())}
    if args.json:
        print(json.dumps(summary), flush=True)
    show(console, rows, f"orchestration of {checkout.root.name}{' with a CPU hog' if args.hog else ''}")
    console.print(f"runtime code lines: {code} ({sum(code.values())} in all)")


if __name__ == "__main__":
    main()
