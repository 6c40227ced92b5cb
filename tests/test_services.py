"""The service supervisor: `h3flow start / stop --local` and `status --services`.

Real processes throughout: a real Prefect server and real workers on loopback, the
real latent receiver, real signals and PID files. The cluster is started once per
module (the server takes ~6-15 s to become healthy) and the tests run against it in
order: up -> status -> no-op start -> a worker SIGKILLed -> a stale PID file -> down.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.config.adapt import adapt, local_host_map
from h3flow.config.models import LocalConfig, load_host_map, load_local_config
from h3flow.core.errors import H3FlowError
from h3flow.core.fsutil import atomic_write_json
from h3flow.ops.lifecycle import (
    ServiceState,
    bring_up,
    print_service_status,
    service_status,
    start_services,
    stop_services,
)
from h3flow.ops.services import (
    HttpHealth,
    LocalRunner,
    ReceiverHealth,
    ServiceSpec,
    WorkerHealth,
    check_health,
    local_specs,
)

ROOT = Path(__file__).resolve().parents[1]
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
cli = CliRunner()
SERVICES = ("prefect-server", "worker-h3-a0", "worker-h3-a1", "worker-h3-b", "worker-h3-control", "receiver-host-b")
quiet = Console(file=open(os.devnull, "w"), highlight=False)  # noqa: SIM115 - lives for the module


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def embedded(tmp: Path) -> tuple[LocalConfig, Path]:
    """`config-adapt --local` into ``tmp`` on a random high port block."""
    config = adapt(local_host_map(tmp / "wd", random.randint(20000, 60000)), work_dir=str((tmp / "wd").resolve()))
    path = tmp / "local.json"
    atomic_write_json(path, config.model_dump(mode="json"))
    return load_local_config(path), path


def spec(tmp: Path, name: str, code: str, health=None, grace: float = 5.0) -> ServiceSpec:
    """A small Python service for the runner's own tests."""
    return ServiceSpec(
        name=name,
        kind="receiver",
        host="here",
        argv=(sys.executable, "-c", code),
        env={},
        cwd=str(tmp),
        log=str(tmp / f"{name}.log"),
        pidfile=str(tmp / f"{name}.pid"),
        health=health or ReceiverHealth("127.0.0.1", 1),
        stop_grace=grace,
    )


# --------------------------------------------------------------------------- no server needed
def test_start_and_stop_without_local_json_say_so(tmp_path: Path) -> None:
    for command in ("start", "stop"):  # without --local they act on local.json's hosts (tests/test_remote_ops.py)
        result = cli.invoke(app, [command, "--config", str(tmp_path / "local.json")])
        assert result.exit_code == 2
        assert "local.json: no such file (run `h3flow config-adapt` first)" in result.output
        assert "Traceback" not in result.output


