"""A real multi-host cluster: network namespaces stand for host-a, xtx and host-b.

Each namespace has its own address on a private LAN and its own OpenSSH server; this
machine is the controller, on the same LAN. Everything goes the operator's way, through
the CLI: config-adapt -> preflight -> start (over SSH into each namespace: the Prefect
server in host-a's, a worker per pool, the receiver in host-b's) -> a batch with the
reference engine -> stop. Then faults: a host cut off the LAN (preflight names it), a
sampler pool dying mid-batch (its clips go to the other pool), the only decoder gone
(the run fails clearly; ``resume`` completes it once the decoder is back).

The namespaces share this machine's filesystem (the stores, the runs folder, the h3flow
checkout and venv), as hosts with one shared NFS export would; see docs/operations.md
for what production needs. One cluster serves the tests in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import pytest
from cluster import kill_tree, wait_until, write_batch
from netns import Lab, make_lab, netns_unavailable
from remote_hosts import CPU, REFERENCE

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.pipeline.manifest import load_manifest

pytestmark = [pytest.mark.netns, pytest.mark.prefect]
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
HOSTS = ["host-a", "xtx", "host-b"]
SERVICES = ["prefect-server", "worker-h3-a", "worker-h3-xtx", "worker-h3-b", "worker-h3-control", "receiver-host-b"]


@dataclass
class MultiHost:
    lab: Lab
    root: Path
    ssh_config: Path
    config_path: Path

    @property
    def config(self) -> LocalConfig:
        return load_local_config(self.config_path)

    def h3(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The real CLI, as the operator runs it on the controller (this machine)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(H3FLOW_SSH_CONFIG=str(self.ssh_config), COLUMNS="220")
        config = [] if args[0] == "config-adapt" else ["--config", str(self.config_path)]
        return subprocess.run(
            [H3FLOW, *args, *config], capture_output=True, text=True, env=env, timeout=timeout, cwd=self.root
        )

    def preflight(self) -> tuple[int, dict[tuple[str, str], dict]]:
        done = self.h3("preflight", "--json")
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, {(c["host"], c["name"]): c for c in json.loads(done.stdout)["checks"]}

    def pid(self, service: str) -> int:
        spec_host = {
            "prefect-server": "host-a",
            "worker-h3-control": "host-a",
            "worker-h3-a": "host-a",
            "worker-h3-xtx": "xtx",
            "worker-h3-b": "host-b",
            "receiver-host-b": "host-b",
        }[service]
        path = Path(self.config.hosts[spec_host].storage.root) / "services" / f"{service}.pid"
        return int(path.read_text().split()[0])

    def journal(self, host: str) -> list[dict]:
        path = Path(self.config.hosts[host].storage.root) / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def count(self, stage: str, clip: str) -> int:
        return sum(1 for host in HOSTS for line in self.journal(host) if (line["stage"], line["clip"]) == (stage, clip))

    def submit(self, batch: Path) -> str:
        done = self.h3("run", str(batch), "--background")
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1]


def host_map(lab: Lab, root: Path) -> dict:
    """Three hosts at the namespaces' addresses; CPU "GPUs" and the reference model."""

    def host(name: str, roles: list[str], env: dict[str, str] | None = None) -> dict:
        return {
            "name": name,
            "address": lab.hosts[name].address,
            "ssh_alias": name,
            "venv": sys.prefix,
            "roles": roles,
            "gpus": [CPU.model_dump()],
            "storage": {"root": str(root / "store" / name)},
            "env": env or {},
        }

    # the dispatcher (under host-a's control worker) notices a dead pool after 12 s and
    # gives up on decoders after 10 more, instead of 20 + 60 s: the test waits less
    fast = {"H3FLOW_WORKER_STALE_S": "12", "H3FLOW_DECODER_GONE_S": "10"}
    return {
        "version": 1,
        "engine": "local",
        "topology": "1+xtx",
        "prefect": {"api_url": f"http://{lab.hosts['host-a'].address}:4200/api"},
        "model": REFERENCE.model_dump(),
        "hosts": [host("host-a", ["encode", "sample"], fast), host("xtx", ["sample"]), host("host-b", ["decode"])],
        "links": [
            {"hosts": ["host-a", "host-b"], "rtt_ms": 0.1, "gbit_s": 10},
            {"hosts": ["xtx", "host-b"], "rtt_ms": 0.1, "gbit_s": 10},
        ],
        "transfer": {
            "method": "tcp",
            "port": 9410,
            "secret": {"source": "file", "path": str(root / "secrets" / "transfer.key")},
        },
        "runs_dir": str(root / "runs"),
    }


