"""The two config files, as pydantic models (the single source of truth for config).

- ``host-map.json`` (:class:`HostMap`) is what the operator writes: hosts, GPUs, roles,
  the link, the Prefect API, stores, the transfer method.
- ``local.json`` (:class:`LocalConfig`) is what ``h3flow config-adapt`` resolves it into:
  every default and derived value spelled out — pools with their Ulysses degree and
  visible devices, Prefect work pool names, ComfyUI URLs, per-host environment, store
  paths, transfer routes — so every other command reads one explicit file.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from h3flow.config.fields import AbsPath, Address, Env, SshAlias, SshName, WritablePath, no_control
from h3flow.core.errors import ConfigError
from h3flow.core.jsonio import format_validation_error, load_json_file, shown

NAME = r"^[a-z][a-z0-9-]{0,31}$"
Role = Literal["encode", "sample", "decode"]
EngineName = Literal["comfy", "local"]
ENGINES: tuple[EngineName, ...] = ("local", "comfy")
DatabaseKind = Literal["sqlite", "postgresql"]
DATABASES: tuple[DatabaseKind, ...] = ("sqlite", "postgresql")
Port = Annotated[int, Field(ge=1, le=65535)]


def _strings(value: object) -> list[str]:
    """The strings a field holds directly (itself, a list's items, a dict's keys and values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        return [s for kv in value.items() for s in kv if isinstance(s, str)]
    return []


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _no_control_characters(cls, value: Any) -> Any:
        """No NUL, newline or other control character in any path, name or value: they
        end up in file names, command lines and environments."""
        for text in _strings(value):
            no_control(text)
        return value


def _check_api_url(url: str) -> str:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        raise ValueError(f"{url!r} is not an http(s) URL with a host, e.g. http://10.10.0.1:4200/api")
    return url


def _check_cron(cron: str) -> str:
    from datetime import datetime

    from cronsim import CronSim, CronSimError

    if len(cron.split()) != 5:  # Prefect (croniter) reads a sixth field as seconds, cronsim as a year
        raise ValueError(f"{shown(cron)} is not a cron schedule (five fields: minute hour day month weekday)")
    try:
        CronSim(cron, datetime(2020, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"{cron!r} is not a cron schedule ({exc}); e.g. '0 3 * * *' is 03:00 daily") from None
    return cron


def _check_timezone(name: str) -> str:
    from zoneinfo import ZoneInfo

    try:
        ZoneInfo(name)
    except (KeyError, ValueError):  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as UTC or Europe/Paris)") from None
    return name


# --------------------------------------------------------------------------- host map
class Gpu(Strict):
    index: Annotated[int, Field(ge=0, le=63)]
    model: str = Field(min_length=1)
    vram_gb: Annotated[float, Field(gt=0, le=1024)]
    arch: str = Field(description="sm75, sm86, gfx1100, ... or cpu for the embedded default")

    @field_validator("arch")
    @classmethod
    def _arch_known(cls, value: str) -> str:
        if not re.match(r"^(sm\d{2,3}|gfx\d{3,4}[a-z]?|cpu)$", value):
            raise ValueError(f"unknown GPU architecture {value!r} (expected e.g. sm75, sm86, gfx1100, cpu)")
        return value

    @property
    def vendor(self) -> Literal["nvidia", "amd", "cpu"]:
        return "nvidia" if self.arch.startswith("sm") else "amd" if self.arch.startswith("gfx") else "cpu"


class Storage(Strict):
    root: WritablePath = Field(min_length=1, description="store root: latents/, conditioning/ live under it")
    outputs: WritablePath | None = Field(None, description="where MP4s go (default: <root>/outputs)")


class Host(Strict):
    name: str = Field(pattern=NAME)
    description: str = ""
    address: Address = Field(min_length=1, description="internal address (the 10 GbE side)")
    ssh_alias: SshName = None
    user: SshName = None
    port: Port = 22
    venv: AbsPath = Field(min_length=1)
    comfy_dir: AbsPath | None = None
    comfy_port: Port = 8188
    raylight_dir: AbsPath | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    roles: list[Role] = Field(min_length=1)
    storage: Storage
    env: Env = Field(default_factory=dict)

    @model_validator(mode="after")
    def _gpus_unique(self) -> Host:
        seen: set[int] = set()
        for gpu in self.gpus:
            if gpu.index in seen:
                raise ValueError(f"host {self.name!r}: GPU index {gpu.index} is listed twice")
            seen.add(gpu.index)
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"host {self.name!r}: a role is listed twice")
        if {"sample", "decode", "encode"} & set(self.roles) and not self.gpus:
            raise ValueError(f"host {self.name!r} has GPU roles but no GPUs")
        return self


