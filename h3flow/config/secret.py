"""The transfer secret, read from where local.json says (env, file or a Prefect Secret block)."""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path
from typing import Any, cast

from h3flow.config.models import SecretSource
from h3flow.core.errors import ConfigError
from h3flow.core.fsutil import atomic_writer


def load_secret(source: SecretSource) -> bytes:
    if source.source == "env":
        value = os.environ.get(source.name)
        if not value:
            raise ConfigError(f"transfer secret: environment variable {source.name} is not set")
        return value.encode()
    if source.source == "file":
        path = Path(source.path or "")
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"transfer secret: cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"transfer secret: {path} is not text") from None
        if not value:
            raise ConfigError(f"transfer secret: {path} is empty")
        return value.encode()
    from prefect.blocks.system import Secret

    try:
        block = cast(Secret[Any], Secret.load(source.name))  # Prefect's sync/async dual API
        return str(block.get()).encode()
    except ValueError as exc:
        raise ConfigError(f"transfer secret: Prefect Secret block {source.name!r}: {exc}") from None


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