@pytest.fixture(scope="module")
def mh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("multihost")
    lab = make_lab(HOSTS)
    try:
        ssh_config = lab.start_sshd(root / "ssh")
        (root / "host-map.json").write_text(json.dumps(host_map(lab, root), indent=2))
        cluster = MultiHost(lab, root, ssh_config, root / "local.json")
        yield cluster
    finally:
        for name in HOSTS:
            lab.mend(name)
        if (root / "local.json").exists():
            MultiHost(lab, root, root / "ssh" / "ssh_config", root / "local.json").h3("stop")
        lab.down()


def test_config_adapt_then_preflight_over_ssh_into_each_namespace(mh: MultiHost) -> None:
    done = mh.h3("config-adapt", str(mh.root / "host-map.json"), "-o", str(mh.config_path))
    assert done.returncode == 0, done.stderr
    config = mh.config
    assert [(p.name, p.host, p.role) for p in config.pools] == [
        ("a", "host-a", "sample"),
        ("xtx", "xtx", "sample"),
        ("b", "host-b", "decode"),
    ]
    assert [(r.source, r.target, r.method, r.address) for r in config.routes] == [
        ("host-a", "host-b", "tcp", mh.lab.hosts["host-b"].address),
        ("xtx", "host-b", "tcp", mh.lab.hosts["host-b"].address),
    ]
    code, checks = mh.preflight()
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    for name in HOSTS:
        address = mh.lab.hosts[name].address
        assert checks[name, "ssh"]["detail"].startswith(f"{name} → {address}:"), checks[name, "ssh"]
        assert checks[name, "gpus"]["detail"].startswith("cpu (reference model)")
        assert checks[name, "clock"]["status"] == "ok"
        assert checks[name, "prefect api"]["status"] == "skip"  # the server is one of the services start starts


def test_start_runs_each_service_in_its_hosts_namespace(mh: MultiHost) -> None:
    done = mh.h3("start", timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    for service in SERVICES:
        assert f"✓ {service}" in done.stdout, (service, done.stdout)
    where = {
        "prefect-server": "host-a",
        "worker-h3-a": "host-a",
        "worker-h3-control": "host-a",
        "worker-h3-xtx": "xtx",
        "worker-h3-b": "host-b",
        "receiver-host-b": "host-b",
    }
    for service, host in where.items():
        assert mh.lab.namespace_of(mh.pid(service)) == mh.lab.hosts[host].ns, service
    status = mh.h3("status", "--services")
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if any(f" {s} " in line for s in SERVICES)]
    assert len(rows) == len(SERVICES) and all("running" in row and "✓" in row for row in rows), status.stdout


def test_preflight_after_start_sees_workers_the_api_from_each_host_and_the_links(mh: MultiHost) -> None:
    code, checks = mh.preflight()
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    api = mh.config.prefect.api_url
    for name in HOSTS:
        assert checks[name, "prefect api"]["detail"] == f"from {name}: {api}/health → true"
    for pool, host in (("h3-a", "host-a"), ("h3-xtx", "xtx"), ("h3-b", "host-b"), ("h3-control", "host-a")):
        assert checks[host, f"worker {pool}"]["status"] == "ok" and "ONLINE" in checks[host, f"worker {pool}"]["detail"]
    for source in ("host-a", "xtx"):
        link = checks[source, "link → host-b"]
        assert link["status"] == "ok" and link["detail"].startswith("tcp: RTT ") and " MB/s " in link["detail"], link
    store = Path(mh.config.hosts["host-b"].storage.root) / "latents"
    assert not list(store.rglob("*.h3latent")), "the probe's bytes are taken out of the decoder's store again"


