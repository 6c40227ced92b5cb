"""Remote operations over a real OpenSSH server (the loopback ``sshd`` fixture).

The "remote" host is this machine behind sshd, so every step runs through SSH (fabric,
host keys checked, commands quoted) and its effects can be checked in /proc and on disk
here: services spawned, inspected, health-waited and stopped by the same lifecycle steps
as ``--local``; files copied with their modes; the patches and the node pack installed
on the host; what happens with unknown keys, a missing venv, and shell metacharacters.
"""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from remote_hosts import free_port, host_map, write_config
from rich.console import Console
from sshd import SshServer
from test_patches import COMFY, checkout
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.config.models import ResolvedHost
from h3flow.core.errors import H3FlowError, TransientError
from h3flow.ops.lifecycle import _served_elsewhere, bring_down, bring_up, probe_all
from h3flow.ops.remote import store_inventory
from h3flow.ops.services import HttpHealth, ServiceSpec, remote_specs
from h3flow.ops.ssh import SSH_CONFIG_ENV, SshRunner, SshRunners, remote

pytestmark = pytest.mark.sshd
quiet = Console(file=open(os.devnull, "w"), highlight=False)  # noqa: SIM115 - lives for the module
cli = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def ssh_config(sshd: SshServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SSH_CONFIG_ENV, str(sshd.config))


@pytest.fixture
def config(sshd: SshServer, tmp_path: Path):
    return write_config(tmp_path, host_map(tmp_path, sshd.alias))


def host_of(config, name: str = "host-a") -> ResolvedHost:
    return config[0].hosts[name]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def http_service(tmp: Path, port: int, name: str = "web") -> ServiceSpec:
    """A real HTTP server as a service; its folder has a space and a quote in it."""
    folder = tmp / "it's a dir"
    return ServiceSpec(
        name=name, kind="worker", host="host-a",
        argv=(sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)),
        env={"H3FLOW_TEST": "a b; $(touch pwned)"}, cwd=str(folder),
        log=str(folder / f"{name}.log"), pidfile=str(folder / f"{name}.pid"),
        health=HttpHealth(f"http://127.0.0.1:{port}/", expect=None), binds=(("127.0.0.1", port),), stop_grace=5.0,
    )  # fmt: skip


# --------------------------------------------------------------------------- the connection
def test_remote_commands_are_quoted_never_interpreted(config, tmp_path: Path) -> None:
    runner = SshRunner(host_of(config))
    try:
        evil = f"$(touch {tmp_path}/a); touch {tmp_path}/b"
        code, out, _ = runner.exec(["printf", "%s|", "two words", evil, "*"])
        assert code == 0 and out == f"two words|{evil}|*|"
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    finally:
        runner.close()


