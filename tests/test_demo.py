"""`h3flow demo`: the README's main job, end to end, on a small batch."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import av
import pytest
from cluster import write_batch

pytestmark = pytest.mark.prefect


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_demo_runs_the_embedded_default_and_stops_its_services(tmp_path: Path, database: str) -> None:
    if database == "postgresql" and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("Debian's postgresql is not installed (scripts/install-system-deps.sh)")
    batch = write_batch(
        tmp_path / "mini.json", [{"id": "m0", "seed": 1}, {"id": "m1", "seed": 2, "prompt": "fast zoom in"}]
    )
    root = Path(tempfile.mkdtemp(prefix="h3demo-"))  # PostgreSQL runs as its own user: it must pass through
    root.chmod(0o755)
    workdir = root / "wd"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "COLUMNS")}  # a log: 80 columns
    h3flow = str(Path(sys.prefix) / "bin" / "h3flow")
    res = subprocess.run(
        [
            h3flow,
            "demo",
            "--workdir",
            str(workdir),
            "--batch",
            str(batch),
            "--base-port",
            str(random.randint(30000, 50000)),
            "--database",
            database,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=root,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 clips delivered" in res.stdout
    (run_dir,) = (workdir / "runs").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["state"] == "completed"
    for clip in manifest["clips"].values():
        with av.open(clip["output"]) as container:
            assert container.streams.video[0].frames > 0 and container.streams.audio[0].rate == 48000
    assert (run_dir / "gantt.png").stat().st_size > 10_000 and (run_dir / "report.md").exists()
    assert f"gantt:    {run_dir / 'gantt.png'}\n" in res.stdout  # whole lines, however long
    outputs = sorted({str(Path(c["output"]).parent) for c in manifest["clips"].values()})
    assert f"videos:   {', '.join(outputs)}\n" in res.stdout and "…" not in res.stdout
    # the services were stopped, by PID: their PID files are gone
    assert (workdir / "services").is_dir() and not list((workdir / "services").glob("*.pid"))
    assert "stopped" in res.stdout
    # the last lines: how to look at the run, the services being stopped (no dead UI link)
    end = res.stdout[res.stdout.index("Look at what it made") :]
    found = shutil.which("h3flow", path=env.get("PATH"))
    on_path = found is not None and Path(found).samefile(h3flow)  # then it is printed as plain `h3flow`
    h3 = "h3flow" if on_path else h3flow
    run_id, c = manifest["run_id"], " -c wd/local.json"  # not found by itself from there: named
    assert end.splitlines() == [
        "Look at what it made (the services are stopped: the UI and logs need them):",
        f"  start   {h3} start --local{c}",
        f"  UI      {h3} open {run_id}{c}",
        f"  status  {h3} status {run_id}{c}",
        f"  MP4s    ls wd/store/host-b/outputs/{run_id}",
        f"  logs    {h3} logs {run_id}{c}",
        f"  stop    {h3} stop --local{c}",
        *([] if on_path else [f"`source {Path(h3flow).parent / 'activate'}` puts h3flow on your PATH"]),
    ]
    closing = res.stdout[res.stdout.index("✓ run ") :]
    assert "Prefect UI" not in closing  # its server has stopped
    assert ("postgres" in res.stdout) == (database == "postgresql")  # its own service, started and stopped
    shutil.rmtree(root, ignore_errors=True)


def test_make_demo_keeps_the_services_for_a_look_and_make_stop_ends_them() -> None:
    root = Path(__file__).resolve().parents[1]

    def planned(*args: str) -> str:
        done = subprocess.run(["make", "-n", *args], cwd=root, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert ".venv/bin/h3flow demo --keep" in planned("demo")
    no_keep = planned("demo", "KEEP=no", "DEMO_ARGS=--database postgresql")
    assert "--keep" not in no_keep and ".venv/bin/h3flow demo  --database postgresql" in no_keep
    assert ".venv/bin/h3flow stop --local -c .h3flow/local.json" in planned("stop")


def test_the_readmes_first_screen_goes_from_make_demo_to_the_result() -> None:
    """What a newcomer sees without scrolling (24 lines): make demo, then the commands
    that look at what it made, as they work from the checkout (h3flow is not on PATH)."""
    screen = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()[:24]
    text = "\n".join(screen)
    commands = ("\nmake demo", "\n.venv/bin/h3flow open", "\n.venv/bin/h3flow status", "\nmake stop")
    at = [text.index(command) for command in commands]  # lines that start with the command: to copy and paste
    assert at == sorted(at)
    assert "ls .h3flow/store/host-b/outputs/" in text and "source .venv/bin/activate" in text
