"""A real multi-host cluster: namespaces stand for host-a, xtx, host-b and host-c.

Each "host" is a network namespace with its own address on a private LAN, its own
OpenSSH server and its own filesystem (tests/netns.py: a mount namespace where the lab
folder is that host's private backing folder). This machine is the controller, on the
same LAN, and sees none of the hosts' files. Everything goes the operator's way, through
the CLI: config-adapt -> preflight -> start (over SSH: PostgreSQL and the Prefect server
in host-a's namespace, basic auth on the API, a worker per pool, a receiver on each of
the two decoder hosts) -> batches -> the lab's faults -> stop:

- a sampler host (xtx) cut off the LAN mid-batch;
- a decoder host (host-b) rebooted mid-batch (its services killed, its store kept),
  then ``start`` and ``resume`` from the controller;
- the Prefect/PostgreSQL host's server and database restarted mid-batch;

each ends with every clip delivered once (or a clear failure that ``resume`` completes).

Run state needs no shared disk: ``run`` stages the batch's images into each encoder
host's input store through its agent, the dispatcher keeps the manifest on host-a, and
``wait`` / ``status`` / ``runs`` / ``resume`` on the controller reach it through Prefect
and host-a's agent; ``resume`` asks each decoder host's agent what its store holds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import httpx
import pytest
from cluster import SILENCES, kill_tree, wait_until, write_batch
from netns import Lab, make_lab, netns_unavailable
from remote_hosts import CPU, REFERENCE

from h3flow.config.models import LocalConfig, load_local_config

pytestmark = [pytest.mark.netns, pytest.mark.prefect]
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
ROOT = Path(__file__).resolve().parents[1]
HOSTS = ["host-a", "xtx", "host-b", "host-c"]
WHERE = {
    "postgres": "host-a",
    "prefect-server": "host-a",
    "worker-h3-a": "host-a",
    "worker-h3-xtx": "xtx",
    "worker-h3-b": "host-b",
    "worker-h3-c": "host-c",
    "worker-h3-control": "host-a",
    "receiver-host-b": "host-b",
    "receiver-host-c": "host-c",
}
SERVICES = list(WHERE)


@dataclass
class MultiHost:
    lab: Lab
    ssh_config: Path
    config_path: Path

    @property
    def config(self) -> LocalConfig:
        return load_local_config(self.config_path)

    def h3(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The real CLI, as the operator runs it on the controller (this machine)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        # `start` deploys the silence automations with the test clusters' windows (60 s, 100 s)
        env.update(H3FLOW_SSH_CONFIG=str(self.ssh_config), COLUMNS="220", **SILENCES)
        config = [] if args[0] == "config-adapt" else ["--config", str(self.config_path)]
        return subprocess.run(
            [H3FLOW, *args, *config], capture_output=True, text=True, env=env, timeout=timeout, cwd=self.lab.ctl
        )

    def seen_by(self, host: str, path: str | Path) -> Path:
        return self.lab.seen_by(host, path)

    def preflight(self) -> tuple[int, dict[tuple[str, str], dict]]:
        done = self.h3("preflight", "--json")
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, {(c["host"], c["name"]): c for c in json.loads(done.stdout)["checks"]}

    def pid(self, service: str) -> int:
        host = WHERE[service]
        path = self.seen_by(host, Path(self.config.hosts[host].storage.root) / "services" / f"{service}.pid")
        return int(path.read_text().split()[0])

    def journal(self, host: str) -> list[dict]:
        path = self.seen_by(host, Path(self.config.hosts[host].storage.root) / "journal.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def count(self, stage: str, clip: str) -> int:
        return sum(1 for host in HOSTS for line in self.journal(host) if (line["stage"], line["clip"]) == (stage, clip))

    def submit(self, name: str, clips: list[dict]) -> str:
        image = self.lab.ctl / "batches" / "landscape.png"  # on the controller only: `run` stages it to the encoders
        if not image.exists():
            shutil.copyfile(ROOT / "examples" / "images" / "landscape.png", image)
        batch = write_batch(self.lab.ctl / "batches" / f"{name}.json", [{"image": str(image), **c} for c in clips])
        done = self.h3("run", str(batch), "--background")
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1]

    def wait(self, run_id: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        done = self.h3("wait", run_id, "--timeout", str(timeout), timeout=timeout + 60)
        return done

    def status(self, run_id: str) -> dict:
        done = self.h3("status", run_id, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def delivered_once(self, run_id: str, clips: list[str]) -> dict:
        """Every clip delivered once: one MP4 each, on its decoder's host (not the controller),
        whose bytes hash to what the run recorded."""
        status = self.status(run_id)
        assert status["state"] == "completed", status
        config = self.config
        for clip in clips:
            rec = status["clips"][clip]
            assert rec["state"] == "delivered", (clip, rec)
            host = config.pool(rec["stages"]["decode"]["pool"]).host
            assert not Path(rec["output"]).exists(), "the controller sees no host's outputs"
            mp4 = self.seen_by(host, rec["output"])
            assert hashlib.sha256(mp4.read_bytes()).hexdigest() == rec["output_sha256"], clip
            copies = [
                p for h in ("host-b", "host-c") for p in self.seen_by(h, Path(rec["output"]).parent).glob(f"{clip}.mp4")
            ]
            assert copies == [mp4], (clip, copies)
        return status

    def log(self, service: str) -> Path:
        host = WHERE[service]
        return self.seen_by(host, Path(self.config.hosts[host].storage.root) / "services" / f"{service}.log")

    def diagnosis(self, run_id: str) -> str:
        """What a failed fault test prints: the run's status, the batch run's log and each service's last lines."""
        parts = [self.h3("status", run_id).stdout, self.h3("logs", run_id).stdout]
        for service, host in WHERE.items():
            log = self.log(service)
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else ["(no log)"]
            parts.append(f"--- {service} on {host}\n" + "\n".join(tail))
        return "\n".join(parts)

    def auth(self) -> dict[str, str]:
        credential = Path(str(self.config.prefect.auth.path)).read_text().strip()  # type: ignore[union-attr]
        return {"Authorization": "Basic " + base64.b64encode(credential.encode()).decode()}


