"""The long-running services h3flow supervises, as data, and the runner that controls them.

Why data: the embedded default (``start --local``) and the remote hosts (issue 8) run
the *same* commands; only how a process is spawned, signalled and inspected differs
(here: ``subprocess`` + ``/proc``; remotely: the same steps through SSH, see
:mod:`h3flow.ops.ssh`). So a service is a :class:`ServiceSpec` (argv, env, cwd, log,
PID file, health check), built from local.json by :func:`local_specs` or
:func:`remote_specs`, and process control lives behind the small :class:`Runner` protocol. Health checks run on
the controlling machine (:func:`check_health`), against the addresses in local.json.

Each service runs in its own session (``setsid``), so it has a process group to signal
and does not inherit the caller's SIGINT-ignored disposition (bash does that to
background jobs, and Prefect maps SIGTERM to SIGINT: such a worker ignores SIGTERM).
Stopping signals the groups of its whole process tree: a Prefect process worker starts
each flow run in a session of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import urlsplit

from h3flow.core.contracts import AHEAD, WORKER_TYPE
from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.fsutil import atomic_write_text

if TYPE_CHECKING:  # kept out of the import: the SSH agent imports this module on every remote spawn / stop
    from h3flow.config.models import LocalConfig, Pool, SecretSource

Kind = Literal["postgres", "prefect-server", "worker", "receiver", "comfyui"]
SecretRef = tuple[str, str]  # ("file", path) or ("env", variable): where a service's secret is read on its host
PG_VERSIONS = range(18, 12, -1)  # Debian's /usr/lib/postgresql/<version>/bin, newest first
WORKER_QUERY_SECONDS = 1  # poll the work pool every second: a run starts in ~3-4 s, not 10-12
WORKER_HEARTBEAT_SECONDS = 5
SERVER_SETTINGS = {
    # a GPU slot's lease outlives a server restart (in memory, a restart leaves its slot taken for good)
    "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
    # a slot held by another process is asked for again within 2 s (Prefect's default: up to 30 s)
    "PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
    # a worker that stopped heart-beating (3 beats of 5 s) shows offline, and its pool NOT_READY, within 20 s
    "PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS": "5",
    # a cancelled batch run's clip runs are cancelled within 5 s (Prefect's cascade; default 20 s)
    "PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_LOOP_SECONDS": "5",
}
"""What the Prefect server h3flow starts is told (docs/services.md)."""
CLIENT_SETTINGS = {
    # no OpenTelemetry trace label written on each flow run: one write fewer per run (h3flow exports no traces)
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
}
"""What h3flow's workers (and the flow runs in them) are told besides the API address."""


# --------------------------------------------------------------------------- health checks
@dataclass(frozen=True)
class HttpHealth:
    """Healthy when ``GET url`` answers 200 with ``expect`` as its body (``None``: any 200)."""

    url: str
    expect: str | None = "true"


@dataclass(frozen=True)
class WorkerHealth:
    """Healthy when the Prefect API lists ``worker`` ONLINE on ``work_pool``.

    With ``since`` (epoch seconds), its last heartbeat must be that recent: a worker
    killed a moment ago still shows ONLINE until the server notices missed heartbeats.
    """

    api_url: str
    work_pool: str
    worker: str
    auth: SecretRef | None = None  # the cluster API's basic-auth credential, read on this machine


@dataclass(frozen=True)
class PostgresHealth:
    """Healthy when PostgreSQL at ``address:port`` accepts connections for ``user``/``database``:
    its answer to a startup message is an authentication request, not "starting up"."""

    address: str
    port: int
    user: str
    database: str


@dataclass(frozen=True)
class ReceiverHealth:
    """Healthy when an h3flow latent receiver answers ``ping`` at ``address:port``."""

    address: str
    port: int


Health = HttpHealth | WorkerHealth | PostgresHealth | ReceiverHealth


