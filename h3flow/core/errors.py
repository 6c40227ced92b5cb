"""One error type for everything the operator can fix.

The CLI turns an :class:`H3FlowError` into a one-line ``error: ...`` message (plus one
line per detail, when there are several problems) and exit code 2; anything else is a
bug and keeps its traceback. The base types live in the node pack
(``h3flow_nodes.errors``), so a file the pack rejects inside ComfyUI and one h3flow
rejects are the same error.
"""

from __future__ import annotations

from h3flow_nodes.errors import ConfigError, H3FlowError, IntegrityError, WriteError, one_line

__all__ = ["ConfigError", "H3FlowError", "IntegrityError", "TransientError", "WriteError", "one_line"]


class TransientError(H3FlowError):
    """A failure worth retrying: a dropped connection, a timeout, a restarted service."""

    exit_code = 1
