"""A real ComfyUI on this machine, for tests and the demo: install it once, start servers.

No MiniMax H3 weights or GPUs are needed to exercise a real ComfyUI server, its
HTTP/websocket API, its custom-node loader and upstream's own MiniMax H3 nodes and model
code (with tiny weights), so the test setup installs one (see ``docs/comfyui.md``):

- the tree: ComfyUI 0.33.0, upstream commit 783545f6, which has the MiniMax H3 code.
  It comes from ``$H3FLOW_COMFYUI_SOURCE`` when set (a ComfyUI folder, a ``.tar.gz`` of
  one, or a git URL fetched at that commit), else from ``ComfyUI@783545f6.tar.gz`` in
  ``../shared/upstream`` beside the checkout (``$H3FLOW_UPSTREAM``), else from a git
  checkout of Comfy-Org/ComfyUI at that commit;
- a venv of its own with CPU ``torch==2.13.0`` and the tree's requirements, minus the
  optional template/docs packages. Not h3flow: the node pack needs nothing outside
  ComfyUI's own environment;
- torchaudio 2.11.1's Python code without its compiled extension, which cannot load
  against torch 2.13 (torchaudio then runs pure-Python, as it does when deployed without
  its libraries: ``resample``, the biquads, ``MelSpectrogram``; ComfyUI imports it at
  start-up and the H3 nodes call ``torchaudio.functional.resample``);
- a start-up hook (a ``.pth`` file) that lets PyPI's CUDA build of torchvision import
  under CPU torch, for ComfyUI and for any script run with the venv's Python.

Everything lives under ``${H3FLOW_CACHE:-~/.cache/h3flow}/comfyui-<key>`` (outside the
repo), is installed once under a file lock, and is reused while its stamp matches.
ComfyUI is GPL-3.0: a test tool installed at test time, never part of this repository.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.fsutil import file_lock, shared_mode
from h3flow.core.paths import NODE_PACK_DIR, SOURCE_DIR

COMFYUI_VERSION = "0.33.0"
COMFYUI_COMMIT = "783545f689a0af730065994b46b382ae24844c99"
COMFYUI_GIT = "https://github.com/Comfy-Org/ComfyUI.git"
ARCHIVE_NAME = f"ComfyUI@{COMFYUI_COMMIT[:8]}.tar.gz"
SOURCE_ENV = "H3FLOW_COMFYUI_SOURCE"
TORCH = "torch==2.13.0"
TORCHAUDIO = "torchaudio==2.11.1"  # its Python side; the compiled extension is removed (see the docstring)
# Requirements of the ComfyUI tree that are left out: torchaudio comes separately, the
# other two are optional (ComfyUI logs an error without them and runs).
SKIPPED_REQUIREMENTS = ("torchaudio", "comfyui-workflow-templates", "comfyui-embedded-docs")
STAMP_VERSION = 3
# folders of a ComfyUI tree that are not code (and a checkout's .git): not copied, not fingerprinted
TREE_SKIP = frozenset({".git", "__pycache__", "models", "custom_nodes", "input", "output", "temp", "user"})
# tarfile's "data" filter (Python 3.11.4+) refuses links out of the tree, device files and the like
SAFE_EXTRACT: dict[str, str] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}

TORCHVISION_SHIM = '''\
"""Let PyPI's (CUDA) torchvision import under CPU torch. Written by h3flow.ops.comfy_install.

torchvision's C++ library cannot load against CPU torch, so its Python side fails
registering fakes for ops that do not exist. Before the first ``import torchvision``
this defines the schemas of those ops (they then fail only if called, which no node
h3flow runs does), unless the library loads after all. Loaded at interpreter start
by ``h3flow_torchvision_shim.pth``, so ComfyUI and scripts run with this venv get it.
"""
import glob
import importlib.abc
import importlib.util
import os
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


class BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_missing_ops()
        return None


if not any(type(f).__name__ == "BeforeTorchvision" for f in sys.meta_path):
    sys.meta_path.insert(0, BeforeTorchvision())
'''

LAUNCHER = '''\
"""Start ComfyUI's main.py from a tree. Written by h3flow.ops.comfy_install.