def test_unknown_and_changed_host_keys_are_refused(sshd: SshServer, config, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    stranger = host_of(config).model_copy(update={"ssh_alias": sshd.add_alias("h8-stranger", known_hosts=empty)})
    with pytest.raises(
        H3FlowError, match=r"host host-a \(ssh h8-stranger\): the host key of 127.0.0.1:\d+ is not in known_hosts"
    ):
        remote(stranger)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    forged = tmp_path / "known_hosts_forged"
    forged.write_text(f"[{sshd.host}]:{sshd.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    impostor = host_of(config).model_copy(update={"ssh_alias": sshd.add_alias("h8-impostor", known_hosts=forged)})
    with pytest.raises(H3FlowError, match="does not match known_hosts"):
        remote(impostor)


def test_an_alias_unknown_to_the_ssh_config_uses_the_host_maps_address_port_user(
    sshd: SshServer, config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssh_config = tmp_path / "ssh_config"  # keys for the address, but no alias and no port
    ssh_config.write_text(
        f'Host {sshd.host}\n    IdentityFile "{sshd.identity}"\n    IdentitiesOnly yes\n'
        f'    UserKnownHostsFile "{sshd.known_hosts}"\n'
    )
    monkeypatch.setenv(SSH_CONFIG_ENV, str(ssh_config))
    host = host_of(config).model_copy(update={"ssh_alias": "not-in-any-config", "port": sshd.port, "user": sshd.user})
    conn = remote(host)
    try:
        assert (conn.host, conn.port, conn.user) == (sshd.host, sshd.port, sshd.user)
        assert conn.run("echo reached", hide=True, in_stream=False).stdout == "reached\n"
    finally:
        conn.close()


def test_an_unreachable_host_is_named(sshd: SshServer, config) -> None:
    closed = free_port()
    dead = host_of(config).model_copy(update={"ssh_alias": sshd.add_alias("h8-dead", port=closed)})
    with pytest.raises(
        TransientError, match=rf"cannot reach host host-a \(ssh h8-dead\) at 127.0.0.1:{closed}: .*refused"
    ):
        SshRunner(dead).exec(["true"])


def test_a_venv_without_python_or_h3flow_is_named(config, tmp_path: Path) -> None:
    empty = tmp_path / "empty-venv"
    (empty / "bin").mkdir(parents=True)
    with pytest.raises(H3FlowError, match=rf"host host-a \(ssh h3test\): no python at {empty}/bin/python"):
        SshRunner(host_of(config).model_copy(update={"venv": str(empty)})).agent(
            "port_free", {"address": "127.0.0.1", "port": 1}
        )
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(H3FlowError, match=rf"h3flow is not installed in {bare}"):
        SshRunner(host_of(config).model_copy(update={"venv": str(bare)})).agent(
            "port_free", {"address": "127.0.0.1", "port": 1}
        )


# --------------------------------------------------------------------------- services through SSH
def test_services_start_health_wait_idempotently_and_stop_by_pid_over_ssh(config, tmp_path: Path) -> None:
    port = free_port()
    web = http_service(tmp_path, port)
    with SshRunners(config[0]) as runners:
        runner = runners("host-a")
        assert runner.inspect(web).running is False and runner.port_free("127.0.0.1", port)
        (state,) = bring_up([web], runners, timeout=60, console=quiet)
        pid = state.proc.pid
        assert state.action == "started" and state.healthy and alive(pid)
        assert os.getsid(pid) == pid, "the service runs in a session of its own"
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"H3FLOW_TEST=a b; $(touch pwned)" in environ and not (tmp_path / "it's a dir" / "pwned").exists()
        assert not runner.port_free("127.0.0.1", port)
        assert Path(web.pidfile).read_text().strip() == str(pid)
        (again,) = bring_up([web], runners, timeout=60, console=quiet)
        assert (again.action, again.proc.pid) == ("running", pid)  # left alone
        (probe,) = probe_all([web], runners)
        assert probe.healthy and probe.uptime is not None and 0 <= probe.uptime < 300
        assert any("starting web" in line for line in runner.tail(web))
        (down,) = bring_down([web], runners, console=quiet)
        assert down.action == "stopped" and not alive(pid) and not Path(web.pidfile).exists()
        assert runner.port_free("127.0.0.1", port)


def test_a_stale_pid_file_is_seen_and_replaced_over_ssh(config, tmp_path: Path) -> None:
    web = http_service(tmp_path, free_port(), "stale")
    Path(web.pidfile).parent.mkdir(parents=True, exist_ok=True)
    Path(web.pidfile).write_text(f"{os.getpid()}\n")  # a live process, but not this service
    with SshRunners(config[0]) as runners:
        proc = runners("host-a").inspect(web)
        assert (proc.pid, proc.running, proc.stale) == (os.getpid(), False, True)
        (state,) = bring_up([web], runners, timeout=60, console=quiet)
        assert state.action == "restarted" and state.proc.pid != os.getpid()
        bring_down([web], runners, console=quiet)
    assert alive(os.getpid())


def test_a_stubborn_service_tree_is_killed_and_a_dying_one_shows_its_remote_log(config, tmp_path: Path) -> None:
    script = (
        "import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
        "print('up', flush=True); time.sleep(600)"
    )
    folder = tmp_path / "svc"
    stubborn = ServiceSpec(
        name="stubborn",
        kind="worker",
        host="host-a",
        argv=(sys.executable, "-c", script),
        env={},
        cwd=str(folder),
        log=str(folder / "s.log"),
        pidfile=str(folder / "s.pid"),
        health=HttpHealth("http://127.0.0.1:1/"),
        stop_grace=1.0,
    )
    with SshRunners(config[0]) as runners:
        runner = runners("host-a")
        proc = runner.spawn(stubborn)
        deadline = time.monotonic() + 30
        while "up" not in runner.tail(stubborn) and time.monotonic() < deadline:
            time.sleep(0.1)
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(int(p.name)) == proc.pid]
        assert children, "the service started its child"
        assert runner.stop(stubborn, proc.pid) is True  # SIGTERM ignored: SIGKILL after the grace
        assert not alive(proc.pid) and not any(alive(c) for c in children), "the child in its own session too"
        dying = ServiceSpec(
            name="dying",
            kind="worker",
            host="host-a",
            argv=(sys.executable, "-c", "print('cannot open the store: disk full'); raise SystemExit(3)"),
            env={},
            cwd=str(folder),
            log=str(folder / "d.log"),
            pidfile=str(folder / "d.pid"),
            health=HttpHealth("http://127.0.0.1:1/"),
        )
        with pytest.raises(H3FlowError, match=r"dying exited while starting; last lines of .*d.log: .*disk full"):
            bring_up([dying], runners, timeout=30, console=quiet)


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, IndexError):
        return -1


def test_files_are_written_atomically_with_their_mode_and_left_alone_when_equal(config, tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "secret.key"
    with SshRunners(config[0]) as runners:
        runner = runners("host-a")
        assert runner.put_bytes(str(target), b"s3cret\n", 0o600) is True
        assert target.read_bytes() == b"s3cret\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
        inode = target.stat().st_ino
        assert runner.put_bytes(str(target), b"s3cret\n", 0o600) is False and target.stat().st_ino == inode
        assert runner.put_bytes(str(target), b"new\n", 0o600) is True and target.read_bytes() == b"new\n"
        assert sorted(p.name for p in target.parent.iterdir()) == ["secret.key"]  # no temp file left
        cfg, _ = config
        key = Path(cfg.transfer.secret.path or "")
        assert not key.exists()
        runner.ensure_secret(cfg.transfer.secret)  # made once on this machine, then copied as is
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_text().strip()) == 64


def test_remote_specs_run_from_each_hosts_venv_with_its_own_folders(config) -> None:
    cfg, path = config
    specs = {s.name: s for s in remote_specs(cfg, path)}
    assert list(specs) == [
        "postgres",
        "prefect-server",
        "worker-h3-a0",
        "worker-h3-a1",
        "worker-h3-b",
        "worker-h3-control",
        "receiver-host-b",
    ]
    root_a = Path(cfg.hosts["host-a"].storage.root)
    server = specs["prefect-server"]
    assert server.host == "host-a" and server.argv[:3] == (
        f"{sys.prefix}/bin/python",
        "-m",
        "h3flow.ops.prefect_server",
    )
    assert server.env["PREFECT_HOME"] == str(root_a / "prefect-home")
    port = cfg.prefect.api_url.split(":")[2].split("/")[0]
    assert server.env["PREFECT_API_DATABASE_CONNECTION_URL"] == (
        "postgresql+asyncpg://prefect:${PREFECT_API_DATABASE_PASSWORD}@127.0.0.1:5432/prefect"
    )
    secrets = Path(cfg.transfer.secret.path or "").parent
    assert server.secret_env == {  # where the host reads them, never the values
        "PREFECT_SERVER_API_AUTH_STRING": ("file", str(secrets / "prefect-api.auth")),
        "PREFECT_API_DATABASE_PASSWORD": ("file", str(secrets / "postgres.password")),
    }
    assert (server.env["PREFECT_UI_API_URL"], server.env["PREFECT_SERVER_API_PORT"]) == (cfg.prefect.api_url, port)
    database = specs["postgres"]
    assert database.host == "host-a" and database.user == "postgres" and database.cwd == str(root_a / "postgres")
    assert database.argv == (
        "postgres", "-D", str(root_a / "postgres"), "-h", "127.0.0.1", "-p", "5432", "-c", "unix_socket_directories=",
    )  # fmt: skip
    assert database.setup[0][1:3] == ("-m", "h3flow.ops.postgres") and database.stop_signal == signal.SIGINT
    worker = specs["worker-h3-b"]
    root_b = Path(cfg.hosts["host-b"].storage.root)
    assert worker.log == str(root_b / "services" / "worker-h3-b.log") and worker.cwd == str(root_b / "services")
    assert worker.env["PATH"] == f"{sys.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert worker.env["H3FLOW_CONFIG"] == str(path.resolve()) and worker.env["PREFECT_HOME"] == str(
        root_b / "prefect-home"
    )
    assert specs["worker-h3-a0"].env["H3_MP_RETAIN_CPU_WEIGHTS"] == "1"
    assert worker.secret_env == {"PREFECT_API_AUTH_STRING": ("file", str(secrets / "prefect-api.auth"))}
    assert "PREFECT_API_AUTH_STRING" not in worker.env  # the value travels to no command line or JSON
    assert specs["receiver-host-b"].argv[-2:] == ("--secret-file", cfg.transfer.secret.path)


