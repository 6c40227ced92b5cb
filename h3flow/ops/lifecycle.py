"""``h3flow start / stop / status --services``: bring the services up, down, and report them.

The steps are written against :class:`~h3flow.ops.services.Runner` and a list of
:class:`~h3flow.ops.services.ServiceSpec`: the embedded default (a local.json with a
work_dir) is :func:`~h3flow.ops.services.local_specs` with one :class:`LocalRunner`;
a production local.json is :func:`~h3flow.ops.services.remote_specs` with one
:class:`~h3flow.ops.ssh.SshRunner` per host. Nothing else differs.

Start order: the Prefect server (health-waited), then the deployments and work pools,
then every worker and receiver at once, all health-waited together. Stop goes in
reverse. Both are idempotent: a service whose PID file names its live process is left
alone, a stale PID file is replaced.
"""

from __future__ import annotations

import contextlib
import io
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.fsutil import file_lock
from h3flow.ops.listeners import foreign_holder, port_holders
from h3flow.ops.services import (
    HttpHealth,
    LocalRunner,
    Proc,
    Runner,
    ServiceSpec,
    check_health,
    host_dir,
    prepare_comfy,
    service_dir,
    service_specs,
)

RunnerFor = Callable[[str], Runner]
Deploy = Callable[[LocalConfig, Path], object]
POLL = 0.25  # seconds between health probes
COMFY_START_TIMEOUT = 240.0  # ComfyUI imports torch and every node: 8 s idle, up to a minute on 2 busy cores


@dataclass
class ServiceState:
    """A service, its process, and what start / stop / status found or did."""

    spec: ServiceSpec
    proc: Proc
    action: str = ""  # started | running | restarted | stopped | killed | not running
    healthy: bool | None = None
    detail: str = ""
    spawned_at: float | None = None  # set when this call started it

    @property
    def uptime(self) -> float | None:
        return time.time() - self.proc.started if self.proc.running and self.proc.started else None


def default_deploy(config: LocalConfig, config_path: Path) -> None:
    """Create the work pools, deployments and blocks (``h3flow.pipeline.runs.deploy_everything``)
    on *this* config's server: the caller's own PREFECT_API_URL (or none: an ephemeral
    server) must not decide where they go."""
    from h3flow.pipeline.runs import deploy_everything

    deploy_everything(config_path, config)


class PortTaken(H3FlowError):
    """A port a service must listen on is held, or answered, by a process this start did not make."""

    def __init__(self, message: str, address: str, port: int) -> None:
        super().__init__(message)
        self.address, self.port = address, port


# --------------------------------------------------------------------------- the building blocks
def _holder(runner: Runner, address: str, port: int) -> str:
    """Who holds a port, when this machine can tell (``port_holders``); else "another process"."""
    if isinstance(runner, LocalRunner):
        found = port_holders(address, port)
        if found:
            return found[0].describe()
    return "another process"


def ensure_started(spec: ServiceSpec, runner: Runner) -> ServiceState:
    """Leave a running service alone; otherwise clear a stale PID file and spawn it."""
    proc = runner.inspect(spec)
    if proc.running:
        return ServiceState(spec, proc, "running")
    if proc.stale:
        runner.forget(spec)
    for address, port in spec.binds:
        if not runner.port_free(address, port):
            raise PortTaken(
                f"{spec.name}: port {port} on {address} is in use by {_holder(runner, address, port)}, "
                "not by a service of this config",
                address,
                port,
            )
    action = "restarted" if proc.stale else "started"
    proc = runner.spawn(spec)
    return ServiceState(spec, proc, action, spawned_at=proc.started)


