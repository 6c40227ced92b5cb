"""How long a pool's GPU sits idle between two clips: Prefect's global concurrency limit alone,
against h3flow's ``gpu_slot`` (a lock in the worker's process, then the same limit).

    .venv/bin/python bench/gpu_slot.py [--hold 3] [--handovers 8]

Starts a real Prefect server (SQLite) and makes a global concurrency limit of 1. Two
threads — a pool's two clips in flight — take turns: each takes the slot, holds it for
``--hold`` seconds (a clip's GPU stages), lets it go and asks again. The gap is the time
from one thread letting go to the other holding it. Rows, measured in the same run:

- ``prefect, default server``: ``concurrency()`` alone against a server with Prefect's
  default ``maximum_concurrency_slot_wait_seconds`` (30 s): a refused acquire waits the
  ``Retry-After`` the server sends (the slot's average occupancy, capped);
- ``prefect, h3flow's server``: the same against a server started with h3flow's settings
  (the cap at 2 s);
- ``h3flow gpu_slot``: :func:`h3flow.pipeline.gpu_slot.gpu_slot` on h3flow's server.

Prints per row the median and largest gap, and the API calls per hand-over.
"""

from __future__ import annotations

import argparse
import contextvars
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx
from rich.console import Console
from rich.table import Table

from h3flow.ops.services import SERVER_SETTINGS

Slot = Callable[[str], AbstractContextManager[None]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prefect_server(home: Path, settings: dict[str, str]) -> Iterator[str]:
    """A Prefect server on SQLite in ``home``; yields its API URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", **settings)
    argv = [str(Path(sys.prefix) / "bin" / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    log = open(home / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the Prefect server did not start: see {home / 'server.log'}")
            time.sleep(0.5)  # a start-up poll
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


class Counted:
    """Counts the HTTP requests this process sends (httpx), to report calls per hand-over."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()
        original = httpx.Client.send

        def send(client: httpx.Client, request: httpx.Request, *args: object, **kwargs: object) -> httpx.Response:
            with self._lock:
                self.n += 1
            return original(client, request, *args, **kwargs)  # type: ignore[arg-type]

        httpx.Client.send = send  # type: ignore[method-assign]


def handovers(slot: Slot, name: str, hold: float, turns: int, counted: Counted) -> tuple[list[float], float]:
    """Two threads taking turns on the slot; the gaps between one's release and the other's hold."""
    events: list[tuple[str, float]] = []
    guard = threading.Lock()
    calls_before = counted.n

    def clip_stream() -> None:
        for _ in range(turns):
            with slot(name):
                with guard:
                    events.append(("held", time.monotonic()))
                time.sleep(hold)  # the clip's GPU work, simulated
                with guard:
                    events.append(("released", time.monotonic()))

    # each thread in a copy of this context: Prefect's settings (the API URL) are context variables
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(clip_stream,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events.sort(key=lambda e: e[1])
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(events) if a[0] == "released" and b[0] == "held"]
    return gaps, (counted.n - calls_before) / max(1, 2 * turns)


def prefect_slot(name: str) -> AbstractContextManager[None]:
    from prefect.concurrency.sync import concurrency

    return concurrency(name, occupy=1, strict=True, lease_duration=60, raise_on_lease_renewal_failure=False)


def h3flow_slot(name: str) -> AbstractContextManager[None]:
    from h3flow.pipeline.gpu_slot import gpu_slot

    return gpu_slot(name.removeprefix("h3flow-gpu-"))


def measure(
    url: str, home: Path, name: str, slot: Slot, hold: float, turns: int, counted: Counted
) -> tuple[list[float], float]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_API_URL: url, PREFECT_HOME: str(home / "client")}):
        with get_client(sync_client=True) as client:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        return handovers(slot, name, hold, turns, counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=3.0, help="seconds a clip holds the GPUs")
    parser.add_argument("--handovers", type=int, default=8, help="turns per thread")
    args = parser.parse_args()
    console = Console()
    counted = Counted()
    rows = []
    with tempfile.TemporaryDirectory(prefix="h3flow-gpu-slot-") as tmp:
        cases = [
            ("prefect, default server", {}, prefect_slot),
            ("prefect, h3flow's server", SERVER_SETTINGS, prefect_slot),
            ("h3flow gpu_slot", SERVER_SETTINGS, h3flow_slot),
        ]
        for n, (label, settings, slot) in enumerate(cases):
            home = Path(tmp) / f"server-{n}"
            home.mkdir()
            # a limit name per case: Prefect keeps one acquiring service (and its client) per name in a process
            with prefect_server(home, settings) as url:
                gaps, calls = measure(url, home, f"h3flow-gpu-bench{n}", slot, args.hold, args.handovers, counted)
            rows.append((label, statistics.median(gaps), max(gaps), calls, len(gaps)))
    table = Table(title=f"GPU slot hand-over, {args.hold:g} s holds, load {os.getloadavg()[0]:.1f}")
    for col in ("slot", "gap median s", "gap max s", "API calls / hold", "hand-overs"):
        table.add_column(col)
    for label, median, largest, calls, n in rows:
        table.add_row(label, f"{median:.3f}", f"{largest:.3f}", f"{calls:.1f}", str(n))
    console.print(table)


if __name__ == "__main__":
    main()
