"""How often a Prefect server killed mid-work leaves a GPU slot taken that no lease holds — as
Prefect ships its server, and as h3flow starts it (the slots settled before it serves).

    .venv/bin/python bench/slot_restart.py [--kills 15] [--seed 1]

Starts a real Prefect server (SQLite, leases on disk: h3flow's ``SERVER_SETTINGS``) with a
global concurrency limit of 1. Three client threads take the slot with a lease and give it
back as fast as they can; after a random 0.5–2 s the server is SIGKILLed (the same kill
times for both rows), then started again. A slot is *stuck* when the restarted server counts
more taken slots than its stored leases hold: no holder gives it back and no lease expires
to free it, so every later waiter waits for good. Rows, in the same run:

- ``prefect server start``: Prefect's server as shipped;
- ``h3flow.ops.prefect_server``: the server ``h3flow start`` runs (settles the slots first).

Prints per row the kills, the restarts that left a slot stuck, and those that left a lease
the clients never heard of (it frees its slot when it expires: a wait, not a hang).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx
from gpu_slot import free_port
from rich.console import Console
from rich.table import Table

from h3flow.core.contracts import gpu_limit
from h3flow.ops.services import SERVER_SETTINGS

LIMIT = gpu_limit("bench")
LAUNCHERS = {
    "prefect server start": [str(Path(sys.prefix) / "bin" / "prefect")],
    "h3flow.ops.prefect_server": [sys.executable, "-m", "h3flow.ops.prefect_server"],
}


def start(launcher: list[str], home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", **SERVER_SETTINGS)
    argv = [*launcher, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with open(home / "server.log", "a") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the Prefect server did not start: see {home / 'server.log'}")
        time.sleep(0.2)  # a start-up poll


def churn(api: str, stop: threading.Event) -> None:
    """Take the slot with a lease and give it back, until the server goes away."""
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            try:
                taken = client.post(
                    f"{api}/increment-with-lease", json={"names": [LIMIT], "slots": 1, "lease_duration": 60}
                )
                if taken.status_code == 200:
                    client.post(f"{api}/decrement-with-lease", json={"lease_id": taken.json()["lease_id"]})
            except httpx.HTTPError:
                return


def call(method: str, url: str, **kwargs: object) -> httpx.Response:
    """One API call, asked again while the just-started server answers 503 (SQLite busy as it starts)."""
    for _ in range(40):
        response = httpx.request(method, url, timeout=10, **kwargs)  # type: ignore[arg-type]
        if response.status_code != 503:
            return response.raise_for_status()
        time.sleep(0.25)  # the server's own start-up writes
    return response.raise_for_status()


def leases(home: Path) -> int:
    index = home / "concurrency_leases" / "expirations.json"
    return len(json.loads(index.read_text())) if index.exists() else 0


def row(name: str, kills: int, seed: int) -> tuple[int, int]:
    """(restarts that left a slot stuck, restarts that left an orphan lease) over ``kills`` kills."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="h3flow-slot-restart-") as tmp:
        home, port = Path(tmp), free_port()
        api = f"http://127.0.0.1:{port}/api/v2/concurrency_limits"
        proc = start(LAUNCHERS[name], home, port)
        call("POST", f"{api}/", json={"name": LIMIT, "limit": 1})
        stuck = orphans = 0
        for _ in range(kills):
            stop = threading.Event()
            clients = [threading.Thread(target=churn, args=(api, stop)) for _ in range(3)]
            for client in clients:
                client.start()
            time.sleep(rng.uniform(0.5, 2.0))  # when the kill lands is the experiment
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stop.set()
            for client in clients:
                client.join()
            proc = start(LAUNCHERS[name], home, port)
            active, held = call("GET", f"{api}/{LIMIT}").json()["active_slots"], leases(home)
            stuck += active > held
            orphans += held > 0
            # the next kill starts clean: no slot taken, no lease
            call("PATCH", f"{api}/{LIMIT}", json={"active_slots": 0})
            for lease in (home / "concurrency_leases").glob("*.json"):
                lease.unlink()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return stuck, orphans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    table = Table(title=f"a Prefect server SIGKILLed {args.kills} times under clients taking and giving back a slot")
    for column in ("server", "kills", "a slot stuck (a hang)", "an orphan lease (a wait)"):
        table.add_column(column)
    for name in LAUNCHERS:
        stuck, orphans = row(name, args.kills, args.seed)
        table.add_row(name, str(args.kills), str(stuck), str(orphans))
    Console().print(table)


if __name__ == "__main__":
    main()
