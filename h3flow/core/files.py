"""Files named by content: the only thing stages hand each other.

A :class:`FileRef` (path + SHA-256 + size) crosses tasks, flows, hosts and caches;
:func:`file_intact` is the one check that the bytes behind it are still the ones named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h3flow.core.fsutil import sha256_file


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


def file_intact(path: str | os.PathLike[str], sha256: str | None, size: int | None = None) -> bool:
    """True when ``path`` is a regular file whose bytes hash to ``sha256`` (and have ``size``)."""
    if not sha256:
        return False
    try:
        stat = os.stat(path)
    except OSError:
        return False
    if size is not None and stat.st_size != size:
        return False
    try:
        return sha256_file(path) == sha256
    except OSError:
        return False
