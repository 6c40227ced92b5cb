"""Cache locks die with their holder: a process killed while holding one blocks nobody."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from h3flow.pipeline.tasks.locks import ProcessLockManager

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from h3flow.pipeline.tasks.locks import ProcessLockManager
    locks = ProcessLockManager(Path(sys.argv[1]))
    assert locks.acquire_lock("sample-k", "dead-holder")
    print("held", flush=True)
    time.sleep(600)  # held until SIGKILL: the OOM killer's victim
    """
)


def test_a_lock_held_by_a_killed_process_is_taken_over_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        locks = ProcessLockManager(tmp_path)
        assert locks.is_locked("sample-k")
        assert not locks.acquire_lock("sample-k", "me", acquire_timeout=0.2), "a live holder keeps it"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with caplog.at_level(logging.WARNING):
            assert locks.acquire_lock("sample-k", "me", acquire_timeout=5)
        assert "dead-holder" in caplog.text and "died holding it" in caplog.text
        assert locks.is_lock_holder("sample-k", "me") and not locks.is_lock_holder("sample-k", "dead-holder")
    finally:
        holder.kill()


def test_release_frees_it_for_the_next_holder_without_a_takeover_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = ProcessLockManager(tmp_path), ProcessLockManager(tmp_path)
    assert first.acquire_lock("k", "a")
    assert not second.acquire_lock("k", "b", acquire_timeout=0.1), "two managers in one process still exclude"
    assert not second.wait_for_lock("k", timeout=0.1)
    with pytest.raises(ValueError, match="does not hold"):
        first.release_lock("k", "b")
    first.release_lock("k", "a")
    assert not first.is_locked("k") and second.wait_for_lock("k", timeout=1)
    with caplog.at_level(logging.WARNING):
        assert second.acquire_lock("k", "b", acquire_timeout=1)
    assert "died holding it" not in caplog.text
