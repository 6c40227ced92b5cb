"""Every ``H3FLOW_*`` environment variable, in one typed model, read at use.

``local.json`` is the config; these are the few knobs that belong to a process instead
(which config file a worker's flow runs read, how patient the dispatcher is, where the
test ComfyUI is cached). :func:`settings` reads the environment each time it is
called, so a test or a host's env in the host map changes them without a restart and
nothing is frozen at import time. docs/settings.md lists them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from h3flow.core.errors import ConfigError
from h3flow.core.jsonio import format_validation_error


class Settings(BaseSettings):
    """The ``H3FLOW_*`` variables (``H3FLOW_`` + the field name in capitals)."""

    model_config = SettingsConfigDict(env_prefix="H3FLOW_", extra="ignore", frozen=True)

    config: Path | None = Field(
        None, description="local.json for commands and flow runs given no --config (workers get it from `start`)"
    )
    ssh_config: Path | None = Field(None, description="SSH config file for remote operations (default ~/.ssh/config)")
    cache: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "h3flow",
        description="where the demo/test ComfyUI install is cached",
    )
    comfyui_source: str | None = Field(
        None, description="the demo/test ComfyUI tree: a folder, a .tar.gz of one, or a git URL (at the pinned commit)"
    )
    upstream: Path | None = Field(None, description="the exact upstream files (default ../shared/upstream)")
    pool: str | None = Field(
        None, description="the pool an h3flow worker serves (`start` sets it): its engine is loaded once"
    )
    silence_s: float = Field(
        75.0,
        gt=30,
        description="a clip's run that sends no heartbeat (every 30 s) this long is marked Crashed (`deploy` sets it)",
    )
    dispatcher_silence_s: float = Field(
        180.0,
        gt=30,
        description="a dispatcher that sends no heartbeat this long is marked Crashed: longer than any API outage it rides out",
    )
    deadline_margin: float = Field(
        4.0, gt=1, description="a stage is stopped (kind timeout) past this many times what the profile expects of it"
    )
    deadline_floor_s: float = Field(120.0, gt=0, description="no stage's deadline is shorter than this")
    decoder_gone_s: float = Field(
        120.0,
        gt=0,
        description="the run fails when no decoder (or no sampler, with clips left) is ready in Prefect this long",
    )


def settings() -> Settings:
    """The current ``H3FLOW_*`` settings (read from the environment now); a bad value is a ConfigError."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(format_validation_error("H3FLOW_* environment", exc)) from None


def prefect_client_home() -> Path:
    """PREFECT_HOME for h3flow's own Prefect client when no work dir says otherwise: under
    h3flow's cache, never ``~/.prefect`` (Prefect makes its home folder as it is imported,
    and keeps profiles, a database and a memo store there)."""
    return settings().cache / "prefect-client"
