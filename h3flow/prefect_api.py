"""Talk to the Prefect server local.json names, whatever the caller's environment says."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from h3flow.config import LocalConfig


@contextlib.contextmanager
def prefect_api(config: LocalConfig) -> Iterator[None]:
    """Point Prefect's client at ``config.prefect.api_url`` (never an ephemeral server)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: config.prefect.api_url}):
        yield