def wait_healthy(
    states: Sequence[ServiceState],
    runner_for: RunnerFor,
    *,
    timeout: float,
    console: Console,
) -> None:
    """Probe every service until all are healthy; one that dies or stays unhealthy is an error."""
    pending = list(states)
    begin = time.monotonic()
    deadline = begin + timeout
    with console.status("") as spinner:
        while pending:
            spinner.update("waiting for " + ", ".join(s.spec.name for s in pending) + " …")
            for state in list(pending):
                runner = runner_for(state.spec.host)
                proc = runner.inspect(state.spec)
                if not proc.running:
                    runner.forget(state.spec)
                    _taken_meanwhile(state.spec, runner)
                    raise H3FlowError(f"{state.spec.name} exited while starting; {_log_excerpt(state.spec, runner)}")
                state.healthy, state.detail = check_health(state.spec.health, since=state.spawned_at)
                if state.healthy:
                    _confirm_own_ports(state, proc, runner)
                    pending.remove(state)
                    took = time.monotonic() - begin
                    how = f"{state.action} in {took:.1f} s" if state.spawned_at else "already running"
                    print_fitted(console, f"✓ {state.spec.name:<18} {how}, pid {proc.pid}:", state.detail)
            if pending and time.monotonic() >= deadline:
                for state in pending:  # leave no half-started process behind
                    if state.spawned_at is not None and state.proc.pid is not None:
                        runner_for(state.spec.host).stop(state.spec, state.proc.pid)
                first = pending[0]
                raise H3FlowError(
                    f"{', '.join(s.spec.name for s in pending)} not healthy after {timeout:.0f} s "
                    f"({first.detail}); {_log_excerpt(first.spec, runner_for(first.spec.host))}"
                )
            if pending:
                time.sleep(POLL)


def print_fitted(console: Console, head: str, detail: str, indent: int = 21) -> None:
    """``head detail`` on one line when it fits the console (80 columns in a log), else the
    detail on the next line, indented: never a line the terminal wraps mid-word."""
    mark, rest = head[:1], head[1:]
    line = Text.assemble((mark, "green" if mark == "✓" else "yellow"), rest)
    tail = Text(detail)  # verbatim: a detail may hold brackets
    if line.cell_len + 1 + tail.cell_len <= console.width:
        console.print(Text.assemble(line, " ", tail), soft_wrap=True)
    else:
        console.print(line, soft_wrap=True)
        console.print(Text.assemble(" " * indent, tail), soft_wrap=True)


def _confirm_own_ports(state: ServiceState, proc: Proc, runner: Runner) -> None:
    """A health check only says that *something* answers: on this machine, the socket
    must also belong to the process this service runs (or its children). If another
    process answers, this one never bound its port: it is stopped, and PortTaken says who."""
    if not isinstance(runner, LocalRunner) or proc.pid is None:
        return
    for address, port in state.spec.binds:
        other = foreign_holder(address, port, proc.pid)
        if other is None:
            continue
        if state.spawned_at is not None:
            runner.stop(state.spec, proc.pid)
        raise PortTaken(
            f"{state.spec.name}: port {port} on {address} is answered by {other.describe()}, "
            f"not by the {state.spec.name} h3flow started (pid {proc.pid})",
            address,
            port,
        )


def _taken_meanwhile(spec: ServiceSpec, runner: Runner) -> None:
    """A service that died while starting because another process took its port between
    the check and its bind (two starts at once) is a PortTaken, not a crash."""
    if not isinstance(runner, LocalRunner):
        return
    for address, port in spec.binds:
        holders = port_holders(address, port)
        if holders:
            raise PortTaken(
                f"{spec.name}: port {port} on {address} was taken by {holders[0].describe()} while it started; "
                f"{_log_excerpt(spec, runner, 2)}",
                address,
                port,
            )


def _log_excerpt(spec: ServiceSpec, runner: Runner, lines: int = 8) -> str:
    tail = runner.tail(spec, lines)
    return f"last lines of {spec.log}: " + (" | ".join(tail) if tail else "(empty)")


def bring_up(
    specs: Sequence[ServiceSpec],
    runner_for: RunnerFor,
    *,
    timeout: float,
    console: Console,
) -> list[ServiceState]:
    """Start what is not running (all at once), then health-wait them together."""
    states = [ensure_started(spec, runner_for(spec.host)) for spec in specs]
    wait_healthy(states, runner_for, timeout=timeout, console=console)
    return states


def bring_down(specs: Sequence[ServiceSpec], runner_for: RunnerFor, *, console: Console) -> list[ServiceState]:
    """Stop by PID, in reverse start order; a stale PID file is just removed."""
    states = []
    for spec in reversed(specs):
        runner = runner_for(spec.host)
        proc = runner.inspect(spec)
        if proc.running and proc.pid is not None:
            with console.status(f"stopping {spec.name} (pid {proc.pid}) …"):
                killed = runner.stop(spec, proc.pid)
            state = ServiceState(spec, proc, "killed" if killed else "stopped")
            if killed:  # the last resort, and said so
                sig = signal.Signals(spec.stop_signal).name
                state.detail = f"did not exit within {spec.stop_grace:g} s of {sig}: SIGKILL"
                console.print(f"[yellow]![/] {spec.name:<18} killed (pid {proc.pid}): {state.detail}")
            else:
                console.print(f"[green]✓[/] {spec.name:<18} stopped (pid {proc.pid})")
        else:
            if proc.stale:
                runner.forget(spec)
            state = ServiceState(spec, proc, "not running")
            console.print(f"[dim]·[/] {spec.name:<18} not running")
        states.append(state)
    return list(reversed(states))


