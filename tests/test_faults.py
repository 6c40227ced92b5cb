"""The fault matrix on a real embedded cluster: kill each process mid-run, damage files, fill the disk.

Every case ends with every clip delivered — bytes matching the SHA-256 its manifest
records and frames that decode — or with a clear failure that a later ``resume``
completes; no stage runs again beyond the one the fault hit (counted from the engines'
journal); and nothing hangs (each command has a bound). docs/operations.md has the
same matrix as a table. Real server, h3flow workers, receiver; the reference model
stands in for H3's weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import av
import httpx
import pytest
from cluster import DISPATCHER_SILENCE_S, SLOW, Cluster, kill_tree, make_cluster, wait_until, write_batch

from h3flow.core.contracts import gpu_limit
from h3flow.core.files import file_intact
from h3flow.pipeline.manifest import Manifest, load_manifest
from h3flow.pipeline.prefect_api import RunFlowRun

pytestmark = [pytest.mark.prefect, pytest.mark.faults]
BOUND_S = 420  # no case may take longer than this (a hang fails, it does not block CI)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = make_cluster(tmp_path_factory.mktemp("faults"))
    c.start()
    yield c
    c.stop()


def h3(cluster: Cluster, *args: str, timeout: float = BOUND_S) -> subprocess.CompletedProcess[str]:
    """The CLI against the module's cluster. A command past its bound is a hang: it fails this case with
    the cluster's diagnosis, and the cluster is rebuilt so the cases after it do not queue behind it."""
    try:
        return cluster.h3(*args, timeout=timeout)
    except subprocess.TimeoutExpired:
        why = f"h3flow {' '.join(args)} hung past {timeout:g} s\n" + cluster.diagnosis(
            args[1] if len(args) > 1 else "", lines=60
        )
        cluster.rebuild()
        raise AssertionError(why) from None


def submit(cluster: Cluster, batch: Path) -> str:
    return cluster.submit(batch)


def manifest(cluster: Cluster, run_id: str) -> Manifest:
    return load_manifest(cluster.config.runs_dir, run_id)


def assert_delivered(cluster: Cluster, run_id: str, clips: int) -> Manifest:
    """Every clip delivered, each MP4 is what the manifest says and decodes."""
    m = manifest(cluster, run_id)
    assert m.state == "completed" and len(m.delivered) == clips, [
        (c.clip.id, c.state, c.error) for c in m.clips.values()
    ]
    for rec in m.clips.values():
        assert rec.output and file_intact(rec.output, rec.output_sha256), rec.clip.id
        with av.open(rec.output) as container:
            assert sum(1 for _ in container.decode(video=0)) == rec.clip.frames
    return m


def started(cluster: Cluster, host: str, stage: str, clips: set[str]) -> dict | None:
    """The journal line of the first of ``clips`` whose ``stage`` has begun on ``host`` (written as it starts)."""
    return next((line for line in cluster.journal(host) if line["stage"] == stage and line["clip"] in clips), None)


def wait_for_stage(cluster: Cluster, host: str, stage: str, clips: set[str]) -> dict:
    wait_until(lambda: started(cluster, host, stage, clips), 240, f"a {stage} of {sorted(clips)} to start on {host}")
    line = started(cluster, host, stage, clips)
    assert line is not None
    return line


def counts(cluster: Cluster, stage: str, clips: list[str]) -> dict[str, int]:
    return {clip: cluster.invocations(stage, clip) for clip in clips}


def flow_runs(cluster: Cluster, run_id: str) -> list[RunFlowRun]:
    """The run's flow runs in Prefect: its batch (dispatcher) runs, then its clips' runs."""
    from h3flow.pipeline.prefect_api import run_flow_runs

    return run_flow_runs(cluster.config, run_id, manifest(cluster, run_id).flow_run_ids)


def one_completed_run_per_clip(cluster: Cluster, run_id: str, clips: list[str]) -> None:
    """Whatever happened, each clip has exactly one completed sample run and one completed decode run."""
    runs = flow_runs(cluster, run_id)
    for clip in clips:
        for stage in ("sample", "decode"):
            done = [r for r in runs if r.clip == clip and r.stage == stage and r.state == "COMPLETED"]
            assert len(done) == 1, (clip, stage, [(r.name, r.state) for r in runs if r.clip == clip])


