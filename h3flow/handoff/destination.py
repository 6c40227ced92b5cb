"""Where a latent goes, and the small helpers every transfer method shares.

Kept apart from :mod:`h3flow.handoff.transfer` so the tcp and sftp methods can use it
without importing the dispatcher that imports them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from h3flow.core.errors import H3FlowError, IntegrityError
from h3flow.core.files import FileRef

Method = Literal["tcp", "sftp", "local"]
METHODS: tuple[str, ...] = ("tcp", "sftp", "local")


@dataclass(frozen=True)
class Destination:
    """Where a latent goes (built from local.json by the config layer)."""

    method: Method
    host: str  # host name, for messages
    address: str  # tcp: the receiver's address; sftp: ignored (the alias decides)
    port: int  # tcp: the receiver's port
    ssh_alias: str | None  # sftp: a Host alias of the SSH config
    store_root: Path  # the destination host's store root (as that host sees it)
    secret: bytes | None  # tcp: the shared secret
    ssh_config: Path | None = None  # sftp: an explicit SSH config file instead of ~/.ssh/config

    def __repr__(self) -> str:  # never print the secret
        secret = "set" if self.secret else None
        return (
            f"Destination(method={self.method!r}, host={self.host!r}, address={self.address!r}, "
            f"port={self.port}, ssh_alias={self.ssh_alias!r}, store_root={str(self.store_root)!r}, "
            f"secret={secret}, ssh_config={self.ssh_config and str(self.ssh_config)!r})"
        )


def local_size(ref: FileRef) -> int:
    """The size of the file behind ``ref``; IntegrityError when it disagrees with the ref."""
    try:
        size = os.stat(ref.path).st_size
    except OSError as exc:
        raise H3FlowError(f"cannot read latent {ref.path}: {exc.strerror or exc}") from None
    if size != ref.size:
        raise IntegrityError(f"latent {ref.path} is {size} bytes, its FileRef says {ref.size}")
    return size


def os_reason(exc: BaseException) -> str:
    """A short reason for a network error, for one-line messages."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    causes = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError: one error per address
    if isinstance(causes, dict) and causes:
        return os_reason(next(iter(causes.values())))
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
