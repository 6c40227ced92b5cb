"""The fault matrix on a real embedded cluster: kill each process mid-run, damage files, fill the disk.

Every case ends with every clip delivered — bytes matching the SHA-256 its manifest
records and frames that decode — or with a clear failure that a later ``resume``
completes; no stage runs again beyond the one the fault hit (counted from the engines'
journal); and nothing hangs (each command has a bound). docs/operations.md has the
same matrix as a table. Real server, workers, runners, receiver; the reference model
stands in for H3's weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import pytest
from cluster import Cluster, descendants, kill_tree, make_cluster, wait_until, write_batch

from h3flow.core.files import file_intact
from h3flow.pipeline.manifest import Manifest, load_manifest

pytestmark = [pytest.mark.prefect, pytest.mark.faults]
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
BOUND_S = 420  # no case may take longer than this (a hang fails, it does not block CI)
SLOW = {"spec": "sd", "seconds": 2, "steps": 24}  # a few seconds a sample: long enough to be caught mid-stage


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = make_cluster(tmp_path_factory.mktemp("faults"))
    c.start()
    yield c
    c.stop()


def h3(cluster: Cluster, *args: str, timeout: float = BOUND_S) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cluster.env(), "COLUMNS": "200"}
    return subprocess.run(
        [H3FLOW, *args, "--config", str(cluster.config_path)], capture_output=True, text=True, env=env, timeout=timeout
    )


def submit(cluster: Cluster, batch: Path) -> str:
    res = h3(cluster, "run", str(batch), "--background")
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


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


def started(cluster: Cluster, host: str, stage: str, clips: set[str]) -> str | None:
    """The first of ``clips`` whose ``stage`` has begun on ``host`` (the journal is written as it starts)."""
    return next(
        (line["clip"] for line in cluster.journal(host) if line["stage"] == stage and line["clip"] in clips), None
    )


def runner_process(cluster: Cluster, work_pool: str) -> int | None:
    """The flow-run process its worker started: the pool runner, which runs the clips in-process."""
    for pid in descendants(cluster.pidfile_pid(work_pool)):
        try:
            if b"prefect" in Path(f"/proc/{pid}/cmdline").read_bytes() and pid != cluster.pidfile_pid(work_pool):
                return pid
        except OSError:
            continue
    return None


def counts(cluster: Cluster, stage: str, clips: list[str]) -> dict[str, int]:
    return {clip: cluster.invocations(stage, clip) for clip in clips}


def resume_until_taken_over(cluster: Cluster, run_id: str) -> subprocess.CompletedProcess[str]:
    """``resume`` refuses while the old dispatcher heart-beats; it takes over once it is confirmed dead."""
    tries: list[subprocess.CompletedProcess[str]] = []

    def taken_over() -> bool:
        tries.append(h3(cluster, "resume", run_id))
        return "still running" not in tries[-1].stderr

    wait_until(taken_over, 120, "resume to take over", every=1)
    return tries[-1]


# --------------------------------------------------------------------------- killed processes
def test_kill_9_of_the_sampler_runner_mid_sample(cluster: Cluster, tmp_path: Path) -> None:
    """The OOM-killer case: the runner dies holding the stage's cache lock; the run completes without a hand."""
    ids = [f"ks{i}" for i in range(4)]
    run_id = submit(
        cluster, write_batch(tmp_path / "ks.json", [{"id": c, "seed": 10 + i, **SLOW} for i, c in enumerate(ids)])
    )
    wait_until(lambda: started(cluster, "host-a", "sample", set(ids)), 180, "a sample to start")
    victim = runner_process(cluster, "h3-a0") or runner_process(cluster, "h3-a1")
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0 and time.monotonic() - t0 < BOUND_S, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 4)
    sampled = counts(cluster, "sample", ids)
    assert sum(sampled.values()) <= len(ids) + 2 and all(n >= 1 for n in sampled.values()), sampled
    assert all(n == 1 for n in counts(cluster, "decode", ids).values())


def test_kill_9_of_the_decoder_runner_mid_decode(cluster: Cluster, tmp_path: Path) -> None:
    ids = [f"kd{i}" for i in range(3)]
    run_id = submit(
        cluster, write_batch(tmp_path / "kd.json", [{"id": c, "seed": 20 + i, **SLOW} for i, c in enumerate(ids)])
    )
    wait_until(lambda: started(cluster, "host-b", "decode", set(ids)), 240, "a decode to start")
    victim = runner_process(cluster, "h3-b")
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 3)
    assert all(n == 1 for n in counts(cluster, "sample", ids).values()), "sampling is never redone for a decode fault"
    assert sum(counts(cluster, "decode", ids).values()) <= len(ids) + 1


def test_kill_9_of_the_receiver_then_it_comes_back(cluster: Cluster, tmp_path: Path) -> None:
    """Transfers fail while the receiver is down; the task retries them once it is back (no resume needed)."""
    ids = ["kr0", "kr1"]
    os.kill(cluster.pidfile_pid("receiver"), signal.SIGKILL)
    run_id = submit(cluster, write_batch(tmp_path / "kr.json", [{"id": c, "seed": 30 + i} for i, c in enumerate(ids)]))
    wait_until(lambda: started(cluster, "host-a", "transfer", set(ids)), 180, "a transfer to try the dead receiver")
    cluster.start()  # the receiver is back within the task's back-off (1 s, 3 s, 9 s)
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 2)
    assert all(n == 1 for n in counts(cluster, "sample", ids).values())


def test_kill_9_of_the_prefect_server_mid_run_then_resume(cluster: Cluster, tmp_path: Path) -> None:
    ids = [f"kp{i}" for i in range(4)]
    run_id = submit(
        cluster, write_batch(tmp_path / "kp.json", [{"id": c, "seed": 40 + i, **SLOW} for i, c in enumerate(ids)])
    )
    wait_until(lambda: started(cluster, "host-a", "sample", set(ids)), 180, "sampling to start")
    kill_tree(cluster.pidfile_pid("prefect-server"))
    cluster.start()  # the outage lasts until the restarted server answers
    res = resume_until_taken_over(cluster, run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_delivered(cluster, run_id, 4)
    assert all(n <= 2 for n in counts(cluster, "sample", ids).values())


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
        180,
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