def test_start_local_needs_an_embedded_default_config(tmp_path: Path) -> None:
    config = adapt(load_host_map(ROOT / "examples" / "host-map.example.json"))
    path = tmp_path / "local.json"
    atomic_write_json(path, config.model_dump(mode="json"))
    result = cli.invoke(app, ["start", "--local", "--config", str(path)])
    assert result.exit_code == 2 and "no work_dir" in result.output and "config-adapt --local" in result.output
    missing = cli.invoke(app, ["stop", "--local", "--config", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "no such file" in missing.output


def test_the_embedded_defaults_services_as_data(tmp_path: Path) -> None:
    config, path = embedded(tmp_path)
    specs = {s.name: s for s in local_specs(config, path)}
    assert tuple(specs) == SERVICES
    wd = Path(config.work_dir or "")
    port = int(config.prefect.api_url.split(":")[-1].split("/")[0])
    server = specs["prefect-server"]
    # Prefect's own `prefect server start`, its SQLite writes begun IMMEDIATE (h3flow.ops.prefect_server)
    assert server.argv[1:] == (
        "-m",
        "h3flow.ops.prefect_server",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    )
    assert "--background" not in server.argv
    assert server.env["PREFECT_HOME"] == str(wd / "prefect")
    assert server.env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert server.binds == (("127.0.0.1", port),)
    # the UI asks the API it was served with, not Prefect's default 127.0.0.1:4200
    assert (server.env["PREFECT_UI_API_URL"], server.env["PREFECT_SERVER_API_PORT"]) == (
        config.prefect.api_url,
        str(port),
    )
    assert server.env["PREFECT_API_DATABASE_CONNECTION_URL"] == f"sqlite+aiosqlite:///{wd / 'prefect' / 'prefect.db'}"
    assert server.secret_env == {} and "postgres" not in specs  # the embedded default: SQLite, an open loopback API
    assert server.health == HttpHealth(f"http://127.0.0.1:{port}/api/health")
    a1 = specs["worker-h3-a1"]
    assert a1.argv[1:] == (
        "worker", "start", "--pool", "h3-a1", "--type", "h3flow", "--name", "h3-a1-worker", "--limit", "2",
    )  # fmt: skip
    control = specs["worker-h3-control"]
    assert control.argv[-2:] == ("--name", "h3-control-worker"), "the dispatchers' worker has no limit"
    assert a1.env["CUDA_VISIBLE_DEVICES"] == "" and a1.env["PREFECT_WORKER_QUERY_SECONDS"] == "1"
    assert (
        a1.env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30" and a1.env["PREFECT_WORKER_ENABLE_CANCELLATION"] == "true"
    )
    assert a1.env["H3FLOW_POOL"] == "a1" and "H3FLOW_POOL" not in control.env
    assert server.env["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"].endswith(".filesystem")
    assert a1.env["H3FLOW_CONFIG"] == str(path.resolve()) and a1.env["PREFECT_API_URL"] == config.prefect.api_url
    assert a1.health == WorkerHealth(config.prefect.api_url, "h3-a1", "h3-a1-worker")
    receiver = specs["receiver-host-b"]
    (rec,) = config.receivers
    assert receiver.argv[1:] == (
        "receiver", "--store", str(wd / "store" / "host-b"), "--bind", f"127.0.0.1:{rec.port}",
        "--max-bytes", str(config.transfer.max_bytes), "--secret-file", str(wd / "secrets" / "transfer.key"),
    )  # fmt: skip
    for s in specs.values():
        assert Path(s.log).parent == wd / "services" and s.pidfile == s.log.removesuffix(".log") + ".pid"


def test_a_port_taken_by_something_else_is_a_one_line_error(tmp_path: Path) -> None:
    config, path = embedded(tmp_path)
    port = int(config.prefect.api_url.split(":")[-1].split("/")[0])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(H3FlowError) as err:
            start_services(config, path, deploy=None, console=quiet)
    # who holds it, so the user knows which checkout's services they are (here: this test)
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()} (" in str(err.value)
    assert "\n" not in str(err.value)
    assert not list((Path(config.work_dir or "") / "services").glob("*.pid"))  # nothing was started


def test_a_port_answered_by_another_process_is_not_taken_for_the_service(tmp_path: Path) -> None:
    """Two starts at once: the port was free when checked, then another process took it
    before this service bound it. Its health check passes against the other process; the
    socket's owner says it is not this service, which is stopped."""
    from h3flow.ops.lifecycle import PortTaken, ensure_started, wait_healthy

    runner = LocalRunner()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    svc = ServiceSpec(
        name="svc", kind="receiver", host="here", argv=(sys.executable, "-c", "import time; time.sleep(600)"),
        env={}, cwd=str(tmp_path), log=str(tmp_path / "svc.log"), pidfile=str(tmp_path / "svc.pid"),
        health=HttpHealth(f"http://127.0.0.1:{port}/", expect=None), binds=(("127.0.0.1", port),), stop_grace=5.0,
    )  # fmt: skip
    state = ensure_started(svc, runner)  # the port is free: it is spawned
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: check_health(svc.health)[0], what="the other process to answer")
        with pytest.raises(PortTaken) as err:
            wait_healthy([state], lambda _h: runner, timeout=30, console=quiet)
    finally:
        other.kill()
        other.wait()
    message = str(err.value)
    assert f"svc: port {port} on 127.0.0.1 is answered by pid {other.pid} (" in message
    assert f"http.server {port}" in message and f"not by the svc h3flow started (pid {state.proc.pid})" in message
    assert "\n" not in message and err.value.port == port
    assert not alive(state.proc.pid or 0) and not Path(svc.pidfile).exists()  # stopped, not left behind


def test_a_service_that_dies_at_start_up_shows_its_log(tmp_path: Path) -> None:
    runner = LocalRunner()
    dying = spec(tmp_path, "dying", "import sys; print('cannot open the store: disk full'); sys.exit(3)")
    with pytest.raises(H3FlowError) as err:
        bring_up([dying], lambda _h: runner, timeout=10, console=quiet)
    message = str(err.value)
    assert "dying exited while starting" in message and "cannot open the store: disk full" in message
    assert not Path(dying.pidfile).exists()


def test_a_service_never_healthy_is_stopped_and_its_log_shown(tmp_path: Path) -> None:
    runner = LocalRunner()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    stuck = spec(
        tmp_path, "stuck", "import time; print('warming up', flush=True); time.sleep(600)",
        health=ReceiverHealth("127.0.0.1", closed_port),
    )  # fmt: skip
    with pytest.raises(H3FlowError) as err:
        bring_up([stuck], lambda _h: runner, timeout=1.5, console=quiet)
    assert "stuck not healthy after 2 s" in str(err.value) and "warming up" in str(err.value)
    assert not Path(stuck.pidfile).exists()
    assert not _pids_running(stuck.argv[-1])  # stopped, not left half-started


def _pids_running(arg: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            try:
                if arg.encode() in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                    out.append(int(entry))
            except OSError:
                continue
    return out


def test_stop_ends_the_whole_process_tree_and_sigkills_a_stubborn_one(tmp_path: Path) -> None:
    runner = LocalRunner()
    # like a Prefect worker's flow run: a child in a session of its own
    code = "import subprocess, time; subprocess.Popen(['sleep', '600'], start_new_session=True); time.sleep(600)"
    family = spec(tmp_path, "family", code)
    proc = runner.spawn(family)
    assert proc.pid is not None
    wait_until(lambda: any(_children_of(proc.pid)), what="the grandchild")
    (grandchild,) = _children_of(proc.pid)
    assert runner.stop(family, proc.pid) is False  # SIGTERM was enough
    assert not alive(proc.pid) and not alive(grandchild) and not Path(family.pidfile).exists()

    stubborn = spec(
        tmp_path, "stubborn",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
        "time.sleep(600)",
        grace=0.5,
    )  # fmt: skip
    proc = runner.spawn(stubborn)
    wait_until(lambda: "ready" in " ".join(runner.tail(stubborn)), what="the handler")
    assert runner.stop(stubborn, proc.pid or 0) is True  # needed SIGKILL
    assert not alive(proc.pid or 0)


def test_a_service_that_turns_sigterm_into_sigint_stops_though_its_starter_ignored_sigint(tmp_path: Path) -> None:
    # what a Prefect worker does (SIGTERM -> SIGINT to itself, KeyboardInterrupt ends it),
    # started by a process that ignores SIGINT (a `cmd &` job of a non-interactive shell)
    runner = LocalRunner()
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: os.kill(os.getpid(), signal.SIGINT))\n"
        "print('ready', flush=True)\n"
        "try:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
    )
    worker_like = spec(tmp_path, "worker-like", code, grace=60.0)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = runner.spawn(worker_like)
    finally:
        signal.signal(signal.SIGINT, previous)
    wait_until(lambda: "ready" in " ".join(runner.tail(worker_like)), what="the handler")
    assert runner.stop(worker_like, proc.pid or 0) is False  # SIGTERM ended it; no SIGKILL needed
    assert "interrupted" in runner.tail(worker_like) and not alive(proc.pid or 0)


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            if fields[1] == str(pid) and fields[0] != "Z":
                out.append(int(entry))
    return out


