"""Moving a latent into another host's store, verified by SHA-256: ``tcp | sftp | local``.

Which method a link uses comes from local.json; this module only needs a
:class:`Destination`. Every method ends the same way: the destination host holds the
object under its content address and the hash was checked *there*, or the call raises
(:class:`~h3flow.core.errors.TransientError` when a retry may help, ``IntegrityError`` for
bytes that do not match, ``H3FlowError`` for what the operator must fix), naming the host.
"""

from __future__ import annotations

import time
from pathlib import Path

from h3flow.core.errors import ConfigError, TransientError
from h3flow.core.files import FileRef
from h3flow.handoff.destination import METHODS, Destination, local_size
from h3flow.handoff.sftp import sftp_send
from h3flow.handoff.store import LatentStore, check_sha256
from h3flow.handoff.tcp import probe as tcp_probe
from h3flow.handoff.tcp import tcp_send


def send(ref: FileRef, dest: Destination, *, timeout: float = 60.0) -> FileRef:
    """Put ``ref`` into ``dest``'s store (one attempt); return the verified remote object."""
    check_sha256(ref.sha256)
    if dest.method == "local":
        local_size(ref)
        return LatentStore(dest.store_root).put_file(Path(ref.path), link=True, expected_sha256=ref.sha256)
    if dest.method == "tcp":
        return tcp_send(ref, dest, timeout)
    if dest.method == "sftp":
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
    read by :mod:`h3flow.config.secret` exactly as local.json's secret would be; None if neither."""
    from h3flow.config.models import SecretSource
    from h3flow.config.secret import load_secret

    if env_name and file:
        raise ConfigError("give the shared secret by --secret-env or --secret-file, not both")
    if env_name:
        return load_secret(SecretSource(source="env", name=env_name))
    if file:
        return load_secret(SecretSource(source="file", path=str(file)))
    return None
