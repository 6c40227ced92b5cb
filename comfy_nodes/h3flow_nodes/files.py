"""Files named by content, written atomically: the pack's and h3flow's only way to disk.

Every file is written to a temporary sibling, fsynced, then renamed over the target,
so a reader never sees a partial file and a crash leaves at most a stray ``.tmp-*``
file, never a damaged output. A :class:`FileRef` (path + SHA-256 + size) is what a
writer hands back. h3flow re-exports these (``h3flow.core.fsutil``, ``h3flow.core.files``).

Files get the mode the process's umask allows (0644 with umask 022: a media server or a
Samba share running as another user can read the videos), except ``private`` ones (a
config, a secret): 0600. A full disk or a read-only file system raises
:class:`~h3flow_nodes.errors.WriteError`, which names the place and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .errors import WriteError

CHUNK = 1 << 20
PRIVATE = 0o600


def current_umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a moment,
    for every thread) where Linux reports it; else by setting it back at once."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shared_mode(base: int = 0o666) -> int:
    """``base`` as the umask allows: what ``open()`` would give a new file (0644 with umask 022)."""
    return base & ~current_umask()


def sha256_file(path: str | os.PathLike[str], chunk: int = CHUNK) -> str:
    """SHA-256 of a file's bytes, read in chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename durable: fsync the directory that holds it (no-op where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, private: bool = False) -> Iterator[Path]:
    """A temporary sibling of ``path`` for a writer that needs a file *name* (FFmpeg
    reopens its output); fsynced and renamed into place on success, removed on failure.

    The file gets the umask's mode (0600 when ``private``); a full disk or read-only
    file system raises :class:`WriteError` naming ``path``'s folder.
    """
    target = Path(path)
    tmp: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{target.name}.", suffix=target.suffix, dir=target.parent)
        tmp = Path(tmp_name)
        try:
            os.fchmod(fd, PRIVATE if private else shared_mode())  # mkstemp's 0600 is for temporaries
        finally:
            os.close(fd)
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        wrapped = WriteError.wrap(exc, target.parent)
        if wrapped is exc:
            raise
        raise wrapped from exc


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb", *, private: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path``; on clean exit fsync and rename it into place.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    with atomic_path(path, private=private) as tmp, open(tmp, mode) as handle:
        yield handle


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, private: bool = False) -> None:
    with atomic_writer(path, "wb", private=private) as handle:
        handle.write(data)


@dataclass(frozen=True)
class FileRef:
    """A file a stage produced, named by content."""

    path: Path
    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileRef:
        return cls(Path(data["path"]), str(data["sha256"]), int(data["size"]))