def probe_all(specs: Sequence[ServiceSpec], runner_for: RunnerFor) -> list[ServiceState]:
    """Each service's process and (when it runs) one health probe."""
    states = []
    for spec in specs:
        proc = runner_for(spec.host).inspect(spec)
        state = ServiceState(spec, proc, "running" if proc.running else "not running")
        if proc.running:
            state.healthy, state.detail = check_health(spec.health)
        elif proc.stale:
            state.detail = f"stale PID file (pid {proc.pid} is not running it)"
        states.append(state)
    return states


# --------------------------------------------------------------------------- this machine or the hosts
def _lock_path(config: LocalConfig, config_path: Path) -> Path:
    if config.work_dir:
        return service_dir(config) / ".lock"
    return Path(config_path).absolute().parent / ".h3flow-services.lock"


def logs_where(config: LocalConfig) -> str:
    if config.work_dir:
        return str(service_dir(config))
    return ", ".join(f"{h.name}:{host_dir(config, h.name) / 'services'}" for h in config.hosts.values())


@contextlib.contextmanager
def runners(config: LocalConfig, runner_for: RunnerFor | None = None) -> Iterator[RunnerFor]:
    """One LocalRunner for the embedded default (it has a work_dir), one SSH runner per host
    otherwise (connections opened on first use, closed at the end)."""
    if runner_for is not None:
        yield runner_for
    elif config.work_dir:
        runner = LocalRunner()
        yield lambda _host: runner
    else:
        from h3flow.ops.ssh import SshRunners

        with SshRunners(config) as ssh:
            yield ssh


def secret_hosts(config: LocalConfig) -> list[str]:
    """The hosts at either end of a tcp route: they share the transfer secret."""
    tcp = [r for r in config.routes if r.method == "tcp"]
    return sorted({r.source for r in tcp} | {r.target for r in tcp})


AUTH_PREFIX = "h3flow:"  # the API credential is "user:password", as curl -u and browsers take it


def prepare_hosts(config: LocalConfig, config_path: Path, specs: Sequence[ServiceSpec], runner_for: RunnerFor) -> None:
    """Before any service starts: local.json on every host (at this path), the transfer
    secret where tcp transfers need it, the API credential on every host that runs a
    service (workers and their flow runs call the API), the database password on the
    database's host. Secret files are made here (0600) once, then copied as they are."""
    hosts = list(dict.fromkeys(s.host for s in specs))
    for host in hosts:
        runner_for(host).sync_config(config_path)
    for host in secret_hosts(config):
        runner_for(host).ensure_secret(config.transfer.secret)
    if config.prefect.auth is not None:
        for host in hosts:
            runner_for(host).ensure_secret(config.prefect.auth, AUTH_PREFIX)
        if not hosts:  # nothing runs here, but the controller still talks to the API
            LocalRunner().ensure_secret(config.prefect.auth, AUTH_PREFIX)
    database = config.prefect.database
    for spec in specs:
        if spec.kind == "postgres" and database is not None and database.password is not None:
            runner_for(spec.host).ensure_secret(database.password)


def _served_elsewhere(spec: ServiceSpec, runner_for: RunnerFor, console: Console) -> bool:
    """A Prefect API that answers though h3flow did not start it (e.g. a systemd service
    on PostgreSQL) is used as it is, not fought over its port."""
    if spec.kind != "prefect-server" or runner_for(spec.host).inspect(spec).running:
        return False
    ok, detail = check_health(spec.health)
    if ok:
        console.print(f"[green]✓[/] {spec.name:<18} already served ({detail}; not started by h3flow: left alone)")
    return ok