# --------------------------------------------------------------------------- killed processes
def test_kill_9_of_a_sampler_worker_mid_sample(cluster: Cluster, tmp_path: Path) -> None:
    """The OOM-killer case: a pool's worker (the process its clips run in) dies mid-sample, holding the
    stage's cache lock and its GPU slot; the run completes on the other pool without a hand."""
    ids = [f"ks{i}" for i in range(4)]
    run_id = submit(
        cluster, write_batch(tmp_path / "ks.json", [{"id": c, "seed": 10 + i, **SLOW} for i, c in enumerate(ids)])
    )
    busy = wait_for_stage(cluster, "host-a", "sample", set(ids))
    os.kill(cluster.pidfile_pid(f"h3-{busy['pool']}"), signal.SIGKILL)
    t0 = time.monotonic()
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0 and time.monotonic() - t0 < BOUND_S, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 4)
    sampled = counts(cluster, "sample", ids)
    assert sum(sampled.values()) <= len(ids) + 2 and all(n >= 1 for n in sampled.values()), sampled
    assert all(n == 1 for n in counts(cluster, "decode", ids).values())
    one_completed_run_per_clip(cluster, run_id, ids)
    cluster.start()  # the next cases want both sampler pools


def test_kill_9_of_the_decoder_worker_mid_decode_then_it_comes_back(cluster: Cluster, tmp_path: Path) -> None:
    """The only decoder's worker dies mid-decode and is started again (as a supervisor would): the
    silent decode is marked Crashed by Prefect and decoded again once its GPU slot's lease expires."""
    ids = [f"kd{i}" for i in range(3)]
    run_id = submit(
        cluster, write_batch(tmp_path / "kd.json", [{"id": c, "seed": 20 + i, **SLOW} for i, c in enumerate(ids)])
    )
    wait_for_stage(cluster, "host-b", "decode", set(ids))
    os.kill(cluster.pidfile_pid("h3-b"), signal.SIGKILL)
    cluster.start()
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 3)
    assert all(n == 1 for n in counts(cluster, "sample", ids).values()), "sampling is never redone for a decode fault"
    assert sum(counts(cluster, "decode", ids).values()) <= len(ids) + 1
    one_completed_run_per_clip(cluster, run_id, ids)


def test_kill_9_of_the_receiver_then_it_comes_back(cluster: Cluster, tmp_path: Path) -> None:
    """Transfers fail while the receiver is down; the task retries them once it is back (no resume needed)."""
    ids = ["kr0", "kr1"]
    os.kill(cluster.pidfile_pid("receiver"), signal.SIGKILL)
    run_id = submit(cluster, write_batch(tmp_path / "kr.json", [{"id": c, "seed": 30 + i} for i, c in enumerate(ids)]))
    wait_for_stage(cluster, "host-a", "transfer", set(ids))
    cluster.start()  # the receiver is back within the task's back-off (1 s, 3 s, 9 s)
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 2)
    assert all(n == 1 for n in counts(cluster, "sample", ids).values())


def test_the_prefect_server_killed_restarted_40_s_later_and_resume_3_s_after(cluster: Cluster, tmp_path: Path) -> None:
    """The docs' advice after a long outage, as an operator follows it: the dispatcher waits the
    outage out; ``resume`` right after the restart either finds it alive (refused) or takes over a
    dispatcher Prefect has marked Crashed — never two dispatchers on one run."""
    ids = [f"kp{i}" for i in range(4)]
    run_id = submit(
        cluster, write_batch(tmp_path / "kp.json", [{"id": c, "seed": 40 + i, **SLOW} for i, c in enumerate(ids)])
    )
    wait_for_stage(cluster, "host-a", "sample", set(ids))
    kill_tree(cluster.pidfile_pid("prefect-server"))
    time.sleep(40)  # the outage's length is the case, not a wait for something to happen
    cluster.start()
    time.sleep(3)
    res = h3(cluster, "resume", run_id)
    assert res.returncode == 0 or (res.returncode == 2 and "still running" in res.stderr), res.stdout + res.stderr
    done = h3(cluster, "wait", run_id)
    assert done.returncode == 0, done.stdout + done.stderr + cluster.diagnosis(run_id)
    assert_delivered(cluster, run_id, 4)
    assert all(n <= 2 for n in counts(cluster, "sample", ids).values())
    one_dispatcher_at_a_time(cluster, run_id)


