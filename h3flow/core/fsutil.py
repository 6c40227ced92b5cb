"""Atomic writes and streaming hashes: the only way h3flow puts bytes on disk.

Every file h3flow produces is written to a temporary name in the same directory,
fsynced, then renamed over the target, so a reader never sees a partial file and a
crash leaves at most a stray ``.tmp-*`` file (never a damaged output). The primitives
live in the node pack (``h3flow_nodes.files``, which writes inside ComfyUI the same
way); this module adds the JSON forms and the file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from h3flow_nodes.files import (
    CHUNK,
    PRIVATE,
    atomic_path,
    atomic_write_bytes,
    atomic_writer,
    fsync_dir,
    sha256_bytes,
    sha256_file,
    shared_mode,
)

__all__ = [
    "CHUNK",
    "PRIVATE",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_writer",
    "canonical_json",
    "file_lock",
    "fsync_dir",
    "sha256_bytes",
    "sha256_file",
    "sha256_json",
    "shared_mode",
]


def sha256_json(obj: Any) -> str:
    """Hash of a JSON-serialisable value in canonical form (sorted keys, no spaces)."""
    return sha256_bytes(canonical_json(obj).encode())


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, private: bool = False) -> None:
    atomic_write_bytes(path, text.encode(), private=private)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, private: bool = False) -> None:
    """Pretty, key-sorted JSON with a trailing newline: stable bytes for stable input."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", private=private)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing), held for the block; ``waiting``
    is called once if another holder makes this one wait. The kernel drops it if its process dies."""
    lock = Path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