def _require_api(config: LocalConfig, console: Console) -> None:
    url = config.prefect.api_url.rstrip("/") + "/health"
    ok, detail = check_health(HttpHealth(url))
    if not ok:
        raise H3FlowError(
            f"the Prefect API does not answer ({detail}); no host of local.json has the address of "
            f"{config.prefect.api_url}, so `h3flow start` does not run it: start that server first"
        )
    console.print(f"[green]✓[/] {'prefect-server':<18} served elsewhere ({detail})")


def start_services(
    config: LocalConfig,
    config_path: Path,
    *,
    runner_for: RunnerFor | None = None,
    deploy: Deploy | None = default_deploy,
    console: Console | None = None,
    timeout: float = 90.0,
) -> list[ServiceState]:
    """``h3flow start``: server (and ComfyUI), then deployments, then workers and receivers.

    The same steps for the embedded default (LocalRunner) and the hosts of a
    production local.json (one SSH runner per host). ``deploy`` runs after the server
    is healthy whenever this call starts the server or a worker (so a start that finds
    everything running is a true no-op).
    """
    console = console or Console(highlight=False)
    specs = service_specs(config, config_path)
    server = next((s for s in specs if s.kind == "prefect-server"), None)
    database = [s for s in specs if s.kind == "postgres"]
    comfy = [s for s in specs if s.kind == "comfyui"]  # engine "comfy": one ComfyUI per pool
    rest = [s for s in specs if s.kind in ("worker", "receiver")]
    with file_lock(_lock_path(config, config_path)), runners(config, runner_for) as runner_for:
        prepare_hosts(config, config_path, specs, runner_for)
        if comfy and config.work_dir:
            with console.status("ComfyUI: checking the install (cached; the first install takes minutes) …"):
                root = prepare_comfy(config, lambda line: console.print(f"[dim]{line}[/]", soft_wrap=True))
            console.print(
                f"[green]✓[/] {'comfyui install':<18} {root}, node pack in each pool's custom_nodes", soft_wrap=True
            )
        if server is None:
            _require_api(config, console)
        # a server h3flow did not start is used as it is on a cluster, never by the embedded
        # default: there it is another work dir's, with workers that would run these flows
        served = server is not None and not config.work_dir and _served_elsewhere(server, runner_for, console)
        # the database before the server that migrates it at start-up
        states = [] if served else bring_up(database, runner_for, timeout=timeout, console=console)
        first = [s for s in (server, *comfy) if s is not None and not (served and s is server)]
        # ComfyUI needs nothing from Prefect: it starts beside the server, ready before any worker
        wait = max(timeout, COMFY_START_TIMEOUT) if comfy else timeout
        states += bring_up(first, runner_for, timeout=wait, console=console)
        missing = [s for s in rest if s.kind == "worker" and not runner_for(s.host).inspect(s).running]
        started_server = any(st.spec.kind == "prefect-server" and st.spawned_at is not None for st in states)
        if deploy is not None and (started_server or missing):
            with console.status("creating work pools and deployments …"), contextlib.redirect_stdout(io.StringIO()):
                deploy(config, config_path)  # its per-deployment tables would drown the service lines
            console.print(f"[green]✓[/] {'deployments':<18} created / updated")
        states += bring_up(rest, runner_for, timeout=timeout, console=console)
    ui = config.prefect.api_url.removesuffix("/api")
    console.print(Text(f"Prefect UI: {ui}"), soft_wrap=True)
    console.print(Text(f"logs:       {logs_where(config)}"), soft_wrap=True)  # whole, however long
    return states


def stop_services(
    config: LocalConfig,
    config_path: Path,
    *,
    runner_for: RunnerFor | None = None,
    console: Console | None = None,
) -> list[ServiceState]:
    """``h3flow stop``: workers and receivers, then ComfyUI and the server, by PID.

    A host that cannot be reached does not keep the others running: what runs
    elsewhere is stopped, then one error names the hosts left as they were.
    """
    console = console or Console(highlight=False)
    with file_lock(_lock_path(config, config_path)), runners(config, runner_for) as runner_for:
        specs = service_specs(config, config_path)
        unreachable = _unreachable(specs, runner_for)
        states = bring_down([s for s in specs if s.host not in unreachable], runner_for, console=console)
    if unreachable:
        left = "; ".join(unreachable.values())
        raise H3FlowError(f"stopped what runs on the other hosts, but {left} (its services were left as they are)")
    return states