def test_a_stale_pid_file_is_not_mistaken_for_the_service(tmp_path: Path) -> None:
    runner = LocalRunner()
    svc = spec(tmp_path, "svc", "import time; time.sleep(600)")
    Path(svc.pidfile).write_text(f"{os.getpid()}\n")  # alive, but not this service's command line
    assert runner.inspect(svc).running is False and runner.inspect(svc).stale is True
    Path(svc.pidfile).write_text("not a pid\n")
    assert runner.inspect(svc).stale is True


# --------------------------------------------------------------------------- the embedded default, live
class Cluster:
    def __init__(self, config: LocalConfig, path: Path, states: list[ServiceState], deploys: list[bool]) -> None:
        self.config, self.path, self.states, self.deploys = config, path, states, deploys

    def pids(self) -> dict[str, int]:
        return {s.spec.name: int(Path(s.spec.pidfile).read_text()) for s in self.states}

    def spec(self, name: str) -> ServiceSpec:
        return next(s.spec for s in self.states if s.spec.name == name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config, path = embedded(tmp_path_factory.mktemp("services"))
    deploys: list[bool] = []

    def deploy(cfg: LocalConfig, cfg_path: Path) -> None:  # stands in for deploy_all: records the order
        deploys.append(check_health(HttpHealth(cfg.prefect.api_url + "/health"))[0])

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # start as a background job of a script would
    try:
        states = start_services(config, path, deploy=deploy, console=quiet)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield Cluster(config, path, states, deploys)
    finally:
        stop_services(config, path, console=quiet)


@pytest.mark.prefect
def test_start_local_brings_up_server_workers_and_receiver(cluster: Cluster) -> None:
    assert {s.spec.name: (s.action, s.healthy) for s in cluster.states} == {
        name: ("started", True) for name in SERVICES
    }
    assert cluster.deploys == [True]  # deploy ran once, after the server was healthy
    for name, pid in cluster.pids().items():
        assert alive(pid), name
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid, f"{name} is not its own session"
    for pool in ("h3-a0", "h3-a1", "h3-b", "h3-control"):
        ok, detail = check_health(WorkerHealth(cluster.config.prefect.api_url, pool, f"{pool}-worker"))
        assert ok, detail
    (rec,) = cluster.config.receivers
    assert check_health(ReceiverHealth(rec.bind, rec.port)) == (True, f"answers ping on 127.0.0.1:{rec.port}")
    ui = httpx.get(cluster.config.prefect.api_url.removesuffix("/api") + "/ui-settings", timeout=10).json()
    assert ui["api_url"] == cluster.config.prefect.api_url and ui["auth"] is None
    key = Path(cluster.config.transfer.secret.path or "")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_text().strip()) == 64
    environ = Path(f"/proc/{cluster.pids()['worker-h3-a0']}/environ").read_bytes().split(b"\0")
    assert b"H3FLOW_CONFIG=" + str(cluster.path.resolve()).encode() in environ
    assert b"PREFECT_HOME=" + str(Path(cluster.config.work_dir or "") / "prefect").encode() in environ