def check_health(health: Health, since: float | None = None, timeout: float = 2.0) -> tuple[bool, str]:
    """One probe from this machine: (healthy, a short human-readable detail)."""
    import httpx

    if isinstance(health, HttpHealth):
        try:
            reply = httpx.get(health.url, timeout=timeout)
        except httpx.HTTPError as exc:
            return False, f"{health.url}: {type(exc).__name__}"
        body = reply.text.strip()
        ok = reply.status_code == 200 and (health.expect is None or body == health.expect)
        shown = body[:40] if health.expect is not None else "200"
        return ok, f"{urlsplit(health.url).path} → {shown if reply.status_code == 200 else reply.status_code}"
    if isinstance(health, WorkerHealth):
        return _worker_health(health, since, timeout)
    if isinstance(health, PostgresHealth):
        from h3flow.ops.postgres import probe_postgres

        return probe_postgres(health.address, health.port, health.user, health.database, timeout)
    from h3flow.handoff.tcp import probe

    where = f"{health.address}:{health.port}"
    if probe(health.address, health.port, timeout):
        return True, f"answers ping on {where}"
    return False, f"no receiver answering on {where}"


def _worker_health(health: WorkerHealth, since: float | None, timeout: float) -> tuple[bool, str]:
    import httpx

    url = f"{health.api_url.rstrip('/')}/work_pools/{health.work_pool}/workers/filter"
    try:
        from h3flow.config.secret import basic_auth_header

        auth = basic_auth_header(read_secret(health.auth)) if health.auth else None
        reply = httpx.post(url, json={}, timeout=timeout, headers=auth)
    except httpx.HTTPError as exc:
        return False, f"Prefect API unreachable ({type(exc).__name__})"
    if reply.status_code == 401:
        return False, "the Prefect API refused the credential (401): is the auth file the server's?"
    if reply.status_code == 404:
        return False, f"work pool {health.work_pool} does not exist yet"
    if reply.status_code != 200:
        return False, f"Prefect API answered {reply.status_code}"
    for worker in reply.json():
        if worker.get("name") != health.worker:
            continue
        beat = _epoch(worker.get("last_heartbeat_time"))
        age = f"heartbeat {max(0.0, time.time() - beat):.0f} s ago" if beat else "no heartbeat"
        if worker.get("status") != "ONLINE":
            return False, f"{worker.get('status', '?')}, {age}"
        if since is not None and (beat is None or beat < since - 1.0):
            return False, f"waiting for a heartbeat from the new process ({age})"
        return True, f"ONLINE, {age}"
    return False, f"not registered on {health.work_pool} yet"


def secret_ref(source: SecretSource) -> SecretRef:
    """Where a secret is read on the host that uses it (a file copied there by ``start``, or its environment)."""
    if source.source == "file":
        return ("file", str(source.path))
    if source.source == "env":
        return ("env", source.name)
    raise ConfigError(f"a service secret comes from a file or an environment variable, not {source.source!r}")


def read_secret(ref: SecretRef) -> str:
    """The secret's value on this machine; a clear error when it is missing."""
    kind, where = ref
    if kind == "env":
        value = os.environ.get(where, "")
        if not value:
            raise ConfigError(f"environment variable {where} is not set (a secret h3flow's services need)")
        return value
    try:
        value = Path(where).read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the secret file {where}: {exc.strerror or exc} (`h3flow start` makes it)"
        ) from None
    if not value:
        raise ConfigError(f"the secret file {where} is empty")
    return value


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


# --------------------------------------------------------------------------- service specs
@dataclass(frozen=True)
class ServiceSpec:
    """One supervised process, as plain data a local or an SSH runner can act on."""

    name: str
    kind: Kind
    host: str  # the local.json host it runs on
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(hash=False)  # on top of the host's environment (minus PREFECT_*)
    cwd: str
    log: str
    pidfile: str
    health: Health
    binds: tuple[tuple[str, int], ...] = ()  # (address, port) it listens on: must be free to start
    stop_grace: float = 15.0  # seconds between the stop signal and SIGKILL
    stop_signal: int = signal.SIGTERM  # PostgreSQL: SIGINT ("fast" shutdown: it does not wait for clients)
    secret_env: Mapping[str, SecretRef] = field(default_factory=dict, hash=False)  # read on the host at spawn
    user: str | None = None  # run as this system user when spawned by root (PostgreSQL refuses root)
    setup: tuple[tuple[str, ...], ...] = ()  # commands run on the host before each spawn (e.g. initdb once)