# --------------------------------------------------------------------------- patches and node pack on a host
def test_patches_check_and_apply_on_a_host(config, tmp_path: Path) -> None:
    _cfg, path = config
    tree = tmp_path / "remote ComfyUI"
    checkout(tree, COMFY)  # the real upstream pre-image (skips without ../shared/upstream)
    args = ["patches", "check", "--host", "host-b", "--comfy-dir", str(tree), "--config", str(path)]
    first = cli.invoke(app, args)
    assert first.exit_code == 1 and f"comfy-turing-lerp.patch not applied in {tree}" in first.output
    applied = cli.invoke(app, ["patches", "apply", *args[2:]])
    assert applied.exit_code == 0 and f"comfy-turing-lerp.patch applied now in {tree}" in applied.output
    assert "cast_to(self.adaln_t_table, dtype=torch.float32" in (tree / "comfy/ldm/minimax/model.py").read_text()
    assert cli.invoke(app, args).exit_code == 0
    again = cli.invoke(app, ["patches", "apply", *args[2:]])
    assert "already applied, left alone" in again.output
    wrong = cli.invoke(
        app, ["patches", "check", "--host", "host-b", "--comfy-dir", str(tmp_path), "--config", str(path)]
    )
    assert wrong.exit_code == 2 and "comfy/ldm/minimax/model.py hunk #1: file not found" in wrong.output
    nothing = cli.invoke(app, ["patches", "check", "--host", "host-b", "--config", str(path)])
    assert nothing.exit_code == 2 and "host 'host-b' has no comfy_dir or raylight_dir in local.json" in nothing.output
    unknown = cli.invoke(app, ["patches", "check", "--host", "nope", "--config", str(path)])
    assert unknown.exit_code == 2 and "unknown host 'nope'" in unknown.output