def test_a_gpu_slot_no_lease_holds_is_freed_when_the_server_restarts_and_a_held_one_stays(cluster: Cluster) -> None:
    """A server killed between committing a GPU slot and writing its lease leaves the slot taken with no
    lease to expire (made here with Prefect's lease-less increment): before, every later clip of that
    pool waited for it for good. ``start`` brings the server back with the slot free; a slot a live
    lease holds stays taken until its holder gives it back."""
    api = cluster.config.prefect.api_url.rstrip("/") + "/v2/concurrency_limits"
    leaked, held = (gpu_limit(pool.name) for pool in cluster.config.pools[:2])
    client = httpx.Client(timeout=30, headers={"Connection": "close"})  # no kept-alive socket to the killed server
    client.post(f"{api}/increment", json={"names": [leaked], "slots": 1, "mode": "concurrency"}).raise_for_status()
    lease = client.post(f"{api}/increment-with-lease", json={"names": [held], "slots": 1, "lease_duration": 300})
    lease_id = lease.raise_for_status().json()["lease_id"]
    try:
        assert [client.get(f"{api}/{name}").json()["active_slots"] for name in (leaked, held)] == [1, 1]
        kill_tree(cluster.pidfile_pid("prefect-server"))
        wait_until(lambda: refused(api), 30, "the killed server's port to close")
        cluster.start()
        assert [client.get(f"{api}/{name}").json()["active_slots"] for name in (leaked, held)] == [0, 1]
        log = Path(cluster.config.work_dir or "") / "services" / "prefect-server.log"
        assert f"{leaked}: 1 slot(s) taken, 0 held by leases: set to 0" in log.read_text()
    finally:
        client.post(f"{api}/decrement-with-lease", json={"lease_id": lease_id})
    assert client.get(f"{api}/{held}").json()["active_slots"] == 0


def refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=5)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        pass
    return False


def one_dispatcher_at_a_time(cluster: Cluster, run_id: str) -> None:
    """The run's dispatchers (batch flow runs) never overlapped: each began after the one before ended."""
    runs = [r for r in flow_runs(cluster, run_id) if r.clip is None]
    assert runs and runs[-1].state == "COMPLETED", runs
    assert all(r.state in ("CRASHED", "COMPLETED") for r in runs), runs
    lines = dispatcher_lines(cluster, run_id)
    assert len([line for line in lines if "run " + run_id + " completed" in line]) == 1, lines


def dispatcher_lines(cluster: Cluster, run_id: str) -> list[str]:
    log = Path(cluster.config.work_dir or "") / "services" / "worker-h3-control.log"
    return [line for line in log.read_text().splitlines() if run_id in line]


@pytest.mark.parametrize("stall_s", [33, DISPATCHER_SILENCE_S + 20], ids=["shorter-than-the-silence", "longer"])
def test_a_stalled_dispatcher_resume_and_the_stall_ending_leave_one_dispatcher(
    cluster: Cluster, tmp_path: Path, stall_s: float
) -> None:
    """The dispatcher's process frozen (SIGSTOP), ``resume``, then thawed (SIGCONT). A stall shorter
    than the silence window: resume is refused and the same dispatcher finishes. A longer one: Prefect
    marks it Crashed, resume takes over, and the thawed dispatcher stops at once without touching the
    run (before: both ran on for minutes, restarting runners and rewriting the manifest)."""
    ids = [f"st{int(stall_s)}-{i}" for i in range(4)]
    run_id = submit(
        cluster,
        write_batch(
            tmp_path / "st.json", [{"id": c, "seed": 9000 + 10 * int(stall_s) + i, **SLOW} for i, c in enumerate(ids)]
        ),
    )
    wait_for_stage(cluster, "host-a", "sample", set(ids))
    control = cluster.pidfile_pid("h3-control")
    os.kill(control, signal.SIGSTOP)
    try:
        time.sleep(stall_s)  # the stall's length is the case
        res = h3(cluster, "resume", run_id, "--background")  # the new dispatcher runs once the process thaws
    finally:
        os.kill(control, signal.SIGCONT)
    if stall_s < DISPATCHER_SILENCE_S:
        assert res.returncode == 2 and "still running" in res.stderr, res.stdout + res.stderr
    else:
        assert res.returncode == 0, res.stdout + res.stderr
    done = h3(cluster, "wait", run_id)
    assert done.returncode == 0, done.stdout + done.stderr + cluster.diagnosis(run_id)
    assert_delivered(cluster, run_id, 4)
    if stall_s < DISPATCHER_SILENCE_S:
        one_completed_run_per_clip(cluster, run_id, ids)
    else:  # the crashed dispatcher's children ran on; the new one's samples of unverified clips were cache hits
        assert all(n == 1 for n in counts(cluster, "sample", ids).values()), counts(cluster, "sample", ids)
        decodes = [r for r in flow_runs(cluster, run_id) if r.stage == "decode" and r.state == "COMPLETED"]
        assert sorted(r.clip for r in decodes) == sorted(ids), (
            "each clip decoded once, by the dispatcher that took over"
        )
    one_dispatcher_at_a_time(cluster, run_id)
    batch_runs = [r for r in flow_runs(cluster, run_id) if r.clip is None]
    assert len(batch_runs) == (1 if stall_s < DISPATCHER_SILENCE_S else 2), batch_runs
    if stall_s >= DISPATCHER_SILENCE_S:
        assert any("this dispatcher stops" in line for line in dispatcher_lines(cluster, run_id))
    samples = [r for r in flow_runs(cluster, run_id) if r.stage == "sample"]
    assert len(samples) <= 2 * len(ids), [(r.name, r.state) for r in samples]