def host_map(lab: Lab) -> dict:
    """Four hosts at the namespaces' addresses; CPU "GPUs" and the reference model; two
    decoder hosts of the Host B class; the defaults for the database (PostgreSQL) and the
    API credential (a file beside the transfer secret)."""

    def host(name: str, roles: list[str], env: dict[str, str] | None = None) -> dict:
        return {
            "name": name,
            "address": lab.hosts[name].address,
            "ssh_alias": name,
            "venv": sys.prefix,
            "roles": roles,
            "gpus": [CPU.model_dump()],
            "storage": {"root": str(lab.store_root(name))},
            "env": env or {},
        }

    return {
        "version": 1,
        "engine": "local",
        "topology": "1+xtx",
        "prefect": {"api_url": f"http://{lab.hosts['host-a'].address}:4200/api"},
        "model": REFERENCE.model_dump(),
        "hosts": [
            host("host-a", ["encode", "sample"]),
            host("xtx", ["sample"]),
            host("host-b", ["decode"]),
            host("host-c", ["decode"]),
        ],
        "links": [
            {"hosts": [s, d], "rtt_ms": 0.1, "gbit_s": 10} for s in ("host-a", "xtx") for d in ("host-b", "host-c")
        ],
        "transfer": {
            "method": "tcp",
            "port": 9410,
            "secret": {"source": "file", "path": str(lab.ctl / "secrets" / "transfer.key")},
        },
        "runs_dir": str(lab.ctl / "runs"),
    }


@pytest.fixture(scope="module")
def mh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("multihost")
    lab = make_lab(HOSTS)
    cluster = MultiHost(lab, root / "ssh" / "ssh_config", lab.ctl / "local.json")
    try:
        (lab.ctl / "batches").mkdir(parents=True, exist_ok=True)
        lab.start_sshd(root / "ssh", {})
        (lab.ctl / "host-map.json").write_text(json.dumps(host_map(lab), indent=2))
        yield cluster
    finally:
        for name in HOSTS:
            lab.mend(name)
        if cluster.config_path.exists():
            cluster.h3("stop")
        lab.down()


