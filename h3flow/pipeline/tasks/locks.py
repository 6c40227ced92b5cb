"""Prefect cache locks that die with the process holding them.

Prefect's own ``FileSystemLockManager`` writes a lock file with no expiry: a flow-run
process killed while it holds one (the OOM killer mid-sample) leaves a lock that never
goes away, and every later try of that stage waits on it forever. These locks are
``flock`` locks on an open descriptor instead: the kernel drops them the moment their
process dies, so the next holder takes over at once (and says so in the log).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)
SPIN = 0.05  # seconds between non-blocking tries while a timeout is running


class ProcessLockManager:
    """Prefect's ``LockManager`` protocol on ``flock``: one lock file per cache key, host-local."""

    def __init__(self, lock_files_directory: Path) -> None:
        self.directory = Path(lock_files_directory)
        self._held: dict[str, tuple[str, IO[str]]] = {}  # key -> (holder, the open file that holds it)
        self._guard = threading.Lock()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.lock"

    def _open(self, key: str) -> IO[str]:
        self.directory.mkdir(parents=True, exist_ok=True)
        return open(self._path(key), "a+", encoding="utf-8")

    @staticmethod
    def _try(handle: IO[str], timeout: float | None, mode: int = fcntl.LOCK_EX) -> bool:
        if timeout is None:
            fcntl.flock(handle, mode)
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(SPIN)  # polling a lock with a deadline: flock has no timed wait

    def acquire_lock(
        self, key: str, holder: str, acquire_timeout: float | None = None, hold_timeout: float | None = None
    ) -> bool:
        """Take the lock (``hold_timeout`` is not needed: the lock ends with its process)."""
        with self._guard:
            if key in self._held:
                return self._held[key][0] == holder
        handle = self._open(key)
        if not self._try(handle, acquire_timeout):
            handle.close()
            return False
        handle.seek(0)
        previous = handle.read().strip()
        if previous:  # released locks are emptied: this one's holder died holding it
            log.warning("cache lock %s: taking over from %s, which died holding it", key[:24], previous)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"holder": holder, "pid": os.getpid(), "host": socket.gethostname()}))
        handle.flush()
        with self._guard:
            self._held[key] = (holder, handle)
        return True

    async def aacquire_lock(
        self, key: str, holder: str, acquire_timeout: float | None = None, hold_timeout: float | None = None
    ) -> bool:
        import anyio

        return await anyio.to_thread.run_sync(self.acquire_lock, key, holder, acquire_timeout, hold_timeout)

    def release_lock(self, key: str, holder: str) -> None:
        with self._guard:
            held = self._held.get(key)
            if held is None or held[0] != holder:
                raise ValueError(f"cache lock {key}: {holder} does not hold it")
            del self._held[key]
        _, handle = held
        with contextlib.suppress(OSError):
            handle.seek(0)
            handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()

    def is_locked(self, key: str, use_cache: bool = False) -> bool:
        if not self._path(key).exists():
            return False
        with self._open(key) as handle:
            if self._try(handle, 0):
                fcntl.flock(handle, fcntl.LOCK_UN)
                return False
        return True

    def is_lock_holder(self, key: str, holder: str) -> bool:
        with self._guard:
            held = self._held.get(key)
        return held is not None and held[0] == holder

    def wait_for_lock(self, key: str, timeout: float | None = None) -> bool:
        if not self._path(key).exists():
            return True
        with self._open(key) as handle:
            if not self._try(handle, timeout, fcntl.LOCK_SH):
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
        return True

    async def await_for_lock(self, key: str, timeout: float | None = None) -> bool:
        import anyio

        return await anyio.to_thread.run_sync(self.wait_for_lock, key, timeout)
