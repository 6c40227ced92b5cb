"""Files the operator gets are readable as the umask allows; the config and secrets are not.

A media server or Samba share running as another user must be able to read the MP4s,
reports and charts (0644 with umask 022); local.json and the transfer secret stay 0600.
A full disk names the place and the fix (a real, tiny tmpfs in a mount namespace).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_cli import make_config, make_run, runner  # tests/ is on sys.path (rootdir conftest)

from h3flow.cli import app
from h3flow.config.models import load_local_config
from h3flow.core.fsutil import atomic_write_text
from h3flow.media.mux import mux_mp4

ROOT = Path(__file__).resolve().parents[1]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_atomic_writes_follow_the_umask_and_private_ones_stay_0600(tmp_path: Path) -> None:
    with umask(0o022):
        atomic_write_text(tmp_path / "shared.txt", "x")
        atomic_write_text(tmp_path / "private.txt", "x", private=True)
    with umask(0o027):
        atomic_write_text(tmp_path / "group.txt", "x")
    assert (mode(tmp_path / "shared.txt"), mode(tmp_path / "private.txt"), mode(tmp_path / "group.txt")) == (
        0o644,
        0o600,
        0o640,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["group.txt", "private.txt", "shared.txt"]


def test_videos_reports_and_charts_are_readable_the_config_is_not(tmp_path: Path) -> None:
    from h3flow.pipeline.manifest import load_manifest
    from h3flow.pipeline.run_report import write_run_report

    with umask(0o022):
        frames = np.zeros((4, 64, 64, 3), np.uint8)
        video = mux_mp4(tmp_path / "out" / "clip.mp4", [frames], np.zeros((2, 8000), np.float32)).path
        config_path = make_config(tmp_path / "wd")
        run_id = make_run(config_path)
        config = load_local_config(config_path)
        paths = write_run_report(load_manifest(config.runs_dir, run_id), config)
        res = runner.invoke(
            app, ["config-adapt", "--local", "--workdir", str(tmp_path / "w2"), "-o", str(tmp_path / "l.json")]
        )
        assert res.exit_code == 0, res.output
        res = runner.invoke(
            app,
            [
                "plan",
                "--host-map",
                str(ROOT / "examples" / "host-map.example.json"),
                "--gantt",
                str(tmp_path / "p.png"),
            ],
        )
        assert res.exit_code == 0, res.output
    assert mode(video) == 0o644
    assert {name: mode(path) for name, path in paths.items() if path.exists()} == {
        name: 0o644 for name, path in paths.items() if path.exists()
    }
    assert (Path(config.runs_dir) / run_id / "report.md").exists()
    assert mode(tmp_path / "p.png") == 0o644  # the plan's Gantt chart
    assert mode(tmp_path / "l.json") == 0o600 and mode(config_path) == 0o600


def test_the_installed_node_pack_is_readable(tmp_path: Path) -> None:
    from h3flow.ops.comfy_install import PACK_NAME, install_node_pack

    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    (comfy / "main.py").write_text("")
    with umask(0o022):
        assert install_node_pack(comfy) == "installed"
    pack = comfy / "custom_nodes" / PACK_NAME
    assert mode(pack) == 0o755
    files = [p for p in pack.rglob("*") if p.is_file()]
    dirs = [p for p in pack.rglob("*") if p.is_dir()]
    assert files and {mode(p) for p in files} == {0o644} and {mode(p) for p in dirs} <= {0o755}


def test_the_transfer_secret_stays_0600(tmp_path: Path) -> None:
    from h3flow.config.secret import ensure_secret_file

    with umask(0o022):
        ensure_secret_file(tmp_path / "secrets" / "transfer.key")
    assert mode(tmp_path / "secrets" / "transfer.key") == 0o600


# --------------------------------------------------------------------------- a full disk
FULL_DISK = """
import json, sys
import numpy as np
from pathlib import Path
from h3flow.core.fsutil import atomic_write_bytes
from h3flow.handoff.store import LatentStore
from h3flow.media.mux import mux_mp4

disk, source = Path(sys.argv[1]), Path(sys.argv[2])
noise = np.random.default_rng(0).integers(0, 256, (48, 256, 256, 3), dtype=np.uint8)
cases = {
    "atomic": lambda: atomic_write_bytes(disk / "report.md", b"x" * 2_000_000),
    "mux": lambda: mux_mp4(disk / "videos" / "c.mp4", [noise], np.zeros((2, 96_000), np.float32)),
    "store": lambda: LatentStore(disk / "store").put_file(source),
}
out = {}
for name, case in cases.items():
    try:
        case()
        out[name] = None
    except Exception as exc:  # what the caller would see
        out[name] = [type(exc).__name__, getattr(exc, "errno", None), str(exc)]
out["left"] = sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if p.is_file())
print(json.dumps(out))
"""


def test_a_full_disk_names_the_place_and_the_fix(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private 256 KiB tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    source = tmp_path / "latent.bin"
    source.write_bytes(os.urandom(1_000_000))
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    mount_then_run = 'mount -t tmpfs -o size=256k tmpfs "$1" && exec "$2" "$3" "$1" "$4"'
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", mount_then_run, "sh", str(disk), sys.executable, str(script), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0 and "mount" in res.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    import json

    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["atomic"] == ["WriteError", 28, f"disk full on {disk}: free space and `h3flow resume`"]
    assert got["mux"] == ["WriteError", 28, f"disk full on {disk / 'videos'}: free space and `h3flow resume`"]
    assert got["store"] == ["WriteError", 28, f"disk full on {disk / 'store'}: free space and `h3flow resume`"]
    assert got["left"] == []  # no partial file, no temporary
