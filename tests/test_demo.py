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
    res = subprocess.run(
        [
            str(Path(sys.prefix) / "bin" / "h3flow"),
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
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 clips delivered" in res.stdout and "Prefect UI: http://127.0.0.1:" in res.stdout
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
    assert ("postgres" in res.stdout) == (database == "postgresql")  # its own service, started and stopped
    shutil.rmtree(root, ignore_errors=True)
