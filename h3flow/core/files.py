"""Files named by content: the only thing stages hand each other.

A :class:`FileRef` (path + SHA-256 + size; defined in the node pack, whose writers
return it) crosses tasks, flows, hosts and caches;
:func:`file_intact` is the one check that the bytes behind it are still the ones named.
"""

from __future__ import annotations

import os

from h3flow.core.fsutil import sha256_file
from h3flow_nodes.files import FileRef

__all__ = ["FileRef", "file_intact"]


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