def test_nodes_install_on_a_host_is_idempotent(config, tmp_path: Path) -> None:
    _, path = config
    comfy = tmp_path / "ComfyUI on host"
    comfy.mkdir()
    (comfy / "main.py").write_text("# ComfyUI\n")
    args = ["nodes", "install", "--host", "host-a", "--comfy-dir", str(comfy), "--config", str(path)]
    pack = comfy / "custom_nodes" / "h3flow_nodes"
    first = cli.invoke(app, args)
    assert first.exit_code == 0 and f"installed in {pack} on host-a" in first.output
    source = Path(__file__).resolve().parents[1] / "comfy_nodes" / "h3flow_nodes" / "nodes.py"
    assert (pack / "nodes.py").read_bytes() == source.read_bytes()
    assert "unchanged" in cli.invoke(app, args).output
    (pack / "nodes.py").write_text("# edited on the host\n")
    assert "updated" in cli.invoke(app, args).output and (pack / "nodes.py").read_bytes() == source.read_bytes()
    link = cli.invoke(app, [*args, "--link"])
    assert link.exit_code == 2 and "cannot reach another host" in link.output


def test_start_and_stop_without_local_go_over_ssh_and_name_an_unreachable_host(sshd: SshServer, tmp_path: Path) -> None:
    dead = sshd.add_alias("h8-down", port=free_port())
    _, path = write_config(tmp_path, host_map(tmp_path, sshd.alias, decoder_alias=dead))
    for command in ("start", "stop"):
        result = cli.invoke(app, [command, "--config", str(path)])
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert "cannot reach host host-b (ssh h8-down)" in result.output, result.output
    stopped = cli.invoke(app, ["stop", "--config", str(path)])  # host-a's services are still stopped
    assert "worker-h3-a0" in stopped.output and "stopped what runs on the other hosts, but" in stopped.output
    local = cli.invoke(app, ["start", "--local", "--config", str(path)])
    assert local.exit_code == 2 and "no work_dir" in local.output