def service_dir(config: LocalConfig) -> Path:
    """Where the embedded default keeps its logs and PID files."""
    if not config.work_dir:
        raise ConfigError("this local.json has no work_dir: make it with `h3flow config-adapt --local`")
    return Path(config.work_dir) / "services"


def prefect_home(config: LocalConfig) -> Path:
    return Path(config.work_dir or ".") / "prefect"


def _api_host_port(api_url: str) -> tuple[str, int]:
    parts = urlsplit(api_url)
    if not parts.hostname:
        raise ConfigError(f"prefect.api_url {api_url!r} has no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _venv_bin(config: LocalConfig, host: str, tool: str) -> str:
    return str(Path(config.hosts[host].venv) / "bin" / tool)


def _prefect_env(config: LocalConfig) -> dict[str, str]:
    return {
        "PREFECT_HOME": str(prefect_home(config)),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }


def api_host(config: LocalConfig) -> str | None:
    """The host of local.json whose address the API URL names (it runs the server and its database)."""
    address, _port = _api_host_port(config.prefect.api_url)
    return next((h.name for h in config.hosts.values() if h.address == address), None)


def auth_env(config: LocalConfig, variable: str = "PREFECT_API_AUTH_STRING") -> dict[str, SecretRef]:
    """The cluster API's credential for a service (none for an open API): read on the host at spawn."""
    return {variable: secret_ref(config.prefect.auth)} if config.prefect.auth else {}


def database_url(config: LocalConfig, home: Path) -> str:
    """The server's database: SQLite under its PREFECT_HOME, or the PostgreSQL that ``start`` runs
    on the API's host (the password stays out of the URL: Prefect fills it in from
    PREFECT_API_DATABASE_PASSWORD, which the runner reads from the secret on the host)."""
    db = config.prefect.database
    if db is None or db.kind == "sqlite":
        return f"sqlite+aiosqlite:///{home / 'prefect.db'}"
    address, _port = _api_host_port(config.prefect.api_url)
    return f"postgresql+asyncpg://{db.user}:${{PREFECT_API_DATABASE_PASSWORD}}@{address}:{db.port}/{db.name}"


def server_spec(config: LocalConfig, where: Path, host: str | None = None, home: Path | None = None) -> ServiceSpec:
    """The Prefect server, in the foreground, on ``host`` (default: the first pool's), its UI
    pointed at its own API (Prefect derives the UI's API address from its settings, not
    from ``--host/--port``), on SQLite or PostgreSQL, with basic auth when the config has it."""
    address, port = _api_host_port(config.prefect.api_url)
    host = host or config.pools[0].host
    home = home or prefect_home(config)
    env = {
        **_prefect_env(config),
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url(config, home),
        "PREFECT_SERVER_API_HOST": address,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": config.prefect.api_url,
        **SERVER_SETTINGS,
    }
    secrets = auth_env(config, "PREFECT_SERVER_API_AUTH_STRING")
    launcher = ("-m", "h3flow.ops.prefect_server")  # Prefect's own CLI, its SQLite writes begun IMMEDIATE
    db = config.prefect.database
    if db is not None and db.kind == "postgresql" and db.password is not None:
        secrets["PREFECT_API_DATABASE_PASSWORD"] = secret_ref(db.password)
    return ServiceSpec(
        name="prefect-server",
        kind="prefect-server",
        host=host,
        argv=(_venv_bin(config, host, "python"), *launcher, "server", "start", "--host", address, "--port", str(port)),
        env=env,
        cwd=str(home),
        log=str(where / "prefect-server.log"),
        pidfile=str(where / "prefect-server.pid"),
        health=HttpHealth(config.prefect.api_url.rstrip("/") + "/health"),
        binds=((address, port),),
        stop_grace=20.0,
        secret_env=secrets,
    )


def postgres_path(bin_dir: str | None) -> str:
    """PATH for PostgreSQL's programs: the configured folder, else Debian's, newest first."""
    dirs = [bin_dir] if bin_dir else [f"/usr/lib/postgresql/{v}/bin" for v in PG_VERSIONS]
    return ":".join([*dirs, REMOTE_PATH])


def postgres_spec(config: LocalConfig, host: str, where: Path, data_dir: Path) -> ServiceSpec | None:
    """PostgreSQL for the Prefect server (database kind "postgresql"), on the API host's
    address only, its data in ``data_dir`` (made by ``initdb`` on the first start, with the
    password from the secrets), run as ``os_user`` when ``start`` runs as root."""
    db = config.prefect.database
    if db is None or db.kind != "postgresql":
        return None
    if db.password is None:
        raise ConfigError("prefect.database.password is not set: rerun `h3flow config-adapt`")
    address, _port = _api_host_port(config.prefect.api_url)
    kind, source = secret_ref(db.password)
    init = (
        _venv_bin(config, host, "python"), "-m", "h3flow.ops.postgres",
        "--data", str(data_dir), "--user", db.user, "--database", db.name,
        "--password-" + kind, source, "--os-user", db.os_user,
    )  # fmt: skip
    return ServiceSpec(
        name="postgres",
        kind="postgres",
        host=host,
        # "postgres" is found on PATH (Debian keeps it in a versioned folder); no Unix socket
        argv=("postgres", "-D", str(data_dir), "-h", address, "-p", str(db.port), "-c", "unix_socket_directories="),
        env={"PATH": postgres_path(db.bin_dir), "LC_ALL": "C.UTF-8"},
        cwd=str(data_dir),
        log=str(where / "postgres.log"),
        pidfile=str(where / "postgres.pid"),
        health=PostgresHealth(address, db.port, db.user, db.name),
        binds=((address, db.port),),
        stop_grace=30.0,
        stop_signal=signal.SIGINT,
        user=db.os_user,
        setup=(init,),
    )


def worker_spec(
    config: LocalConfig,
    config_path: Path,
    where: Path,
    work_pool: str,
    host: str,
    pool_env: Mapping[str, str],
    limit: int | None = None,
) -> ServiceSpec:
    """An ``h3flow`` worker on ``work_pool`` (:mod:`h3flow.pipeline.worker`: flow runs in-process, engine
    warm), polling every second, its flow runs heart-beating (the silence automation watches them)."""
    from h3flow.pipeline.automations import HEARTBEAT_S

    name = f"{work_pool}-worker"
    venv_bin = str(Path(config.hosts[host].venv) / "bin")
    env = {
        **_prefect_env(config),
        **pool_env,
        "PREFECT_API_URL": config.prefect.api_url,
        "PREFECT_WORKER_QUERY_SECONDS": str(WORKER_QUERY_SECONDS),
        "PREFECT_WORKER_HEARTBEAT_SECONDS": str(WORKER_HEARTBEAT_SECONDS),
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
        "PREFECT_WORKER_ENABLE_CANCELLATION": "true",  # Cancelling runs reach the worker (events, else a poll)
        **CLIENT_SETTINGS,
        "H3FLOW_CONFIG": str(Path(config_path).resolve()),
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    auth = auth_env(config)
    argv = [f"{venv_bin}/prefect", "worker", "start", "--pool", work_pool, "--type", WORKER_TYPE, "--name", name]
    if limit is not None:
        argv += ["--limit", str(limit)]
    return ServiceSpec(
        name=f"worker-{work_pool}",
        kind="worker",
        host=host,
        argv=tuple(argv),
        env=env,
        cwd=str(config.work_dir or where),
        log=str(where / f"worker-{work_pool}.log"),
        pidfile=str(where / f"worker-{work_pool}.pid"),
        health=WorkerHealth(config.prefect.api_url, work_pool, name, auth.get("PREFECT_API_AUTH_STRING")),
        secret_env=auth,  # its flow runs talk to the API too
    )


def worker_specs(config: LocalConfig, config_path: Path, where: Callable[[str], Path]) -> list[ServiceSpec]:
    """One worker per GPU pool (with the pool's device pinning, AHEAD clips at a time), plus the dispatcher's."""
    specs = [
        worker_spec(
            config,
            config_path,
            where(pool.host),
            pool.work_pool,
            pool.host,
            {**pool.env, "H3FLOW_POOL": pool.name},
            limit=AHEAD,
        )
        for pool in config.pools
    ]
    host = config.control_host  # the batch (dispatcher) flow runs there
    specs.append(worker_spec(config, config_path, where(host), config.control_work_pool, host, {}))
    return specs


def secret_args(secret: SecretSource) -> tuple[str, ...]:
    """How the receiver finds the transfer secret (its value never appears on a command line)."""
    if secret.source == "file":
        return ("--secret-file", str(secret.path))
    if secret.source == "env":
        return ("--secret-env", secret.name)
    raise ConfigError(
        "the receiver reads its secret from a file or an environment variable; "
        f"transfer.secret.source {secret.source!r} is not supported by `h3flow start` yet"
    )


def receiver_specs(config: LocalConfig, where: Callable[[str], Path]) -> list[ServiceSpec]:
    """The latent receiver on each decoder host that tcp transfers target."""
    specs = []
    for rec in config.receivers:
        store = config.hosts[rec.host].storage.root
        argv = (
            _venv_bin(config, rec.host, "h3flow"), "receiver",
            "--store", store,
            "--bind", f"{rec.bind}:{rec.port}",
            "--max-bytes", str(config.transfer.max_bytes),
            *secret_args(config.transfer.secret),
        )  # fmt: skip
        specs.append(
            ServiceSpec(
                name=f"receiver-{rec.host}",
                kind="receiver",
                host=rec.host,
                argv=argv,
                env={"PYTHONUNBUFFERED": "1"},  # an env secret comes with the host's environment
                cwd=store,
                log=str(where(rec.host) / f"receiver-{rec.host}.log"),
                pidfile=str(where(rec.host) / f"receiver-{rec.host}.pid"),
                health=ReceiverHealth(rec.bind, rec.port),
                binds=((rec.bind, rec.port),),
            )
        )
    return specs


def comfy_base_dir(config: LocalConfig, pool: str) -> Path:
    """A pool's own ComfyUI base directory (custom_nodes, models, input, output, user, its DB)."""
    if not config.work_dir:
        raise H3FlowError("ComfyUI on remote hosts is started by remote ops (issue 8); this local.json has no work_dir")
    return Path(config.work_dir) / "comfyui" / pool


def comfy_specs(config: LocalConfig, where: Callable[[str], Path]) -> list[ServiceSpec]:
    """One ComfyUI per pool when engine == "comfy" (the embedded default).

    The ComfyUI that :func:`h3flow.ops.comfy_install.ensure_comfyui` installed (its launcher,
    CPU torch), listening on the pool's ``comfy_url`` address and ``comfy_port``, with a
    base directory per pool so two pools on one host keep their own custom_nodes,
    input/output folders and database. The pool's env pins the devices, as for its
    worker. :func:`prepare_comfy` must have run first (install, node pack).
    """
    if config.engine != "comfy":
        return []
    from h3flow.ops.comfy_install import default_install, server_args

    install = default_install()
    specs = []
    for pool in config.pools:
        address = urlsplit(pool.comfy_url).hostname or config.hosts[pool.host].address
        base = comfy_base_dir(config, pool.name)
        argv = tuple(install.command(server_args(address, pool.comfy_port, base)))
        # VIRTUAL_ENV: the installed ComfyUI's venv, not the caller's
        specs.append(
            comfy_spec(
                pool, address, argv, str(base), where, VIRTUAL_ENV=str(install.venv), **node_folders(config, pool)
            )
        )
    return specs


def node_folders(config: LocalConfig, pool: Pool) -> dict[str, str]:
    """The env that lets the h3flow nodes in a pool's ComfyUI use the host's stores (and nothing
    else outside ComfyUI's own folders): the engine hands them paths there."""
    from h3flow_nodes.paths import ALLOWED_ENV

    storage = config.hosts[pool.host].storage
    folders = dict.fromkeys([storage.root, storage.conditioning, storage.latents, storage.outputs])
    return {ALLOWED_ENV: os.pathsep.join(folders)}


def comfy_spec(
    pool: Pool, address: str, argv: tuple[str, ...], cwd: str, where: Callable[[str], Path], **env: str
) -> ServiceSpec:
    """One pool's ComfyUI as a service: the pool's device pinning (no PREFECT_* vars), a
    log and PID file, healthy once /system_stats answers."""
    pinned = {k: v for k, v in pool.env.items() if not k.startswith("PREFECT_")}
    return ServiceSpec(
        name=f"comfyui-{pool.name}",
        kind="comfyui",
        host=pool.host,
        argv=argv,
        env={**pinned, "PYTHONUNBUFFERED": "1", **env},
        cwd=cwd,
        log=str(where(pool.host) / f"comfyui-{pool.name}.log"),
        pidfile=str(where(pool.host) / f"comfyui-{pool.name}.pid"),
        health=HttpHealth(pool.comfy_url.rstrip("/") + "/system_stats", expect=None),
        binds=((address, pool.comfy_port),),
        stop_grace=20.0,
    )


def prepare_comfy(config: LocalConfig, log: Callable[[str], None]) -> Path | None:
    """Before starting ComfyUI: install it (cached after the first time), then give each
    pool its base directory with the h3flow node pack in custom_nodes. Returns the install's root."""
    if config.engine != "comfy":
        return None
    from h3flow.ops.comfy_install import ensure_comfyui, install_node_pack, prepare_base_dir

    install = ensure_comfyui(log=log)
    for pool in config.pools:
        install_node_pack(prepare_base_dir(comfy_base_dir(config, pool.name)))
    return install.root


def local_specs(config: LocalConfig, config_path: Path) -> list[ServiceSpec]:
    """Every service of the embedded default, in start order (stop goes in reverse)."""
    where = service_dir(config)
    per_host: Callable[[str], Path] = lambda _host: where  # noqa: E731 - one machine, one folder
    database = postgres_spec(config, config.pools[0].host, where, Path(config.work_dir or ".") / "postgres")
    return [
        *([database] if database else []),
        server_spec(config, where),
        *comfy_specs(config, per_host),
        *worker_specs(config, config_path, per_host),
        *receiver_specs(config, per_host),
    ]


# --------------------------------------------------------------------------- remote hosts (a local.json without work_dir)
REMOTE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_dir(config: LocalConfig, host: str) -> Path:
    """A remote host's own h3flow folder, under its store root: ``services/`` (logs, PID
    files), ``prefect-home/`` (PREFECT_HOME, the server's SQLite), ``comfyui/<pool>/``."""
    return Path(config.hosts[host].storage.root)


def on_host(config: LocalConfig, spec: ServiceSpec) -> ServiceSpec:
    """A spec as it runs on its remote host: the host's env underneath, that host's
    PREFECT_HOME, and a PATH of the host's venv and system folders (not this machine's)."""
    from dataclasses import replace

    host = config.hosts[spec.host]
    env = {**host.env, **spec.env}
    if "PREFECT_HOME" in env:
        env["PREFECT_HOME"] = str(host_dir(config, spec.host) / "prefect-home")
    if "PATH" in env:
        env["PATH"] = f"{Path(host.venv) / 'bin'}:{REMOTE_PATH}"
    return replace(spec, env=env)


def remote_server_spec(config: LocalConfig, where: Callable[[str], Path]) -> list[ServiceSpec]:
    """The Prefect server (and its PostgreSQL) on the host whose address the API URL names
    (none: it runs elsewhere, and ``start`` only checks that it answers). A host env that
    sets PREFECT_API_DATABASE_CONNECTION_URL names a database h3flow does not run."""
    from dataclasses import replace

    host = api_host(config)
    if host is None:
        return []
    root = host_dir(config, host)
    server = on_host(config, server_spec(config, where(host), host, root / "prefect-home"))
    external = config.hosts[host].env.get("PREFECT_API_DATABASE_CONNECTION_URL")
    if external:
        secrets = {k: v for k, v in server.secret_env.items() if k != "PREFECT_API_DATABASE_PASSWORD"}
        return [
            replace(server, env={**server.env, "PREFECT_API_DATABASE_CONNECTION_URL": external}, secret_env=secrets)
        ]
    database = postgres_spec(config, host, where(host), root / "postgres")
    return [*([database] if database else []), server]


def remote_comfy_specs(config: LocalConfig, where: Callable[[str], Path]) -> list[ServiceSpec]:
    """ComfyUI per pool (engine "comfy") from the host's own checkout (``comfy_dir``) and
    venv, on the pool's address and port, pinned to the pool's devices; pools sharing a
    host share the checkout but not the temp folder (ComfyUI empties it at start-up)."""
    if config.engine != "comfy":
        return []
    specs = []
    for pool in config.pools:
        host = config.hosts[pool.host]
        if not host.comfy_dir:
            raise ConfigError(
                f"host {host.name!r} runs ComfyUI for pool {pool.name!r} but the host map gives no comfy_dir"
            )
        address = urlsplit(pool.comfy_url).hostname or host.address
        argv = (
            _venv_bin(config, pool.host, "python"), str(Path(host.comfy_dir) / "main.py"),
            "--listen", address, "--port", str(pool.comfy_port),
            "--temp-directory", str(host_dir(config, pool.host) / "comfyui" / pool.name),
            "--disable-auto-launch",
        )  # fmt: skip
        specs.append(comfy_spec(pool, address, argv, host.comfy_dir, where, **node_folders(config, pool)))
    return specs


def remote_specs(config: LocalConfig, config_path: Path) -> list[ServiceSpec]:
    """Every service of a multi-host local.json, in start order (stop goes in reverse):
    the Prefect server (when a host serves it), ComfyUI per pool, a worker per pool,
    the receivers; logs and PID files in ``<store root>/services`` on each host."""
    where: Callable[[str], Path] = lambda host: host_dir(config, host) / "services"  # noqa: E731
    servers = remote_server_spec(config, where)
    rest = [*worker_specs(config, config_path, where), *receiver_specs(config, where)]
    return [*servers, *remote_comfy_specs(config, where), *(on_host(config, s) for s in rest)]


def service_specs(config: LocalConfig, config_path: Path) -> list[ServiceSpec]:
    """The embedded default's services (it has a work_dir) or the remote hosts'."""
    return local_specs(config, config_path) if config.work_dir else remote_specs(config, config_path)


# --------------------------------------------------------------------------- process control
@dataclass(frozen=True)
class Proc:
    """What a service's PID file says, checked against the live process table."""

    pid: int | None  # from the PID file
    running: bool  # that process is alive and runs the service's command line
    started: float | None = None  # its start time, epoch seconds
    stale: bool = False  # a PID file whose process is gone or is something else now


class Runner(Protocol):
    """Process control on one host. ``LocalRunner`` here; an SSH runner for issue 8."""

    def inspect(self, spec: ServiceSpec) -> Proc: ...

    def spawn(self, spec: ServiceSpec) -> Proc: ...

    def stop(self, spec: ServiceSpec, pid: int) -> bool:
        """SIGTERM the service's process tree, SIGKILL after ``spec.stop_grace``; True if it had to SIGKILL."""
        ...

    def forget(self, spec: ServiceSpec) -> None: ...

    def port_free(self, address: str, port: int) -> bool: ...

    def tail(self, spec: ServiceSpec, lines: int = 12) -> list[str]: ...

    def ensure_secret(self, secret: SecretSource, prefix: str = "") -> None: ...

    def sync_config(self, config_path: Path) -> None:
        """local.json at the same absolute path on the host (flows and workers name it by that path)."""
        ...


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]; None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw.rsplit(")", 1)[1].split()


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def _process_table() -> dict[int, tuple[int, int]]:
    """Live (non-zombie) processes: pid -> (ppid, pgid)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and fields[0] not in ("Z", "X"):
                table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def _tree_groups(pid: int, table: dict[int, tuple[int, int]]) -> set[int]:
    """The process groups of ``pid`` and all its descendants.

    A Prefect process worker starts each flow run in a session of its own, so the
    worker's group alone would leave its flow runs behind as orphans.
    """
    groups, todo, seen = {pid}, [pid], {pid}
    while todo:
        parent = todo.pop()
        for child, (ppid, pgid) in table.items():
            if ppid == parent and child not in seen:
                seen.add(child)
                groups.add(pgid)
                todo.append(child)
    return groups


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP)


def _default_signals() -> None:
    """In the child before exec: the stop signals back to their default disposition.

    Why: an ignored signal stays ignored across fork and exec. When ``start`` itself runs
    with SIGINT ignored (a job started as ``cmd &`` by a non-interactive shell, some CI
    runners, an SSH session's shell), every service inherited that, and a Prefect worker
    turns SIGTERM into SIGINT to itself: it then ignored ``stop`` until SIGKILL.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _run_setup(spec: ServiceSpec, command: tuple[str, ...], env: Mapping[str, str]) -> None:
    try:
        done = subprocess.run(list(command), env=dict(env), capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise H3FlowError(f"cannot prepare {spec.name}: {command[0]}: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise H3FlowError(f"cannot prepare {spec.name}: {last[0][-300:]}")


class LocalRunner:
    """Runs services on this machine: ``subprocess`` in a new session, ``/proc`` to inspect."""

    poll = 0.1

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._boot = _boot_time()
        self._hz = os.sysconf("SC_CLK_TCK")

    # -- inspect
    def inspect(self, spec: ServiceSpec) -> Proc:
        pid = self._read_pid(spec)
        if pid is None:
            return Proc(None, False, stale=Path(spec.pidfile).exists())
        if not self._alive(pid):
            return Proc(pid, False, stale=True)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            return Proc(pid, False, stale=True)
        # a script's shebang puts the interpreter first: compare the tail
        want = [arg.encode() for arg in spec.argv]
        if cmdline[-len(want) :] != want:
            return Proc(pid, False, stale=True)
        fields = _stat_fields(pid)
        started = self._boot + int(fields[19]) / self._hz if fields else None
        return Proc(pid, True, started)

    def _read_pid(self, spec: ServiceSpec) -> int | None:
        try:
            text = Path(spec.pidfile).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _alive(self, pid: int) -> bool:
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:  # reap our own children
            del self._children[pid]
            return False
        fields = _stat_fields(pid)
        return fields is not None and fields[0] not in ("Z", "X")

    # -- control
    def spawn(self, spec: ServiceSpec) -> Proc:
        for path in (spec.log, spec.pidfile):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(spec.env)
        env.update({name: read_secret(ref) for name, ref in spec.secret_env.items()})
        for command in spec.setup:
            _run_setup(spec, command, env)
        Path(spec.cwd).mkdir(parents=True, exist_ok=True)
        user = spec.user if spec.user and os.geteuid() == 0 else None
        started = time.time()
        with open(spec.log, "ab") as log:
            log.write(f"\n=== h3flow: starting {spec.name} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
            log.flush()
            try:
                child = subprocess.Popen(
                    list(spec.argv),
                    cwd=spec.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    user=user,
                    preexec_fn=_default_signals,
                )
            except (OSError, KeyError) as exc:  # KeyError: no such user
                reason = exc.strerror if isinstance(exc, OSError) else f"no system user {user!r}"
                raise H3FlowError(f"cannot start {spec.name}: {spec.argv[0]}: {reason or exc}") from None
        self._children[child.pid] = child
        atomic_write_text(spec.pidfile, f"{child.pid}\n")
        return Proc(child.pid, True, started)

    def stop(self, spec: ServiceSpec, pid: int) -> bool:
        """The stop signal to the groups of the whole tree; SIGKILL only when the grace runs out."""
        groups = _tree_groups(pid, _process_table())
        self._signal(groups, signal.Signals(spec.stop_signal))
        killed = not self._wait_gone(pid, groups, spec.stop_grace)
        if killed:
            self._signal(groups, signal.SIGKILL)
            if not self._wait_gone(pid, groups, 10.0):
                raise H3FlowError(f"{spec.name} (pid {pid}) survived SIGKILL")
        self.forget(spec)
        return killed

    def _signal(self, groups: set[int], sig: signal.Signals) -> None:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)

    def _wait_gone(self, pid: int, groups: set[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self._alive(pid)  # reaps it if it is our child
            if not any(pgid in groups for _ppid, pgid in _process_table().values()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll)

    def forget(self, spec: ServiceSpec) -> None:
        Path(spec.pidfile).unlink(missing_ok=True)

    # -- environment
    def port_free(self, address: str, port: int) -> bool:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError:
                return False
        return True

    def tail(self, spec: ServiceSpec, lines: int = 12) -> list[str]:
        try:
            with open(spec.log, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 16384))
                text = handle.read().decode(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def ensure_secret(self, secret: SecretSource, prefix: str = "") -> None:
        from h3flow.config.secret import ensure_secret_file

        if secret.source == "file":
            ensure_secret_file(Path(str(secret.path)), prefix)

    def sync_config(self, config_path: Path) -> None:
        """Nothing to do: this machine already holds local.json."""
