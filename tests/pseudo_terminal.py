"""Run a command in a real pseudo-terminal of a given width, as a user's terminal runs it.

Why not a pipe: rich (and Prefect) behave differently in a terminal — its width comes from
the terminal, progress bars redraw, and Prefect shows first-run notices only there. What
a user reads at 80 columns is only seen this way.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.cells import cell_len

ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>]")


@dataclass
class Screen:
    returncode: int
    raw: str  # everything the terminal received, escapes included

    @property
    def lines(self) -> list[str]:
        """The lines as the terminal shows them: escapes gone, a carriage return overwriting."""
        out = []
        for line in ESCAPES.sub("", self.raw).split("\n"):
            line = line.rstrip("\r")
            out.append(line.rsplit("\r", 1)[-1].rstrip())
        return out

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wider_than(self, columns: int) -> list[str]:
        return [line for line in self.lines if cell_len(line) > columns]


def run_in_terminal(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    columns: int = 80,
    rows: int = 50,
    timeout: float = 120.0,
) -> Screen:
    """``argv`` with stdin, stdout and stderr on a fresh pseudo-terminal of ``columns`` x ``rows``.

    COLUMNS and LINES are dropped from ``env``: the width must come from the terminal.
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    clean = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    clean.setdefault("TERM", "xterm-256color")
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=clean, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{argv[0]} still running after {timeout:g} s; it printed:\n" + _decode(chunks))
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    return Screen(proc.wait(timeout=60), _decode(chunks))


def _decode(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode(errors="replace")