def test_config_adapt_then_preflight_over_ssh_into_each_namespace(mh: MultiHost) -> None:
    done = mh.h3("config-adapt", str(mh.lab.ctl / "host-map.json"), "-o", str(mh.config_path))
    assert done.returncode == 0, done.stderr
    config = mh.config
    assert [(p.name, p.host, p.role) for p in config.pools] == [
        ("a", "host-a", "sample"),
        ("xtx", "xtx", "sample"),
        ("b", "host-b", "decode"),
        ("c", "host-c", "decode"),
    ]
    assert len(config.routes) == 4 and {r.method for r in config.routes} == {"tcp"}
    database, auth = config.prefect.database, config.prefect.auth
    assert database is not None and database.kind == "postgresql" and database.password is not None
    assert database.password.path == str(mh.lab.ctl / "secrets" / "postgres.password")
    assert auth is not None and auth.path == str(mh.lab.ctl / "secrets" / "prefect-api.auth")
    code, checks = mh.preflight()
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    for name in HOSTS:
        address = mh.lab.hosts[name].address
        assert checks[name, "ssh"]["detail"].startswith(f"{name} → {address}:"), checks[name, "ssh"]
        assert checks[name, "prefect api"]["status"] == "skip"  # the server is one of the services start starts
    pg = checks["host-a", "postgresql"]
    assert pg["status"] == "ok" and "PostgreSQL" in pg["detail"] and "runs as postgres" in pg["detail"], pg
    assert not any(name == "postgresql" for host, name in checks if host != "host-a")


def test_start_runs_each_service_in_its_hosts_namespace_and_filesystem(mh: MultiHost) -> None:
    done = mh.h3("start", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for service in SERVICES:
        assert f"✓ {service}" in done.stdout, (service, done.stdout)
    for service, host in WHERE.items():
        assert mh.lab.namespace_of(mh.pid(service)) == mh.lab.hosts[host].ns, service
    status_line = Path(f"/proc/{mh.pid('postgres')}/status").read_text()
    assert int(status_line.split("Uid:")[1].split()[0]) != 0, "PostgreSQL runs as its own user, not root"
    config = mh.config
    # each host sees its own store, config copy and secrets; the controller sees no store
    assert not (mh.lab.fs / "srv").exists()
    secrets = mh.lab.ctl / "secrets"
    for host in HOSTS:
        root = Path(config.hosts[host].storage.root)
        assert mh.seen_by(host, root / "services").is_dir()
        assert not any(mh.seen_by(other, root).exists() for other in HOSTS if other != host), host
        assert mh.seen_by(host, mh.config_path).read_bytes() == mh.config_path.read_bytes()
        assert (
            mh.seen_by(host, secrets / "prefect-api.auth").read_bytes() == (secrets / "prefect-api.auth").read_bytes()
        )
        assert mh.seen_by(host, secrets / "transfer.key").is_file()
        assert mh.seen_by(host, secrets / "postgres.password").is_file() == (host == "host-a"), host
    peek = subprocess.run(
        ["ssh", "-F", str(mh.ssh_config), "host-b", "ls", str(config.hosts["host-a"].storage.root)],
        capture_output=True,
        text=True,
    )
    assert peek.returncode != 0 and "No such file" in peek.stderr, "host-b must not see host-a's store"
    status = mh.h3("status", "--services")
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if any(f" {s} " in line for s in SERVICES)]
    assert len(rows) == len(SERVICES) and all("running" in row and "✓" in row for row in rows), status.stdout


def test_the_cluster_api_refuses_clients_without_the_credential(mh: MultiHost) -> None:
    api = mh.config.prefect.api_url
    assert httpx.get(f"{api}/health", timeout=10).text == "true"  # probes stay open
    refused = httpx.post(f"{api}/flows/filter", json={}, timeout=10)
    assert refused.status_code == 401
    wrong = httpx.post(f"{api}/flows/filter", json={}, timeout=10, headers={"Authorization": "Basic aDM6d3Jvbmc="})
    assert wrong.status_code == 401
    assert httpx.post(f"{api}/flows/filter", json={}, timeout=10, headers=mh.auth()).status_code == 200
    ui = httpx.get(api.removesuffix("/api") + "/ui-settings", timeout=10).json()
    assert ui["api_url"] == api and ui["auth"] == "BASIC"
    environ = Path(f"/proc/{mh.pid('prefect-server')}/environ").read_bytes().split(b"\0")
    url = next(e for e in environ if e.startswith(b"PREFECT_API_DATABASE_CONNECTION_URL="))
    assert url.split(b"=", 1)[1].startswith(b"postgresql+asyncpg://prefect:${PREFECT_API_DATABASE_PASSWORD}@")
    worker_env = Path(f"/proc/{mh.pid('worker-h3-xtx')}/environ").read_bytes().split(b"\0")
    assert not any(e.startswith(b"PREFECT_API_DATABASE_PASSWORD=") for e in worker_env)  # only the server has it
    deployed = mh.h3("deploy")  # the CLI on the controller sends the credential (start, preflight, run… too)
    assert deployed.returncode == 0 and "deployment batch/run" in deployed.stdout, deployed.stdout + deployed.stderr