Usage: python launch_comfyui.py COMFYUI_TREE [main.py args...]
(the venv's h3flow_torchvision_shim.pth has already made torchvision importable)
"""
import os
import runpy
import sys

tree = os.path.abspath(sys.argv[1])
sys.path.insert(0, tree)
sys.argv = [os.path.join(tree, "main.py")] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''

# what the installer checks before stamping: the shim and torchaudio's pure-Python path work
SMOKE = "import torch, torchvision, torchaudio.functional as F; F.resample(torch.zeros(1, 80), 8000, 16000)"


def cache_dir() -> Path:
    """``$H3FLOW_CACHE`` or ``~/.cache/h3flow``: installs shared by every checkout."""
    from h3flow.config.settings import settings

    return settings().cache


def shared_upstream() -> Path:
    """``../shared/upstream`` beside the checkout, or ``$H3FLOW_UPSTREAM``."""
    from h3flow.config.settings import settings

    return settings().upstream or SOURCE_DIR.parent / "shared" / "upstream"


@dataclass(frozen=True)
class ComfySource:
    """Where the ComfyUI tree comes from: a folder, a ``.tar.gz`` of one, or a git URL (at COMFYUI_COMMIT)."""

    kind: str  # "tree" | "archive" | "git"
    location: str
    identity: str  # what the install's stamp records: a change means a new install

    @property
    def key(self) -> str:
        """The cache folder's name: the pinned commit for the pinned tree, else a hash of the source."""
        if self.identity.endswith(COMFYUI_COMMIT):
            return f"comfyui-{COMFYUI_COMMIT[:8]}"
        return f"comfyui-{self.kind}-{hashlib.sha256(self.identity.encode()).hexdigest()[:12]}"

    def describe(self) -> str:
        return f"{self.kind} {self.location}"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tree_fingerprint(tree: Path) -> str:
    """Path and every .py file's size and mtime: a tree edited since is a new install."""
    digest = hashlib.sha256(str(tree.resolve()).encode())
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree)
        if TREE_SKIP & set(rel.parts):
            continue
        stat = path.stat()
        digest.update(f"{rel}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def comfyui_source() -> ComfySource:
    """The ComfyUI tree to install: ``$H3FLOW_COMFYUI_SOURCE``, else the shared archive, else git."""
    from h3flow.config.settings import settings

    given = (settings().comfyui_source or "").strip()
    if given:
        path = Path(given).expanduser()
        if path.is_dir():
            if not (path / "main.py").is_file() or not (path / "comfy").is_dir():
                raise ConfigError(f"{SOURCE_ENV}={given}: not a ComfyUI folder (no main.py and comfy/)")
            return ComfySource("tree", str(path.resolve()), "tree " + _tree_fingerprint(path))
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            digest = _sha256_of(path)
            return ComfySource("archive", str(path.resolve()), f"archive {digest}")
        if "://" in given or given.endswith(".git") or given.startswith("git@"):
            return ComfySource("git", given, f"git {given} {COMFYUI_COMMIT}")
        raise ConfigError(f"{SOURCE_ENV}={given}: neither a ComfyUI folder, a .tar.gz of one, nor a git URL")
    archive = shared_upstream() / ARCHIVE_NAME
    if archive.is_file():
        return ComfySource("archive", str(archive), f"archive {COMFYUI_COMMIT}")
    return ComfySource("git", COMFYUI_GIT, f"git {COMFYUI_COMMIT}")


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
    return ComfyInstall(cache_dir() / comfyui_source().key)


def _wanted_stamp(source: ComfySource) -> dict[str, object]:
    return {
        "stamp": STAMP_VERSION,
        "comfyui": source.identity,
        "torch": TORCH,
        "torchaudio": TORCHAUDIO,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _read_stamp(install: ComfyInstall) -> dict[str, object]:
    try:
        return dict(json.loads(install.stamp.read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _run(cmd: Sequence[str], log: Callable[[str], None], cwd: Path | None = None) -> str:
    log("$ " + " ".join(cmd))
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    except OSError as exc:
        raise H3FlowError(f"ComfyUI install step failed ({' '.join(cmd[:4])} ...): {exc.strerror or exc}") from None
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise H3FlowError(f"ComfyUI install step failed ({' '.join(cmd[:4])} ...): " + " | ".join(tail))
    return proc.stdout


def requirements_for(tree: Path) -> list[str]:
    """The tree's requirements, minus the skipped ones, with torch pinned to the CPU build."""
    wanted: list[str] = []
    for raw in (tree / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = line.split("=")[0].split(">")[0].split("<")[0].split("~")[0].split("[")[0].strip().lower()
        if name in SKIPPED_REQUIREMENTS:
            continue
        wanted.append(TORCH if name == "torch" else line)
    return wanted if TORCH in wanted else [TORCH, *wanted]


def _staging(dest: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=".tree-", dir=dest.parent))
    tmp.chmod(shared_mode(0o777))
    return tmp


def _finish_tree(tmp: Path, dest: Path, what: str) -> None:
    (tmp / "extra_model_paths.yaml").unlink(missing_ok=True)  # a foreign one would point ComfyUI elsewhere
    if not (tmp / "main.py").is_file() or not (tmp / "comfy").is_dir():
        raise H3FlowError(f"{what} holds no ComfyUI tree (no main.py and comfy/)")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _extract_archive(archive: Path, dest: Path) -> None:
    """A ``.tar.gz`` whose members sit under one top folder (``ComfyUI/``), unpacked to ``dest``."""
    tmp = _staging(dest)
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.strip("/")]
            tops = {m.name.split("/", 1)[0] for m in members}
            if len(tops) != 1:
                raise H3FlowError(f"{archive}: expected one top folder, found {len(tops)}")
            top = tops.pop() + "/"
            for member in members:
                if member.name.startswith(top) and member.name != top:
                    member.name = member.name[len(top) :]
                    tar.extract(member, tmp, **SAFE_EXTRACT)  # type: ignore[arg-type]
        _finish_tree(tmp, dest, str(archive))
    except (tarfile.TarError, OSError) as exc:
        raise H3FlowError(f"{archive}: cannot unpack it ({exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy_tree(tree: Path, dest: Path) -> None:
    tmp = _staging(dest)
    try:
        shutil.copytree(tree, tmp, dirs_exist_ok=True, ignore=lambda _d, names: [n for n in names if n in TREE_SKIP])
        _finish_tree(tmp, dest, str(tree))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _git_checkout(url: str, dest: Path, log: Callable[[str], None]) -> None:
    """The tree at COMFYUI_COMMIT from ``url`` (one shallow fetch of that commit), without .git."""
    tmp = _staging(dest)
    try:
        try:
            _run(["git", "init", "-q", str(tmp)], log)
            _run(["git", "-C", str(tmp), "fetch", "-q", "--depth", "1", url, COMFYUI_COMMIT], log)
            _run(["git", "-C", str(tmp), "checkout", "-q", "--detach", "FETCH_HEAD"], log)
        except H3FlowError as exc:
            raise H3FlowError(
                f"cannot fetch ComfyUI {COMFYUI_COMMIT[:8]} from {url} ({str(exc)[-200:]}); set {SOURCE_ENV} "
                f"to a ComfyUI folder or archive, or put {ARCHIVE_NAME} in {shared_upstream()}"
            ) from None
        shutil.rmtree(tmp / ".git")
        _finish_tree(tmp, dest, url)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _place_tree(source: ComfySource, dest: Path, log: Callable[[str], None]) -> None:
    log(f"ComfyUI tree from {source.describe()}")
    if source.kind == "archive":
        _extract_archive(Path(source.location), dest)
    elif source.kind == "tree":
        _copy_tree(Path(source.location), dest)
    else:
        _git_checkout(source.location, dest, log)


def site_packages(install: ComfyInstall) -> Path:
    """The install venv's site-packages (asked of its Python, not guessed)."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_run([str(install.python), "-c", code], lambda _line: None).strip())


def _torchaudio_without_extension(install: ComfyInstall, pip: list[str], log: Callable[[str], None]) -> None:
    """torchaudio's Python code, minus the compiled libraries that cannot load against torch 2.13."""
    _run([*pip, "--no-deps", TORCHAUDIO], log)
    for lib in sorted((site_packages(install) / "torchaudio").rglob("*.so")):
        lib.unlink()
        log(f"removed torchaudio/{lib.name}: its compiled extension does not load against {TORCH}")


def _write_shim(install: ComfyInstall) -> None:
    site = site_packages(install)
    (site / "h3flow_torchvision_shim.py").write_text(TORCHVISION_SHIM)
    (site / "h3flow_torchvision_shim.pth").write_text("import h3flow_torchvision_shim\n")


def ensure_comfyui(
    root: Path | None = None,
    *,
    source: ComfySource | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> ComfyInstall:
    """Install ComfyUI under ``root`` unless the same install is already there (idempotent).

    ``source`` defaults to :func:`comfyui_source`, ``root`` to the cache folder named
    after it. Takes a few minutes the first time (mostly pip), nothing after.
    """
    source = source or comfyui_source()
    install = ComfyInstall(Path(root)) if root else ComfyInstall(cache_dir() / source.key)
    wanted = _wanted_stamp(source)

    def ready() -> bool:
        return _read_stamp(install) == wanted and install.launcher.is_file() and (install.tree / "main.py").is_file()

    if ready():
        return install
    install.root.mkdir(parents=True, exist_ok=True)
    with file_lock(install.root / ".lock"):
        if ready():
            return install
        started = time.monotonic()
        install.stamp.unlink(missing_ok=True)
        if not install.python.exists():
            _run([sys.executable, "-m", "venv", str(install.venv)], log)
        _place_tree(source, install.tree, log)
        pip = [str(install.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        _run([*pip, TORCH], log)
        _run([*pip, *requirements_for(install.tree)], log)
        _torchaudio_without_extension(install, pip, log)
        _write_shim(install)
        install.launcher.write_text(LAUNCHER)
        _run([str(install.python), "-c", SMOKE], log)
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
