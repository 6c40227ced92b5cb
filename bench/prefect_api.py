"""Prefect API latency under the dispatcher's load: SQLite vs PostgreSQL, in the same run.

    .venv/bin/python bench/prefect_api.py [--rounds 10] [--per-round 20]

Starts two embedded-default clusters side by side: one whose Prefect server keeps its
database in SQLite (the embedded default), one on a PostgreSQL server (Debian's, as
``h3flow start`` runs it for a cluster). Each has five workers polling every second with
heartbeats every 5 s (the embedded default's four, plus one on a spare pool). Then, in
the dispatcher's order, it makes the calls the dispatcher makes, through the same client
(:class:`h3flow.pipeline.prefect_api.PrefectApi` semantics):

- ``create``: create a flow run from a deployment (on a pool no worker serves, so
  nothing executes);
- ``runs``: read flow runs by id (the last 8 created);
- ``artifacts``: read a flow run's table artifacts;
- ``workers``: read a work pool's workers.

Rounds alternate between the two servers (A B A B …) so that the load of this shared
machine falls on both alike. Prints per server and call: calls/s, p50 and p99 in ms,
and PostgreSQL's p50 as a ratio of SQLite's, measured in this run; plus the count of
"database is locked" lines in each server's log.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from h3flow.config.adapt import adapt, local_host_map, render
from h3flow.config.models import DatabaseKind, LocalConfig
from h3flow.core.fsutil import atomic_write_json
from h3flow.ops.lifecycle import start_services, stop_services
from h3flow.ops.services import LocalRunner, service_dir, worker_spec
from h3flow.pipeline.prefect_api import prefect_api

CALLS = ("create", "runs", "artifacts", "workers")
SINK_POOL = "bench-sink"  # created runs land here; no worker serves it
EXTRA_POOL = "bench-extra"  # the fifth polling worker


def make_config(root: Path, database: DatabaseKind) -> tuple[LocalConfig, Path]:
    workdir = root / database
    workdir.mkdir(parents=True)
    hm = local_host_map(workdir, base_port=random.randint(30000, 50000), database=database)
    config = adapt(hm, work_dir=str(workdir.resolve()))
    path = workdir / "local.json"
    atomic_write_json(path, render(config))
    return config, path


class Target:
    """One cluster under test: its config, a sync client, and the ids the calls need."""

    def __init__(self, name: str, config: LocalConfig, path: Path) -> None:
        self.name, self.config, self.path = name, config, path
        self.samples: dict[str, list[float]] = {call: [] for call in CALLS}
        self.created: list[Any] = []
        self.elapsed = 0.0

    def open(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate
        from prefect.exceptions import ObjectAlreadyExists

        self._context = prefect_api(self.config)
        self._context.__enter__()
        self.client = get_client(sync_client=True)
        self.client.__enter__()
        try:
            self.client.create_work_pool(WorkPoolCreate(name=SINK_POOL, type="process"))
        except ObjectAlreadyExists:
            pass
        flow_id = self.client.create_flow_from_name("bench-flow")
        self.deployment = self.client.create_deployment(flow_id, "bench", work_pool_name=SINK_POOL)
        self.artifact_run = self.client.create_flow_run_from_deployment(self.deployment, name="with-artifact").id

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self._context.__exit__(None, None, None)

    def round(self, calls: int) -> None:
        from prefect.client.schemas.filters import (
            ArtifactFilter,
            ArtifactFilterFlowRunId,
            ArtifactFilterType,
            FlowRunFilter,
            FlowRunFilterId,
        )

        client = self.client
        steps: dict[str, Callable[[], Any]] = {
            "create": lambda: self.created.append(
                client.create_flow_run_from_deployment(self.deployment, name=f"b{len(self.created)}").id
            ),
            "runs": lambda: client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=self.created[-8:]))
            ),
            "artifacts": lambda: client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[self.artifact_run]),
                    type=ArtifactFilterType(any_=["table"]),
                )
            ),
            "workers": lambda: client.read_workers_for_work_pool("h3-a0"),
        }
        begin = time.perf_counter()
        for _ in range(calls):
            for call, step in steps.items():
                tick = time.perf_counter()
                step()
                self.samples[call].append(time.perf_counter() - tick)
        self.elapsed += time.perf_counter() - begin


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def locked_lines(config: LocalConfig) -> int:
    log = service_dir(config) / "prefect-server.log"
    return log.read_text(errors="replace").count("database is locked") if log.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10, help="rounds per server (alternating)")
    parser.add_argument("--per-round", type=int, default=20, help="iterations of the four calls per round")
    args = parser.parse_args()
    console = Console(highlight=False)
    root = Path(tempfile.mkdtemp(prefix="h3flow-bench-api-", dir="/tmp"))
    root.chmod(0o755)  # PostgreSQL runs as its own user when this runs as root: it must pass through
    targets = [Target(db, *make_config(root, db)) for db in ("sqlite", "postgresql")]
    runner = LocalRunner()
    extra = []
    try:
        for t in targets:
            begin = time.monotonic()
            start_services(t.config, t.path, console=console, timeout=180)
            spec = worker_spec(t.config, t.path, service_dir(t.config), EXTRA_POOL, t.config.pools[0].host, {})
            runner.spawn(spec)
            extra.append((spec, runner))
            console.print(f"{t.name}: cluster up in {time.monotonic() - begin:.1f} s (+ a fifth worker)")
            t.open()
        for t in targets:
            t.round(3)  # warm up: connection pools, caches
            t.samples = {call: [] for call in CALLS}
            t.elapsed = 0.0
        for _ in range(args.rounds):
            for t in targets:
                t.round(args.per_round)
        load = os.getloadavg()
    finally:
        for t in targets:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - a bench tears down what it can
                pass
        for spec, run in extra:
            proc = run.inspect(spec)
            if proc.running and proc.pid:
                run.stop(spec, proc.pid)
        for t in targets:
            stop_services(t.config, t.path, console=console)
    n = args.rounds * args.per_round
    console.print(
        f"\n{n} iterations of the dispatcher's four calls per server, five workers polling each "
        f"(load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, {os.cpu_count()} CPUs)"
    )
    console.print(f"{'database':<11}{'call':<11}{'calls/s':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for t in targets:
        for call in CALLS:
            values = t.samples[call]
            console.print(
                f"{t.name:<11}{call:<11}{len(values) / sum(values):9.1f}{p(values, 0.5):9.1f}{p(values, 0.99):9.1f}"
            )
        total = sum(len(v) for v in t.samples.values())
        console.print(
            f"{t.name:<11}{'all':<11}{total / t.elapsed:9.1f}  'database is locked' in its log: {locked_lines(t.config)}"
        )
    sqlite, pg = targets
    for call in CALLS:
        ratio = statistics.median(pg.samples[call]) / statistics.median(sqlite.samples[call])
        console.print(f"p50 PostgreSQL ÷ SQLite, {call}: {ratio:.2f}")


if __name__ == "__main__":
    main()
