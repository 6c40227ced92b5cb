"""Secrets (the transfer secret, the API credential), read where local.json says: a file
only its owner can read, or the environment. Never from Prefect: a block there is
readable through the API, which has no auth on the embedded default."""

from __future__ import annotations

import base64
import os
import secrets
import stat
from pathlib import Path

from h3flow.config.models import SecretSource
from h3flow.core.errors import ConfigError
from h3flow.core.fsutil import atomic_writer

MAX_SECRET_BYTES = 4096  # a secret is a line of hex; a bound, so a path to a device reads nothing


def load_secret(source: SecretSource) -> bytes:
    if source.source == "env":
        value = os.environ.get(source.name)
        if not value:
            raise ConfigError(f"secret: environment variable {source.name} is not set")
        return value.encode()
    return _read_private_file(Path(source.path or ""))


def _read_private_file(path: Path) -> bytes:
    """The stripped text of a regular file that only its owner can read (mode 0600 or
    0400): a secret others can read is refused with the chmod that fixes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"secret file: cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"secret file: {path} is not a regular file")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"secret file: {path} can be read by others (mode {stat.S_IMODE(info.st_mode):04o}): "
                f"`chmod 600 {path}` (and make a new secret if others could read it)"
            )
        data = handle.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"secret file: {path} is larger than {MAX_SECRET_BYTES} bytes: not a secret file")
    try:
        value = data.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"secret file: {path} is not text") from None
    if not value:
        raise ConfigError(f"secret file: {path} is empty")
    return value.encode()


def ensure_secret_file(path: Path, prefix: str = "") -> None:
    """Create a random secret file (mode 0600) once; an existing one is never replaced.

    ``prefix``: e.g. ``"h3flow:"`` for a basic-auth credential (``user:password``, as curl
    ``-u`` and browsers take it)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(prefix + secrets.token_hex(32) + "\n")


def basic_auth_header(credential: str) -> dict[str, str]:
    """The Authorization header of HTTP basic auth for ``credential`` ('user:password'), as
    Prefect's ``PREFECT_SERVER_API_AUTH_STRING`` checks it."""
    return {"Authorization": "Basic " + base64.b64encode(credential.encode()).decode()}
