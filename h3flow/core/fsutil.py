"""Atomic writes and streaming hashes: the only way h3flow puts bytes on disk.

Every file h3flow produces is written to a temporary name in the same directory,
fsynced, then renamed over the target, so a reader never sees a partial file and a
crash leaves at most a stray ``.tmp-*`` file (never a damaged output).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike[str], chunk: int = CHUNK) -> str:
    """SHA-256 of a file's bytes, read in chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON-serialisable value in canonical form (sorted keys, no spaces)."""
    return sha256_bytes(canonical_json(obj).encode())


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename durable: fsync the directory that holds it (no-op where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path``; on clean exit fsync and rename it into place.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    with atomic_path(path) as tmp, open(tmp, mode) as handle:
        yield handle


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_writer(path, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Pretty, key-sorted JSON with a trailing newline: stable bytes for stable input."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling of ``path`` for a writer that needs a file *name* (FFmpeg
    reopens its output); fsynced and renamed into place on success, removed on failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing), held for the block."""
    lock = Path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