def _unreachable(specs: Sequence[ServiceSpec], runner_for: RunnerFor) -> dict[str, str]:
    """The hosts whose first service cannot even be inspected, with why."""
    out: dict[str, str] = {}
    for spec in {s.host: s for s in reversed(specs)}.values():
        try:
            runner_for(spec.host).inspect(spec)
        except H3FlowError as exc:
            out[spec.host] = str(exc)
    return out


def service_status(
    config: LocalConfig, config_path: Path, *, runner_for: RunnerFor | None = None
) -> list[ServiceState]:
    """Each service: running or not, pid, uptime, health."""
    with runners(config, runner_for) as runner_for:
        return probe_all(service_specs(config, config_path), runner_for)


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def render_status(states: Sequence[ServiceState]) -> Table:
    table = Table(title="services", title_justify="left")
    for column in ("service", "host", "state", "pid", "uptime", "health"):
        table.add_column(column, overflow="fold")  # never cut a name or a detail short
    for st in states:
        running = st.proc.running
        health = "—" if st.healthy is None else ("[green]✓[/] " if st.healthy else "[red]✗[/] ") + escape(st.detail)
        table.add_row(
            st.spec.name,
            st.spec.host,
            "[green]running[/]" if running else "[red]stopped[/]",
            str(st.proc.pid) if running else "—",
            _uptime(st.uptime),
            health if running else (escape(st.detail) or "—"),
        )
    return table


def print_service_status(config_path: Path = Path("local.json"), console: Console | None = None) -> list[ServiceState]:
    """``h3flow status --services``: a table of every service on every host."""
    config = load_local_config(config_path)
    states = service_status(config, config_path)
    console = console or Console(highlight=False)
    console.print(render_status(states))
    console.print(f"logs and PID files: {logs_where(config)}", soft_wrap=True)
    return states


def _checked(config_path: Path, local: bool) -> LocalConfig:
    config = load_local_config(config_path)
    if local and not config.work_dir:
        raise ConfigError(
            "this local.json is not the embedded default (it has no work_dir): "
            "make one with `h3flow config-adapt --local`, or run this without --local to act on its hosts over SSH"
        )
    return config


PORT_ATTEMPTS = 3  # fresh port blocks tried when other processes keep taking them (two starts at once)


def start_local(
    config_path: Path,
    *,
    console: Console | None = None,
    deploy: Deploy | None = default_deploy,
    timeout: float = 90.0,
) -> tuple[LocalConfig, list[ServiceState]]:
    """``start`` for the embedded default: its services on its own ports, never another's.

    When another process holds (or answers on) one of its ports and none of this work
    dir's services ran before this call, what this call started is stopped, local.json
    moves to a block of free ports (rewritten atomically, and said so), and it starts
    again. If some of its services already ran, moving them is not ``start``'s to do:
    one line says who holds the port and what to run. Returns the config it ended on.
    """
    from h3flow.config.adapt import on_free_ports, render
    from h3flow.core.fsutil import atomic_write_json

    console = console or Console(highlight=False)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        config = load_local_config(config_path)
        ran_before = [st.spec.name for st in service_status(config, config_path) if st.proc.running]
        try:
            return config, start_services(config, config_path, console=console, deploy=deploy, timeout=timeout)
        except PortTaken as exc:
            if ran_before:
                raise PortTaken(
                    f"{exc}; this config's {', '.join(ran_before)} already run on its ports: "
                    f"`h3flow stop --local -c {config_path}`, then `h3flow start --local -c {config_path}` "
                    "moves them all to free ports",
                    exc.address,
                    exc.port,
                ) from None
            if attempt == PORT_ATTEMPTS:
                raise
            console.print(f"[yellow]![/] {escape(str(exc))}", soft_wrap=True)
            stop_services(config, config_path, console=Console(file=io.StringIO()))
            moved = on_free_ports(config)
            atomic_write_json(config_path, render(moved), private=True)
            console.print(
                f"[yellow]![/] moved this config's services to free ports: Prefect API {moved.prefect.api_url} "
                f"({escape(str(config_path))} updated)",
                soft_wrap=True,
            )
    raise AssertionError("unreachable")


def run_start(config_path: Path, local: bool) -> None:
    config = _checked(config_path, local)
    if config.work_dir:  # the embedded default: this machine, with or without --local
        start_local(config_path)
    else:
        start_services(config, config_path)


def run_stop(config_path: Path, local: bool) -> None:
    stop_services(_checked(config_path, local), config_path)