def test_a_prefect_api_served_by_others_is_used_and_one_nowhere_is_a_clear_error(
    sshd: SshServer, tmp_path: Path
) -> None:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)  # a Prefect API h3flow did not start
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api"
        cfg, path = write_config(tmp_path, host_map(tmp_path, sshd.alias, api_url=url))
        spec = next(s for s in remote_specs(cfg, path) if s.kind == "prefect-server")
        out = io.StringIO()
        with SshRunners(cfg) as runners:
            assert _served_elsewhere(spec, runners, Console(file=out, highlight=False, width=200)) is True
        assert (
            "prefect-server     already served (/api/health → true; not started by h3flow: left alone)"
            in out.getvalue()
        )
    finally:
        server.shutdown()
        server.server_close()
    elsewhere = tmp_path / "elsewhere"
    _, path = write_config(elsewhere, host_map(elsewhere, sshd.alias, api_url=f"http://127.0.0.2:{free_port()}/api"))
    result = cli.invoke(app, ["start", "--config", str(path)])
    assert result.exit_code == 2 and "the Prefect API does not answer" in result.output
    assert "no host of local.json has the address of http://127.0.0.2:" in result.output


# --------------------------------------------------------------------------- what a host's store holds
def test_store_inventory_asks_the_host_and_verifies_by_sha256(config) -> None:
    import hashlib

    from h3flow.handoff.store import LatentStore

    cfg, _path = config
    storage = cfg.hosts["host-b"].storage
    store = LatentStore(Path(storage.root))
    good, bad = b"a latent" * 1000, b"another latent" * 1000
    sha_good, sha_bad, sha_gone = (hashlib.sha256(x).hexdigest() for x in (good, bad, b"never sent"))
    for sha, data in ((sha_good, good), (sha_bad, bad)):
        store.path_for(sha).parent.mkdir(parents=True, exist_ok=True)
        store.path_for(sha).write_bytes(data)
    store.path_for(sha_bad).write_bytes(bad[:-1] + b"!")  # bit rot at rest
    run = Path(storage.outputs) / "run-1"
    run.mkdir(parents=True)
    (run / "c0.mp4").write_bytes(b"video 0")
    (run / "c1.mp4").write_bytes(b"video 1, edited")
    mp4 = [
        (str(run / "c0.mp4"), hashlib.sha256(b"video 0").hexdigest()),
        (str(run / "c1.mp4"), hashlib.sha256(b"video 1").hexdigest()),
        (str(run / "c2.mp4"), hashlib.sha256(b"video 2").hexdigest()),
    ]
    seen = store_inventory(cfg, "host-b", [sha_good, sha_bad, sha_gone], mp4)
    assert (seen.latents, seen.outputs, seen.repaired) == (
        {sha_good: "ok", sha_bad: "damaged", sha_gone: "missing"},
        {mp4[0][0]: "ok", mp4[1][0]: "damaged", mp4[2][0]: "missing"},
        [],
    )
    assert store.path_for(sha_bad).exists() and (run / "c1.mp4").exists()  # looking moves nothing
    again = store_inventory(cfg, "host-b", [sha_good, sha_bad], mp4[:2], repair=True)
    assert again.latents == {sha_good: "ok", sha_bad: "damaged"}
    assert again.outputs == {mp4[0][0]: "ok", mp4[1][0]: "damaged"}
    assert len(again.repaired) == 2 and "c1.mp4 no longer matched its SHA-256" in again.repaired[1]
    assert not store.path_for(sha_bad).exists() and not (run / "c1.mp4").exists()
    assert [p.read_bytes() for p in (Path(storage.root) / "latents-damaged").iterdir()] == [bad[:-1] + b"!"]
    assert [p.read_bytes() for p in run.glob("c1.mp4.damaged-*")] == [b"video 1, edited"]  # kept, out of the way
    with pytest.raises(H3FlowError, match="is not under this host's outputs"):
        store_inventory(cfg, "host-b", [], [("/etc/passwd", sha_good)])
    with pytest.raises(H3FlowError, match="not a SHA-256 content address"):
        store_inventory(cfg, "host-b", ["../../etc/passwd"], [])