def test_services_listen_only_on_the_cluster_addresses(mh: MultiHost) -> None:
    for host, ports in (("host-a", (4200, 5432)), ("host-b", (9410,)), ("host-c", (9410,))):
        ns, address = mh.lab.hosts[host].ns, mh.lab.hosts[host].address
        listening = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-ltnH"], capture_output=True, text=True, check=True
        ).stdout.split()
        for port in ports:
            assert f"{address}:{port}" in listening, (host, port, listening)
            assert not {f"0.0.0.0:{port}", f"*:{port}", f"[::]:{port}"} & set(listening), (host, port)


def _postgres_tables(mh: MultiHost, table: str) -> int:
    """Rows in one of Prefect's tables, asked of PostgreSQL itself (with the password from the secrets)."""
    import asyncio

    import asyncpg

    db = mh.config.prefect.database
    assert db is not None and db.password is not None

    async def rows() -> int:
        conn = await asyncpg.connect(
            host=mh.lab.hosts["host-a"].address,
            port=db.port,
            user=db.user,
            database=db.name,
            password=Path(str(db.password.path)).read_text().strip(),
            timeout=10,
        )
        try:
            return int(await conn.fetchval(f"select count(*) from {table}"))
        finally:
            await conn.close()

    return asyncio.run(rows())


def test_preflight_after_start_sees_postgres_the_api_with_its_credential_workers_and_links(mh: MultiHost) -> None:
    code, checks = mh.preflight()
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    api = mh.config.prefect.api_url
    for name in HOSTS:
        assert checks[name, "prefect api"]["detail"] == (
            f"from {name}: {api}/health → true; the credential is accepted"
        ), checks[name, "prefect api"]
    assert "accepts connections on" in checks["host-a", "postgresql"]["detail"]
    for pool, host in (("h3-a", "host-a"), ("h3-xtx", "xtx"), ("h3-b", "host-b"), ("h3-c", "host-c")):
        assert checks[host, f"worker {pool}"]["status"] == "ok" and "ONLINE" in checks[host, f"worker {pool}"]["detail"]
    for source in ("host-a", "xtx"):
        for target in ("host-b", "host-c"):
            link = checks[source, f"link → {target}"]
            assert link["status"] == "ok" and link["detail"].startswith("tcp: RTT "), link