class Link(Strict):
    hosts: tuple[str, str]
    rtt_ms: Annotated[float, Field(ge=0)] = 0.3
    gbit_s: Annotated[float, Field(gt=0)] = 10.0
    method: Literal["tcp", "sftp"] | None = Field(None, description="overrides transfer.method on this link")


class SecretSource(Strict):
    """Where a secret comes from on the host that uses it; its value never goes into
    local.json, nor into Prefect (whose API anyone on the embedded default's machine can
    read: no auth there), so a secret is only ever as readable as its 0600 file or the
    owner's environment."""

    source: Literal["env", "file"] = "env"
    name: str = Field("H3FLOW_TRANSFER_SECRET", description="env variable (source: env)")
    path: WritablePath | None = Field(None, description="file holding the secret, mode 0600 (source: file)")

    @field_validator("source", mode="before")
    @classmethod
    def _not_in_prefect(cls, value: object) -> object:
        if value == "prefect-secret":
            raise ValueError(
                "a secret in a Prefect Secret block can be read by anyone who reaches the API (the embedded "
                "default's has no auth): keep it in a 0600 file (source 'file') or the environment (source 'env')"
            )
        return value

    @model_validator(mode="after")
    def _file_has_path(self) -> SecretSource:
        if self.source == "file" and not self.path:
            raise ValueError("secret source 'file' needs a path")
        return self


class Transfer(Strict):
    method: Literal["tcp", "sftp"] = "tcp"
    port: Port = 9410
    max_bytes: Annotated[int, Field(gt=0)] = 256 * 1024 * 1024
    secret: SecretSource = SecretSource()


class Schedule(Strict):
    cron: Annotated[str, AfterValidator(_check_cron)] = Field(min_length=9)
    timezone: Annotated[str, AfterValidator(_check_timezone)] = "UTC"
    inbox: WritablePath = Field(min_length=1)


class Database(Strict):
    """The Prefect server's database: SQLite under PREFECT_HOME (the embedded default) or a
    PostgreSQL server that ``h3flow start`` runs beside the Prefect server (the cluster)."""

    kind: DatabaseKind = "postgresql"
    port: Port = 5432
    name: str = Field("prefect", pattern=NAME)
    user: str = Field("prefect", pattern=NAME)
    password: SecretSource | None = Field(
        None, description="PostgreSQL's password (env or file; config-adapt puts a file beside the transfer secret)"
    )
    os_user: str = Field(
        "postgres", pattern=NAME, description="the system user PostgreSQL runs as when `start` runs as root"
    )
    bin_dir: AbsPath | None = Field(
        None, description="where initdb and postgres are (default: Debian's /usr/lib/postgresql/<newest>/bin)"
    )


class PrefectSettings(Strict):
    api_url: Annotated[str, AfterValidator(_check_api_url)]
    schedule: Schedule | None = None
    database: Database | None = Field(
        None, description="default: PostgreSQL for a host map, SQLite for the embedded default (config-adapt)"
    )
    auth: SecretSource | None = Field(
        None,
        description="basic-auth credential ('user:password') the cluster's API requires; config-adapt puts a "
        "file beside the transfer secret (none for the embedded default)",
    )


class Model(Strict):
    """What runs: MiniMax H3 through ComfyUI, or the reference model (embedded default)."""

    kind: Literal["h3", "reference"] = "h3"
    text_encoder: str = "qwen3vl_32b_minimax_h3_int8_convrot.safetensors"
    dit: str = "minimax_h3_fl2va_pruned_int8_convrot.safetensors"
    lora: str | None = "minimax_h3_fl2v_lightx2v_turbo_4step_v0.1_comfy.safetensors"
    vae: str = "minimax_h3_video_vae_int8_convrot.safetensors"
    audio_vae: str = "minimax_h3_audio_vae_fp32.safetensors"
    dit_vram_gb: Annotated[float, Field(ge=0)] = 20.0
    vae_vram_gb: Annotated[float, Field(ge=0)] = 6.0
    encoder_vram_gb: Annotated[float, Field(ge=0)] = Field(
        40.0,
        description="VRAM a pool needs to hold the text encoder; smaller pools borrow one (h3flow.config.encoders)",
    )
    steps: Annotated[int, Field(ge=1, le=100)] = 6
    sampler: str = "euler"
    scheduler: str = "simple"


