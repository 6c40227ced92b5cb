"""One error type for everything the operator can fix.

The CLI turns an :class:`H3FlowError` into a one-line ``error: ...`` message and exit
code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class H3FlowError(Exception):
    """A problem with the operator's input or environment, explained in one line."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class ConfigError(H3FlowError):
    """host-map.json / local.json / profile / batch file is invalid."""


class IntegrityError(H3FlowError):
    """A file's bytes do not match the SHA-256 it is supposed to have."""


class TransientError(H3FlowError):
    """A failure worth retrying: a dropped connection, a timeout, a restarted service."""

    exit_code = 1