def test_a_batch_runs_across_the_hosts_and_both_decoders(mh: MultiHost) -> None:
    clips = [f"c{i}" for i in range(4)]
    run_id = mh.submit("four", [{"id": c, "seed": i} for i, c in enumerate(clips)])
    done = mh.wait(run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    status = mh.delivered_once(run_id, clips)
    assert {rec["pool"] for rec in status["clips"].values()} <= {"a", "xtx"}
    assert {rec["stages"]["decode"]["pool"] for rec in status["clips"].values()} == {"b", "c"}, "both decoders"
    for rec in status["clips"].values():
        host = mh.config.pool(rec["stages"]["decode"]["pool"]).host
        with av.open(str(mh.seen_by(host, rec["output"]))) as video:
            assert video.streams.video[0].codec_context.name == "h264"
    assert _postgres_tables(mh, "flow_run") >= 1 + 2 * len(clips)  # Prefect's state lives in PostgreSQL


def test_a_host_cut_off_the_lan_is_named_by_preflight(mh: MultiHost) -> None:
    mh.lab.cut("xtx")
    try:
        code, checks = mh.preflight()
    finally:
        mh.lab.mend("xtx")
    assert code == 1
    ssh = checks["xtx", "ssh"]
    address = mh.lab.hosts["xtx"].address
    assert ssh["status"] == "fail" and ssh["detail"].startswith(f"cannot reach host xtx (ssh xtx) at {address}:"), ssh
    assert [c["host"] for c in checks.values() if c["status"] == "fail"] == ["xtx"], "the other hosts still pass"


def _finish(mh: MultiHost, run_id: str, done: subprocess.CompletedProcess[str]) -> None:
    """A run a fault ended: done, or failed clearly — then ``start`` and ``resume`` complete it."""
    if done.returncode == 0:
        return
    assert "Traceback" not in done.stdout + done.stderr and "✗ run" in done.stdout, (
        done.stdout + done.stderr + mh.diagnosis(run_id)
    )
    again = mh.h3("start", timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = mh.h3("resume", run_id, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr


@pytest.mark.timeout(1800)
def test_a_sampler_host_cut_off_mid_batch(mh: MultiHost) -> None:
    clips = [f"x{i}" for i in range(3)]
    run_id = mh.submit("cut", [{"id": c, "seed": 100 + i} for i, c in enumerate(clips)])
    try:
        wait_until(
            lambda: any(line["clip"] in clips for line in mh.journal("xtx")),
            300,
            "xtx to start on a clip",
            every=0.5,
        )
        mh.lab.cut("xtx")
        done = mh.wait(run_id)
    finally:
        mh.lab.mend("xtx")
    _finish(mh, run_id, done)
    status = mh.delivered_once(run_id, clips)
    assert any(rec["pool"] == "a" for rec in status["clips"].values())
    for clip in clips:
        assert mh.count("decode", clip) == 1, clip  # decoded once, wherever it was sampled


@pytest.mark.timeout(1800)
def test_the_decoder_host_rebooted_mid_batch_then_resume_from_the_controller(mh: MultiHost) -> None:
    clips = [f"r{i}" for i in range(3)]
    run_id = mh.submit("reboot", [{"id": c, "seed": 200 + i} for i, c in enumerate(clips)])
    wait_until(
        lambda: any(line["clip"] in clips for line in mh.journal("host-b")),
        300,
        "host-b to work on a clip",
        every=0.5,
    )
    for service in ("worker-h3-b", "receiver-host-b"):  # a reboot: every process gone, the disk kept
        kill_tree(mh.pid(service))
    back = mh.h3("start", timeout=600)  # the host is up again: the operator starts its services
    assert back.returncode == 0 and back.stdout.count("restarted") == 2, back.stdout + back.stderr
    assert "worker-h3-b" in back.stdout and "receiver-host-b" in back.stdout
    # the killed decode's run falls silent (Prefect marks it Crashed, the dispatcher sends it again) and
    # its GPU slot's lease expires; its cache lock died with its process (flock): nothing waits for good
    done = mh.wait(run_id)
    if done.returncode != 0:
        assert "Traceback" not in done.stdout + done.stderr and "✗ run" in done.stdout, (
            done.stdout + done.stderr + mh.diagnosis(run_id)
        )
        resumed = mh.h3("resume", run_id, timeout=900)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    mh.delivered_once(run_id, clips)


@pytest.mark.timeout(1800)
def test_the_api_hosts_server_and_database_restarted_mid_batch(mh: MultiHost) -> None:
    clips = [f"p{i}" for i in range(3)]
    run_id = mh.submit("restart", [{"id": c, "seed": 300 + i} for i, c in enumerate(clips)])
    wait_until(
        lambda: any(line["clip"] in clips for host in HOSTS for line in mh.journal(host)),
        300,
        "a clip to start",
        every=0.5,
    )
    for service in ("prefect-server", "postgres"):
        kill_tree(mh.pid(service))
    back = mh.h3("start", timeout=600)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "postgres" in back.stdout and "prefect-server" in back.stdout and back.stdout.count("restarted") == 2
    assert "GPU slots not settled" not in mh.log("prefect-server").read_text()  # settled on PostgreSQL
    done = mh.wait(run_id)
    _finish(mh, run_id, done)
    mh.delivered_once(run_id, clips)


def test_stop_ends_every_service_on_every_host(mh: MultiHost) -> None:
    pids = {service: mh.pid(service) for service in SERVICES}
    done = mh.h3("stop", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for service, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX", (
            service
        )
    for host in HOSTS:
        assert not list(mh.seen_by(host, Path(mh.config.hosts[host].storage.root) / "services").glob("*.pid")), host
    status = mh.h3("status", "--services")
    assert status.stdout.count("stopped") == len(SERVICES)
