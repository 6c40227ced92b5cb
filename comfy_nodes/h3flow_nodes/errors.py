"""The errors the node pack raises, shared with h3flow (which re-exports them).

ComfyUI shows a failing node's exception type and message (``IntegrityError: latent …
has SHA-256 …, expected …``); h3flow's CLI turns an :class:`H3FlowError` into one
``error: ...`` line and exit code 2. One message, one line, either way.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


class H3FlowError(Exception):
    """A problem with the user's input or environment, explained in one line.

    ``details`` are further problems of the same kind (one line each), so a bad batch
    is reported whole instead of one fix-and-retry at a time.
    """

    exit_code: int = 2

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(one_line(message))
        self.details = [one_line(d) for d in details]


class ConfigError(H3FlowError):
    """A configuration value is invalid (an unknown spec, a bad parallel degree, a config file)."""


class IntegrityError(H3FlowError):
    """A file's bytes do not match the SHA-256 it is supposed to have."""


# errno -> what it means for a file h3flow writes, and the operator's fix
_WRITE_FIXES = {
    errno.ENOSPC: ("disk full on {where}", "free space and `h3flow resume`"),
    errno.EDQUOT: ("disk quota exceeded on {where}", "free space or raise the quota, then `h3flow resume`"),
    errno.EROFS: ("read-only file system at {where}", "remount it read-write, then `h3flow resume`"),
}


class WriteError(H3FlowError, OSError):
    """A write failed for a reason retrying cannot fix (disk full, read-only file system).

    Still an :class:`OSError` with its errno, so the pipeline classifies it as a
    permanent resource failure; its message names the place and the fix.
    """

    def __init__(self, code: int, where: str | os.PathLike[str]) -> None:
        what, fix = _WRITE_FIXES[code]
        message = f"{what.format(where=os.fspath(where))}: {fix}"
        OSError.__init__(self, code, message)
        self.details = []
        self.code, self.message, self.where = code, message, os.fspath(where)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[WriteError], tuple[int, str]]:  # pickles (Prefect results) round-trip
        return WriteError, (self.code, self.where)

    @staticmethod
    def covers(exc: BaseException) -> bool:
        """Whether ``exc`` is an OSError this class explains (and not one already)."""
        return isinstance(exc, OSError) and not isinstance(exc, WriteError) and exc.errno in _WRITE_FIXES

    @staticmethod
    def wrap(exc: BaseException, where: str | os.PathLike[str]) -> BaseException:
        """``exc`` as a WriteError naming ``where`` when :meth:`covers` it; else ``exc`` itself."""
        if isinstance(exc, OSError) and exc.errno is not None and WriteError.covers(exc):
            return WriteError(exc.errno, where)
        return exc
