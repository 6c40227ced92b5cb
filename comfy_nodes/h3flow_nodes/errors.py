"""The errors the node pack raises, shared with h3flow (which re-exports them).

ComfyUI shows a failing node's exception type and message (``IntegrityError: latent …
has SHA-256 …, expected …``); h3flow's CLI turns an :class:`H3FlowError` into one
``error: ...`` line and exit code 2. One message, one line, either way.
"""

from __future__ import annotations


class H3FlowError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class ConfigError(H3FlowError):
    """A configuration value is invalid (an unknown spec, a bad parallel degree, a config file)."""


class IntegrityError(H3FlowError):
    """A file's bytes do not match the SHA-256 it is supposed to have."""