# --------------------------------------------------------------------------- run state and images, no shared disk
def test_images_are_staged_and_run_state_is_read_through_the_hosts_agents(config, tmp_path: Path) -> None:
    import hashlib

    from h3flow.core.batch import Batch, Clip
    from h3flow.handoff.inputs import image_on_this_host, input_path
    from h3flow.ops.remote import image_stager, manifest_reader, run_lister
    from h3flow.pipeline.manifest import new_manifest, save_manifest

    cfg, _path = config
    image = tmp_path / "controller-only.png"
    image.write_bytes((ROOT / "examples" / "images" / "landscape.png").read_bytes())
    sha = hashlib.sha256(image.read_bytes()).hexdigest()
    batch = Batch(name="b", clips=[Clip(id="c0", prompt="p", image=image, spec="tiny", seed=1, image_sha256=sha)])
    assert image_stager(cfg)(cfg, batch) == batch
    staged = input_path(Path(cfg.hosts["host-a"].storage.root), sha, ".png")
    assert hashlib.sha256(staged.read_bytes()).hexdigest() == sha  # host-a (the only encoder host) holds it
    image.unlink()  # gone from the "controller": the encode stage finds the staged copy
    assert image_on_this_host(batch.clips[0], Path(cfg.hosts["host-a"].storage.root), "host-a").image == staged

    manifest = new_manifest("run-1", "b", batch.clips, "local.json")
    manifest.state = "completed"
    save_manifest(cfg.runs_dir, manifest)
    assert manifest_reader(cfg)("run-1").model_dump() == manifest.model_dump()
    (listed,) = run_lister(cfg)(5)
    assert (listed.run_id, listed.state, listed.clips) == ("run-1", "completed", 1)
    with pytest.raises(H3FlowError, match=r"host host-a .*unknown run id .run-1x."):
        manifest_reader(cfg)("run-1x")