class HostMap(Strict):
    version: Literal[1] = 1
    engine: EngineName = "comfy"
    topology: str | None = None
    prefect: PrefectSettings
    model: Model = Model()
    hosts: list[Host] = Field(min_length=1)
    links: list[Link] = Field(default_factory=list)
    transfer: Transfer = Transfer()
    runs_dir: WritablePath | None = Field(
        None, description="where the dispatcher keeps run manifests (default: <main sampler host's store root>/runs)"
    )

    @model_validator(mode="after")
    def _references_resolve(self) -> HostMap:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate host name {dupes[0]!r}")
        for link in self.links:
            for name in link.hosts:
                if name not in names:
                    raise ValueError(f"link names unknown host {name!r}")
        return self

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(f"unknown host {name!r}")


# --------------------------------------------------------------------------- local.json
class ResolvedStorage(Strict):
    root: WritablePath
    latents: WritablePath
    conditioning: WritablePath
    outputs: WritablePath


class ResolvedHost(Strict):
    name: str
    description: str
    address: Address
    ssh_alias: SshAlias
    user: SshName
    port: int
    venv: AbsPath
    comfy_dir: AbsPath | None
    raylight_dir: AbsPath | None
    roles: list[Role]
    gpus: list[Gpu]
    storage: ResolvedStorage
    env: Env


class Pool(Strict):
    """One GPU pool: one ComfyUI instance, one Prefect work pool, one worker."""

    name: str
    work_pool: str
    role: Literal["sample", "decode"]
    host: str
    gpus: list[int]
    gpu_model: str
    arch: str
    vram_gb: float
    ulysses_degree: int
    comfy_url: str
    comfy_port: int
    encoder_pool: str | None = Field(description="the pool whose ComfyUI encodes this pool's clips")
    env: Env


class Route(Strict):
    """How a latent gets from a sampler host to a decoder host."""

    source: str
    target: str
    method: Literal["tcp", "sftp", "local"]
    address: Address
    port: int
    store_root: WritablePath
    rtt_ms: float
    gbit_s: float


class Receiver(Strict):
    host: str
    bind: Address
    port: int


class LocalConfig(Strict):
    version: Literal[1] = 1
    generated_by: str
    source_sha256: str
    engine: EngineName
    topology: str
    topology_canonical: str
    prefect: PrefectSettings
    model: Model
    runs_dir: WritablePath
    hosts: dict[str, ResolvedHost]
    pools: list[Pool]
    routes: list[Route]
    receivers: list[Receiver]
    transfer: Transfer
    control_work_pool: str = Field("h3-control", description="work pool of the batch (dispatcher) deployments")
    work_dir: WritablePath | None = Field(None, description="the embedded default's work dir")

    @property
    def control_host(self) -> str:
        """Where the dispatcher (the control work pool's worker) runs and keeps the runs' manifests."""
        return self.pools[0].host

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name or pool.work_pool == name:
                return pool
        raise ConfigError(f"unknown pool {name!r} (known: {', '.join(p.name for p in self.pools)})")

    @property
    def samplers(self) -> list[Pool]:
        return [p for p in self.pools if p.role == "sample"]

    @property
    def decoders(self) -> list[Pool]:
        return [p for p in self.pools if p.role == "decode"]

    def route(self, source_host: str, target_host: str) -> Route:
        for route in self.routes:
            if route.source == source_host and route.target == target_host:
                return route
        raise ConfigError(f"no route from {source_host!r} to {target_host!r}")


def parse_model(model: type[BaseModel], raw: object, source: str) -> BaseModel:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


MAX_CONFIG_BYTES = 4 << 20  # a host map or local.json is a few KiB


def load_host_map(path: Path) -> HostMap:
    return parse_model(HostMap, load_json_file(path, MAX_CONFIG_BYTES), str(path))  # type: ignore[return-value]


def load_local_config(path: Path = Path("local.json")) -> LocalConfig:
    if not Path(path).exists():
        raise ConfigError(f"{path}: no such file (run `h3flow config-adapt` first)")
    return parse_model(LocalConfig, load_json_file(path, MAX_CONFIG_BYTES), str(path))  # type: ignore[return-value]


@functools.lru_cache(maxsize=4)
def _cached_config(path: str, mtime: float) -> LocalConfig:
    return load_local_config(Path(path))


def config_at(path: str | os.PathLike[str]) -> LocalConfig:
    """local.json at ``path``, parsed once per process (and again when the file changes)."""
    return _cached_config(str(path), os.stat(path).st_mtime)
