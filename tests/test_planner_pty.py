"""``h3flow plan`` in a real 80-column terminal (a pseudo-terminal, not a pipe): nothing is cut, nothing
is wider than the terminal, the baseline is explained, and topologies sized for another cluster are one line."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

from rich.cells import cell_len

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "host-map.example.json")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def h3flow() -> list[str]:
    script = Path(sys.executable).parent / "h3flow"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from h3flow.cli import app; app()"]


def in_terminal(args: list[str], cwd: Path, columns: int = 80) -> tuple[int, str]:
    """Run ``h3flow ARGS`` attached to a pseudo-terminal of ``columns`` x 60; its screen output, ANSI removed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        [*h3flow(), *args], stdin=follower, stdout=follower, stderr=follower, cwd=cwd, env=env, close_fds=True
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    code = proc.wait(timeout=300)
    return code, ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r", "")


def check_fits(out: str, columns: int = 80) -> list[str]:
    lines = out.splitlines()
    assert "…" not in out, "a cell was cut"
    too_wide = [line for line in lines if cell_len(line) > columns]
    assert not too_wide, too_wide
    return lines


def test_the_plan_reads_whole_in_an_80_column_terminal(tmp_path: Path) -> None:
    code, out = in_terminal(["plan", "--host-map", EXAMPLE, "--time-limit", "0.5"], tmp_path)
    assert code == 0, out
    lines = check_fits(out)
    # the table's rows: a two-character mark (★ recommended), the topology, then seven figures
    rows = {line[2:].split()[0]: line for line in lines if len(line[2:].split()) == 7 and line[2:3] != " "}
    for name in ("four_plus_one", "eight_plus_one", "four_four_plus_one", "four_four_xtx_plus_one"):
        assert name in rows, (name, out)  # every id whole, at the start of its row
    four_four = rows["four_four_plus_one"]
    assert four_four.startswith("★ ") and four_four[2:].split()[1:] == [
        "72.75",
        "79.23",
        "+48.5%",
        "296.9",
        "296.9",
        "optimal",
    ]
    assert rows["eight_plus_one"][2:].split()[3] == "base"
    text = " ".join(out.split())
    assert "recommended: four_four_plus_one: 72.75 clips/h at 6 clips" in text


def test_the_embedded_default_explains_its_baseline_and_summarises_what_cannot_run(tmp_path: Path) -> None:
    adapt = subprocess.run(
        [*h3flow(), "config-adapt", "--local", "-o", "local.json", "--workdir", str(tmp_path / ".h3flow")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert adapt.returncode == 0, adapt.stdout + adapt.stderr
    host = json.loads((tmp_path / "local.json").read_text())["pools"][0]["host"]
    code, out = in_terminal(["plan", "-c", "local.json", "--time-limit", "0.5"], tmp_path)
    assert code == 0, out
    check_fits(out)
    text = " ".join(out.split())
    # "baseline: 2 (753.31 clips/h)" said nothing: now what the baseline is, and that it is only for comparison
    assert f"base (the 'vs base' column) is 2: all 2 × cpu GPUs of {host} in one pool and no extra sampler host" in text
    # six "cannot run" lines for topologies sized for the design's cluster: one line now
    assert "cannot run" not in out
    sized = [line for line in out.splitlines() if line.startswith("not planned, 6 topologies need more GPUs")]
    assert len(sized) == 1, out
    assert "recommended: one_one_plus_one: the only topology asked for that runs on this hardware" in text


def test_piped_the_plan_is_as_narrow_as_in_a_terminal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [*h3flow(), "plan", "--host-map", EXAMPLE, "--time-limit", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    check_fits(proc.stdout)  # it was 130+ columns wide


def test_the_terminal_helper_sees_the_width_it_set(tmp_path: Path) -> None:
    # the check above is only worth something if the child really saw an 80-column terminal
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys; print(os.get_terminal_size(1).columns, sys.stdout.isatty())\n")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, str(probe)], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    proc.wait(timeout=60)
    out = os.read(leader, 1024).decode()
    os.close(leader)
    assert out.split() == ["80", "True"]