def test_a_batch_runs_across_the_hosts(mh: MultiHost) -> None:
    run_id = mh.submit(write_batch(mh.root / "three.json", [{"id": f"c{i}", "seed": i} for i in range(3)]))
    done = mh.h3("wait", run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = load_manifest(mh.config.runs_dir, run_id)
    assert manifest.state == "completed" and len(manifest.delivered) == 3
    assert {rec.pool for rec in manifest.clips.values()} <= {"a", "xtx"}
    for rec in manifest.clips.values():
        assert rec.stages["transfer"].host == "host-b" and rec.stages["decode"].pool == "b"
        assert Path(rec.output).parent == Path(mh.config.hosts["host-b"].storage.outputs) / run_id
        with av.open(rec.output) as video:
            assert (
                video.streams.video[0].codec_context.name == "h264"
                and video.streams.audio[0].codec_context.name == "aac"
            )


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
    assert "that the host is up" in ssh["fix"]
    assert [c["host"] for c in checks.values() if c["status"] == "fail"] == ["xtx"], "the other hosts still pass"


def test_a_sampler_pool_dying_mid_batch_is_routed_around(mh: MultiHost) -> None:
    run_id = mh.submit(write_batch(mh.root / "kill.json", [{"id": f"k{i}", "seed": 100 + i} for i in range(4)]))
    wait_until(
        lambda: any(line["pool"] == "xtx" and line["clip"].startswith("k") for line in mh.journal("xtx")),
        180,
        "pool xtx to start sampling a clip",
    )
    kill_tree(mh.pid("worker-h3-xtx"))
    done = mh.h3("wait", run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = load_manifest(mh.config.runs_dir, run_id)
    assert len(manifest.delivered) == 4
    rerouted = [rec for rec in manifest.clips.values() if rec.attempts > 1]
    assert rerouted and all(rec.pool == "a" for rec in rerouted), {
        r.clip.id: (r.pool, r.attempts) for r in manifest.clips.values()
    }
    again = mh.h3("start", timeout=300)  # idempotent: only the dead worker is started again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "worker-h3-xtx" in again.stdout and "restarted" in again.stdout
    assert "deployments" in again.stdout and again.stdout.count("already running") == len(SERVICES) - 1


def test_the_only_decoder_gone_fails_the_run_and_resume_completes_it(mh: MultiHost) -> None:
    kill_tree(mh.pid("worker-h3-b"))
    run_id = mh.submit(write_batch(mh.root / "nodecoder.json", [{"id": f"n{i}", "seed": 200 + i} for i in range(2)]))
    done = mh.h3("wait", run_id)
    assert done.returncode == 1
    assert "no decoder is alive: every decoder's worker stopped heart-beating" in done.stdout, done.stdout
    manifest = load_manifest(mh.config.runs_dir, run_id)
    assert manifest.state == "failed" and not manifest.delivered
    back = mh.h3("start", timeout=300)
    assert back.returncode == 0 and "worker-h3-b" in back.stdout and "restarted" in back.stdout, (
        back.stdout + back.stderr
    )
    resumed = mh.h3("resume", run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    manifest = load_manifest(mh.config.runs_dir, run_id)
    assert manifest.state == "completed" and len(manifest.delivered) == 2
    for clip in ("n0", "n1"):
        assert mh.count("sample", clip) == 1 and mh.count("decode", clip) == 1, clip  # sampled once, decoded once


def test_stop_ends_every_service_on_every_host(mh: MultiHost) -> None:
    pids = {service: mh.pid(service) for service in SERVICES}
    done = mh.h3("stop", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for service, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX", (
            service
        )
    for host in HOSTS:
        assert not list((Path(mh.config.hosts[host].storage.root) / "services").glob("*.pid")), host
    status = mh.h3("status", "--services")
    assert status.stdout.count("stopped") == len(SERVICES)
