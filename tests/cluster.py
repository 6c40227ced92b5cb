"""A real embedded-default cluster for pipeline tests: Prefect server, workers, receiver.

Each cluster gets its own work dir, so Prefect's database (PREFECT_HOME), the result
storage and the stores are isolated per test module.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from h3flow.config.adapt import adapt, local_host_map, render
from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.fsutil import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
SLOW = {"spec": "sd", "seconds": 2, "steps": 24}
"""Reference-model clips a few seconds a sample: long enough to be caught mid-stage."""
quiet = Console(file=open(os.devnull, "w"), highlight=False)  # noqa: SIM115


def wait_until(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


SILENCE_S = 60.0
"""The test clusters' silence automation: a clip's run whose heartbeats (every 30 s) stop is Crashed
after this long (75 s by default; the shortest that is safe is a little over one beat)."""
DISPATCHER_SILENCE_S = 100.0
"""The same for a dispatcher (180 s by default): longer than the server outages the tests cause."""
SILENCES = {"H3FLOW_SILENCE_S": str(SILENCE_S), "H3FLOW_DISPATCHER_SILENCE_S": str(DISPATCHER_SILENCE_S)}


@dataclass
class Cluster:
    workdir: Path
    config_path: Path

    @property
    def config(self) -> LocalConfig:
        return load_local_config(self.config_path)

    def env(self) -> dict[str, str]:
        return {"PREFECT_API_URL": self.config.prefect.api_url, "PREFECT_HOME": str(self.workdir / "prefect")}

    def start(self) -> None:
        from h3flow.ops.lifecycle import start_services

        saved = {key: os.environ.get(key) for key in SILENCES}
        os.environ.update(SILENCES)  # `start` deploys the silence automations with them
        try:
            start_services(self.config, self.config_path, console=quiet, timeout=120)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key)
                else:
                    os.environ[key] = value

    def stop(self) -> None:
        from h3flow.ops.lifecycle import stop_services

        stop_services(self.config, self.config_path, console=quiet)

    def rebuild(self) -> None:
        """Stop this cluster and start a new one (new work dir, database and ports) in its place: after a
        hang, the cases that share a module's cluster start clean instead of queueing behind it."""
        self.stop()
        fresh = make_cluster(self.workdir.parent / f"{self.workdir.name}-rebuilt")
        self.workdir, self.config_path = fresh.workdir, fresh.config_path
        self.start()

    def h3(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The real CLI against this cluster."""
        env = {**os.environ, **self.env(), "COLUMNS": "200"}
        return subprocess.run(
            [H3FLOW, *args, "--config", str(self.config_path)], capture_output=True, text=True, env=env, timeout=timeout
        )

    def submit(self, batch: Path) -> str:
        """``h3flow run BATCH --background``: the run id."""
        res = self.h3("run", str(batch), "--background")
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout.strip().splitlines()[-1]

    def diagnosis(self, run_id: str, lines: int = 15) -> str:
        """What a failed fault test prints: the run's status, the batch run's log and each service's last lines."""
        parts = []
        for command in ("status", "logs"):
            try:
                parts.append(self.h3(command, run_id, timeout=60).stdout)
            except subprocess.TimeoutExpired:
                parts.append(f"(h3flow {command} timed out)")
        for log in sorted((self.workdir / "services").glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def dispatcher_record(self, run_id: str) -> str:
        """What Prefect holds on a run's dispatchers: each one's state and the events about it (heartbeats,
        states, the automations' triggers and actions), for a test that waits on the silence automation."""
        from prefect.client.orchestration import get_client
        from prefect.events.filters import EventAnyResourceFilter, EventFilter

        from h3flow.pipeline.prefect_api import PrefectApi, prefect_api

        lines = []
        with prefect_api(self.config):
            api = PrefectApi()
            try:
                runs = api.batch_runs(run_id)
            finally:
                api.close()
            with get_client(sync_client=True) as client:
                for run in runs:
                    state = run.state_type.value if run.state_type else "PENDING"
                    lines.append(f"dispatcher {run.id}: {state} {run.state.message if run.state else ''}")
                    page = client.read_events(
                        EventFilter(any_resource=EventAnyResourceFilter(id=[f"prefect.flow-run.{run.id}"])), limit=50
                    )
                    lines += [f"  {e.occurred:%H:%M:%S.%f} {e.event} {e.resource.id}" for e in page.events]
        return "\n".join(lines)

    def journal(self, host: str) -> list[dict]:
        path = Path(self.config.hosts[host].storage.root) / "journal.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def invocations(self, stage: str, clip: str | None = None) -> int:
        return sum(
            1
            for host in self.config.hosts
            for line in self.journal(host)
            if line["stage"] == stage and (clip is None or line["clip"] == clip)
        )

    def pidfile_pid(self, name: str) -> int:
        for pid_file in (self.workdir / "services").glob("*.pid"):
            if name in pid_file.name:
                return int(pid_file.read_text().split()[0])
        raise AssertionError(f"no pid file for {name}")


def make_cluster(workdir: Path, engine: str = "local") -> Cluster:
    """``engine="comfy"``: the stages run in one real local ComfyUI per pool (started by ``start``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    # below the kernel's ephemeral range (32768-60999): an outgoing connection can take a port
    # there between config-adapt's check and the service's bind (ComfyUI binds ~30 s later)
    hm = local_host_map(workdir, base_port=random.randint(20000, 32000), engine=engine)  # type: ignore[arg-type]
    config = adapt(hm, work_dir=str(workdir.resolve()))
    path = workdir / "local.json"
    atomic_write_json(path, render(config))
    return Cluster(workdir, path)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything under it (a worker and the flow runs it started)."""
    for victim in [pid, *descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def write_batch(path: Path, clips: list[dict]) -> Path:
    images = ROOT / "examples" / "images"
    full = [
        {"prompt": "slow pan left, calm", "image": str(images / "landscape.png"), "spec": "tiny", "seconds": 2, **c}
        for c in clips
    ]
    path.write_text(json.dumps({"name": path.stem, "clips": full}))
    return path
