"""A real PostgreSQL whose postmaster was SIGKILLed and never reaped (a zombie, as in a
container whose PID 1 does not reap orphans) must start again: the setup step clears the
dead lock once the old backends have left its shared memory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from h3flow.ops.postgres import _pid_state, init_data_dir, probe_postgres, release_dead_lock
from h3flow.ops.services import postgres_path
from tests.cluster import wait_until
from tests.sshd import free_port

PG_BIN = next((d for d in postgres_path(None).split(":") if Path(d, "initdb").exists()), "")
pytestmark = pytest.mark.skipif(
    not PG_BIN, reason="Debian's postgresql is not installed (scripts/install-system-deps.sh)"
)


@pytest.fixture
def data() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="h3pg-"))
    root.chmod(0o755)  # PostgreSQL runs as its own user and must pass through
    try:
        yield root / "data"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _postmaster(data: Path, port: int) -> subprocess.Popen[bytes]:
    argv = [f"{PG_BIN}/postgres", "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-c", "unix_socket_directories="]
    user = "postgres" if os.geteuid() == 0 else None
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, user=user, cwd="/")


def _accepts(port: int) -> bool:
    return probe_postgres("127.0.0.1", port, "h3", "prefect")[0]


def test_a_zombie_postmasters_lock_is_released_and_postgres_starts_again(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{PG_BIN}:{os.environ['PATH']}")
    assert init_data_dir(data, "h3", "prefect", "secret", "postgres") is True
    port = free_port()
    first = _postmaster(data, port)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: _accepts(port), 60, "the first postmaster to accept connections")
        assert release_dead_lock(data) is False  # alive: its lock is not ours to touch
        first.kill()  # never waited for: a zombie, like an orphan under a PID 1 that does not reap
        wait_until(lambda: _pid_state(first.pid) == "Z", 10, "the postmaster to become a zombie")

        refused = _postmaster(data, port)  # what `h3flow start` hit before the fix
        assert refused.wait(timeout=30) != 0
        assert refused.stderr is not None and b'lock file "postmaster.pid" already exists' in refused.stderr.read()

        assert release_dead_lock(data) is True
        assert not (data / "postmaster.pid").exists()
        second = _postmaster(data, port)
        wait_until(lambda: _accepts(port), 60, "the restarted postmaster to accept connections")
        assert release_dead_lock(data) is False and (data / "postmaster.pid").exists()
    finally:
        first.wait(timeout=10)
        if second is not None:
            second.send_signal(signal.SIGINT)
            second.wait(timeout=60)