@pytest.mark.prefect
def test_status_lists_every_service_running_and_healthy(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    states = service_status(cluster.config, cluster.path)
    pids = cluster.pids()
    assert {s.spec.name: (s.proc.running, s.proc.pid, s.healthy) for s in states} == {
        name: (True, pid, True) for name, pid in pids.items()
    }
    assert all(s.uptime is not None and 0 < s.uptime < 600 for s in states)
    print_service_status(cluster.path, console=Console(width=200, highlight=False))
    out = capsys.readouterr().out
    for name, pid in pids.items():
        line = next(line for line in out.splitlines() if name in line)
        assert "running" in line and str(pid) in line and "✓" in line


@pytest.mark.prefect
def test_a_second_start_is_a_no_op(cluster: Cluster) -> None:
    before = cluster.pids()
    result = subprocess.run(
        [H3FLOW, "start", "--local", "--config", str(cluster.path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert cluster.pids() == before
    assert result.stdout.count("running, pid") == len(before)
    assert "started" not in result.stdout and "deployments" not in result.stdout


@pytest.mark.prefect
def test_a_sigkilled_worker_is_reported_stopped_and_restarted_by_start(cluster: Cluster) -> None:
    before = cluster.pids()
    victim = before["worker-h3-a0"]
    os.killpg(victim, signal.SIGKILL)
    wait_until(lambda: not alive(victim), what="the worker to die")
    states = {s.spec.name: s for s in service_status(cluster.config, cluster.path)}
    assert states["worker-h3-a0"].proc.running is False and "stale PID file" in states["worker-h3-a0"].detail
    assert all(s.proc.running for name, s in states.items() if name != "worker-h3-a0")

    again = {s.spec.name: s for s in start_services(cluster.config, cluster.path, deploy=None, console=quiet)}
    assert again["worker-h3-a0"].action == "restarted" and again["worker-h3-a0"].healthy is True
    assert "ONLINE, heartbeat" in again["worker-h3-a0"].detail
    after = cluster.pids()
    assert after["worker-h3-a0"] != victim and alive(after["worker-h3-a0"])
    assert {k: v for k, v in after.items() if k != "worker-h3-a0"} == {
        k: v for k, v in before.items() if k != "worker-h3-a0"
    }
    assert {s.action for name, s in again.items() if name != "worker-h3-a0"} == {"running"}


@pytest.mark.prefect
def test_a_stale_pid_file_is_replaced_on_start(cluster: Cluster) -> None:
    receiver = cluster.spec("receiver-host-b")
    old = cluster.pids()["receiver-host-b"]
    os.killpg(old, signal.SIGTERM)  # it dies behind h3flow's back, leaving its PID file
    wait_until(lambda: not alive(old), what="the receiver to exit")
    Path(receiver.pidfile).write_text(f"{os.getpid()}\n")  # and the PID now belongs to someone else
    (rec,) = cluster.config.receivers
    wait_until(lambda: bindable(rec.port), what="the receiver's port to be free")
    states = {s.spec.name: s for s in start_services(cluster.config, cluster.path, deploy=None, console=quiet)}
    assert states["receiver-host-b"].action == "restarted" and states["receiver-host-b"].healthy is True
    new = cluster.pids()["receiver-host-b"]
    assert new not in (old, os.getpid()) and alive(new)
    assert alive(os.getpid())  # (the process the stale file named was not signalled)


@pytest.mark.prefect
def test_services_do_not_inherit_an_ignored_stop_signal(cluster: Cluster) -> None:
    # the cluster was started with SIGINT ignored (as under `cmd &` in a script): a Prefect
    # worker maps SIGTERM to SIGINT, so an inherited SIG_IGN made it ignore `stop`
    for name, pid in cluster.pids().items():
        ignored = int(_status_field(pid, "SigIgn"), 16)
        for sig in (signal.SIGINT, signal.SIGTERM):
            assert not ignored & (1 << (sig - 1)), f"{name} ignores {sig.name}"


def _status_field(pid: int, key: str) -> str:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith(key + ":"))
    return line.split(":", 1)[1].strip()


@pytest.mark.prefect
def test_another_work_dir_on_the_same_ports_gets_ports_of_its_own(cluster: Cluster, tmp_path: Path) -> None:
    """Two checkouts' embedded defaults with the same ports (config-adapt picked them while
    neither ran): the second `start` must not take the first's server for its own (its
    workers then ran the first's flows); it moves to free ports. Once its own services run,
    a port taken from under one of them is refused in one line that says what to do."""
    a_pids = cluster.pids()
    b_path = tmp_path / "local.json"
    b_path.write_text(cluster.path.read_text().replace(str(cluster.config.work_dir), str(tmp_path / "wd")))
    b_before = load_local_config(b_path)
    assert b_before.prefect.api_url == cluster.config.prefect.api_url
    try:
        res = subprocess.run(
            [H3FLOW, "start", "--local", "-c", str(b_path)], capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0, res.stdout + res.stderr
        b = load_local_config(b_path)
        a_port, b_port = (int(c.prefect.api_url.split(":")[-1].split("/")[0]) for c in (cluster.config, b))
        assert b_port != a_port and b.receivers[0].port != cluster.config.receivers[0].port
        assert f"port {a_port} on 127.0.0.1 is in use by pid {a_pids['prefect-server']} (" in res.stdout
        assert f"moved this config's services to free ports: Prefect API {b.prefect.api_url}" in res.stdout
        b_specs = {s.name: s for s in local_specs(b, b_path)}
        b_pids = {name: int(Path(s.pidfile).read_text()) for name, s in b_specs.items()}
        assert set(b_pids.values()).isdisjoint(a_pids.values())
        from h3flow.ops.listeners import foreign_holder

        assert foreign_holder("127.0.0.1", b_port, b_pids["prefect-server"]) is None  # its own server answers
        environ = Path(f"/proc/{b_pids['worker-h3-a0']}/environ").read_bytes().split(b"\0")
        assert b"PREFECT_API_URL=" + b.prefect.api_url.encode() in environ  # its workers ask its server
        assert check_health(WorkerHealth(b.prefect.api_url, "h3-a0", "h3-a0-worker"))[0]
        assert cluster.pids() == a_pids and all(alive(pid) for pid in a_pids.values())  # the first is untouched

        receiver = b_specs["receiver-host-b"]
        LocalRunner().stop(receiver, b_pids["receiver-host-b"])
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", b.receivers[0].port))
            squatter.listen()
            res = subprocess.run(
                [H3FLOW, "start", "--local", "-c", str(b_path)], capture_output=True, text=True, timeout=300
            )
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
        assert f"port {b.receivers[0].port} on 127.0.0.1 is in use by pid {os.getpid()} (" in res.stderr
        assert "prefect-server, worker-h3-a0" in res.stderr and "already run on its ports" in res.stderr
        assert f"`h3flow stop --local -c {b_path}`, then `h3flow start --local -c {b_path}`" in res.stderr
        assert load_local_config(b_path).prefect.api_url == b.prefect.api_url  # not moved under running services
    finally:
        stop_services(load_local_config(b_path), b_path, console=quiet)
    assert cluster.pids() == a_pids and all(alive(pid) for pid in a_pids.values())


@pytest.mark.prefect
def test_stop_stops_everything_and_frees_the_ports(cluster: Cluster) -> None:
    pids = cluster.pids()
    result = subprocess.run(
        [H3FLOW, "stop", "--local", "--config", str(cluster.path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name, pid in pids.items():  # the outcome, not how fast: a SIGKILL is allowed, and said so
        line = next(line for line in result.stdout.splitlines() if f" {name} " in f" {line} ")
        assert f"stopped (pid {pid})" in line or (f"killed (pid {pid})" in line and "SIGKILL" in line), line
    assert not any(alive(pid) for pid in pids.values())
    assert not any(Path(s.spec.pidfile).exists() for s in cluster.states)
    port = int(cluster.config.prefect.api_url.split(":")[-1].split("/")[0])
    (rec,) = cluster.config.receivers
    assert bindable(port) and bindable(rec.port)
    assert {s.proc.running for s in service_status(cluster.config, cluster.path)} == {False}
    again = cli.invoke(app, ["stop", "--local", "--config", str(cluster.path)])
    assert again.exit_code == 0 and again.output.count("not running") == len(pids)