# --------------------------------------------------------------------------- damaged files
def test_a_damaged_delivered_mp4_is_made_again_from_the_verified_cache(cluster: Cluster, tmp_path: Path) -> None:
    first = submit(cluster, write_batch(tmp_path / "dm.json", [{"id": "dm0", "seed": 50}, {"id": "dm1", "seed": 51}]))
    assert h3(cluster, "wait", first).returncode == 0
    twin = submit(cluster, write_batch(tmp_path / "dm-twin.json", [{"id": "dm0", "seed": 50}]))
    assert h3(cluster, "wait", twin).returncode == 0
    rec = manifest(cluster, first).clips["dm0"]
    output = Path(rec.output or "")
    data = bytearray(output.read_bytes())
    data[len(data) // 2] ^= 0xFF
    output.write_bytes(bytes(data))  # bit rot (or an edit) in the user's copy
    twin_output = Path(manifest(cluster, twin).clips["dm0"].output or "")
    assert file_intact(twin_output, rec.output_sha256), "each run's output is a file of its own"
    decodes = counts(cluster, "decode", ["dm0"])
    res = h3(cluster, "resume", first)
    assert res.returncode == 0 and "moved to" in res.stdout, res.stdout + res.stderr
    assert_delivered(cluster, first, 2)
    assert list(output.parent.glob("dm0.mp4.damaged-*")), "the damaged file is kept aside, not deleted"
    assert counts(cluster, "decode", ["dm0"]) == decodes, "made again from the verified cache copy"


def test_a_latent_damaged_at_rest_on_the_decoder_is_quarantined_by_resume(cluster: Cluster, tmp_path: Path) -> None:
    run_id = submit(cluster, write_batch(tmp_path / "dl.json", [{"id": "dl0", "seed": 60}]))
    assert h3(cluster, "wait", run_id).returncode == 0
    rec = manifest(cluster, run_id).clips["dl0"]
    Path(rec.output or "").unlink()  # the delivery is gone, and its latent is damaged on the decoder
    latent = next(Path(cluster.config.hosts["host-b"].storage.latents).rglob(f"{rec.latent_sha256}.h3latent"))
    with open(latent, "r+b") as handle:
        handle.truncate(latent.stat().st_size // 2)
    res = h3(cluster, "resume", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 1)
    assert list((Path(cluster.config.hosts["host-b"].storage.root) / "latents-damaged").glob(f"{rec.latent_sha256}*"))
    assert cluster.invocations("transfer", "dl0") == 2 and cluster.invocations("sample", "dl0") == 1


def test_resume_while_the_run_is_going_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    run_id = submit(cluster, write_batch(tmp_path / "rr.json", [{"id": "rr0", "seed": 70, **SLOW}]))
    wait_until(
        lambda: started(cluster, "host-a", "encode", {"rr0"}) or started(cluster, "host-a", "sample", {"rr0"}),
        240,
        "the run to start",
    )
    res = h3(cluster, "resume", run_id)
    assert res.returncode == 2 and "still running" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr
    assert h3(cluster, "wait", run_id).returncode == 0
    assert_delivered(cluster, run_id, 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs for the full disk needs root")
def test_a_full_disk_fails_clearly_at_once_and_resume_completes(cluster: Cluster, tmp_path: Path) -> None:
    outputs = Path(cluster.config.hosts["host-b"].storage.outputs)
    outputs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(outputs)], check=True)
    try:
        filler = outputs / "filler"
        with open(filler, "wb") as handle:  # leave a few KiB: far less than an MP4
            handle.write(b"\0" * (256 * 1024 - 8 * 1024))
        run_id = submit(cluster, write_batch(tmp_path / "fd.json", [{"id": "fd0", "seed": 80}]))
        res = h3(cluster, "wait", run_id)
        assert res.returncode == 1, res.stdout + res.stderr
        rec = manifest(cluster, run_id).clips["fd0"]
        assert rec.state == "failed" and rec.failure is not None and rec.failure.value == "resource", rec.error
        assert cluster.invocations("decode", "fd0") == 1, "a full disk is not retried"
        assert not list(outputs.rglob("fd0.mp4")), "no partial MP4"
        filler.unlink()
        res = h3(cluster, "resume", run_id)
        assert res.returncode == 0, res.stdout + res.stderr
        assert_delivered(cluster, run_id, 1)
    finally:
        subprocess.run(["umount", "-l", str(outputs)], check=False)
