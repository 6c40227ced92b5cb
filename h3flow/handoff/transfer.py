"""Moving a latent into another host's store, verified by SHA-256: ``tcp | sftp | local``.

Which method a link uses comes from local.json; this module only needs a
:class:`Destination`. Every method ends the same way: the destination host holds the
object under its content address and the hash was checked *there*, or the call raises
(:class:`~h3flow.errors.TransientError` when a retry may help, ``IntegrityError`` for
bytes that do not match, ``H3FlowError`` for what the operator must fix), naming the host.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from h3flow.engines.base import FileRef
from h3flow.errors import ConfigError, H3FlowError, TransientError
from h3flow.handoff.store import LatentStore, check_sha256

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
        return (f"Destination(method={self.method!r}, host={self.host!r}, address={self.address!r}, "
                f"port={self.port}, ssh_alias={self.ssh_alias!r}, store_root={str(self.store_root)!r}, "
                f"secret={secret}, ssh_config={self.ssh_config and str(self.ssh_config)!r})")


def send(ref: FileRef, dest: Destination, *, timeout: float = 60.0) -> FileRef:
    """Put ``ref`` into ``dest``'s store (one attempt); return the verified remote object."""
    check_sha256(ref.sha256)
    if dest.method == "local":
        local_size(ref)
        return LatentStore(dest.store_root).put_file(Path(ref.path), link=True, expected_sha256=ref.sha256)
    if dest.method == "tcp":
        from h3flow.handoff.tcp import tcp_send

        return tcp_send(ref, dest, timeout)
    if dest.method == "sftp":
        from h3flow.handoff.sftp import sftp_send

        return sftp_send(ref, dest, timeout)
    raise ConfigError(f"unknown transfer method {dest.method!r} for host {dest.host} (known: {', '.join(METHODS)})")


def send_with_retry(
    ref: FileRef, dest: Destination, *, attempts: int = 3, timeout: float = 60.0, backoff: float = 0.5
) -> FileRef:
    """:func:`send`, retried after each :class:`TransientError` (dropped link, corruption in
    flight, restarted receiver) with a doubling pause; other errors are raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return send(ref, dest, timeout=timeout)
        except TransientError:
            if attempt == attempts:
                raise
            time.sleep(backoff * 2 ** (attempt - 1))  # back-off between attempts, not synchronisation
    raise AssertionError("unreachable")


def probe(address: str, port: int, timeout: float = 2.0) -> bool:
    """True when an h3flow latent receiver answers a ping at ``address:port`` (health check)."""
    from h3flow.handoff.tcp import probe as tcp_probe

    return tcp_probe(address, port, timeout)


def destination_from_options(
    host: str,
    *,
    method: str,
    store_root: Path | None,
    address: str | None = None,
    port: int | None = None,
    ssh_alias: str | None = None,
    ssh_config: Path | None = None,
    secret: bytes | None = None,
) -> Destination:
    """A :class:`Destination` from command-line style options, checked for what the method needs."""
    if method not in METHODS:
        raise ConfigError(f"--method must be one of {', '.join(METHODS)}, not {method!r}")
    if store_root is None:
        raise ConfigError(f"--store-root is required: the store root on host {host}")
    if method == "tcp":
        if port is None or not 0 < port < 65536:
            raise ConfigError(f"tcp transfer to {host} needs --port (the receiver's port, 1-65535)")
        if not secret:
            raise ConfigError(f"tcp transfer to {host} needs the shared secret (--secret-env or --secret-file)")
    if ssh_config is not None and not Path(ssh_config).is_file():
        raise ConfigError(f"ssh config file not found: {ssh_config}")
    return Destination(
        method=method,  # type: ignore[arg-type]
        host=host,
        address=address or host,
        port=port or 0,
        ssh_alias=ssh_alias or (host if method == "sftp" else None),
        store_root=Path(store_root),
        secret=secret,
        ssh_config=Path(ssh_config) if ssh_config else None,
    )


def secret_from_options(env_name: str | None = None, file: Path | None = None) -> bytes | None:
    """The tcp shared secret named on a command line (``--secret-env`` / ``--secret-file``),
    read by :mod:`h3flow.secret` exactly as local.json's secret would be; None if neither."""
    from h3flow.config import SecretSource
    from h3flow.secret import load_secret

    if env_name and file:
        raise ConfigError("give the shared secret by --secret-env or --secret-file, not both")
    if env_name:
        return load_secret(SecretSource(source="env", name=env_name))
    if file:
        return load_secret(SecretSource(source="file", path=str(file)))
    return None


def local_size(ref: FileRef) -> int:
    """The size of the file behind ``ref``; IntegrityError when it disagrees with the ref."""
    from h3flow.errors import IntegrityError

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
