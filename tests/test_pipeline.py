"""The Prefect pipeline end to end on a real local cluster (server, workers, receiver).

Real everything except the model: the reference engine stands in for H3 (no weights,
no GPU here). Tests share one cluster per module and run in order; each run has its
own run id, and the journal of engine invocations counts what was really executed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import av
import pytest
from cluster import DISPATCHER_SILENCE_S, Cluster, kill_tree, make_cluster, wait_until, write_batch

from h3flow.core.files import file_intact
from h3flow.core.paths import SOURCE_DIR
from h3flow.pipeline.manifest import load_manifest

pytestmark = pytest.mark.prefect
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = make_cluster(tmp_path_factory.mktemp("pipeline"))
    c.start()
    yield c
    c.stop()


def h3(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cluster.env(), "COLUMNS": "200"}
    return subprocess.run(
        [H3FLOW, *args, "--config", str(cluster.config_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def submit(cluster: Cluster, batch: Path) -> str:
    res = h3(cluster, "run", str(batch), "--background")
    assert res.returncode == 0, res.stderr + res.stdout
    return res.stdout.strip().splitlines()[-1]


def check_mp4(path: str, seconds: float) -> None:
    with av.open(path) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0]
        assert video.codec_context.name == "h264" and audio.codec_context.name == "aac"
        assert audio.rate == 48000
        assert abs(float(container.duration / 1e6) - seconds) < 0.3


def test_a_batch_runs_end_to_end_through_real_workers(cluster: Cluster, tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "three.json", [{"id": f"c{i}", "seed": i} for i in range(3)])
    run_id = submit(cluster, batch)
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    assert manifest.state == "completed" and len(manifest.delivered) == 3
    assert {rec.pool for rec in manifest.clips.values()} <= {"a0", "a1"}
    for rec in manifest.clips.values():
        assert Path(rec.output).name == f"{rec.clip.id}.mp4"
        check_mp4(rec.output, rec.clip.frames / 24)
        assert set(rec.stages) == {"encode", "offload", "sample", "transfer", "decode"}
    # one prompt + image for all three: encoded once (the other two hit the cache, even
    # when two pools reach the same key at once), sampled and decoded per seed
    assert (cluster.invocations("encode"), cluster.invocations("sample"), cluster.invocations("decode")) == (1, 3, 3)
    status = h3(cluster, "status", run_id, "--json")
    assert json.loads(status.stdout)["delivered"] == 3


def test_the_same_batch_again_is_served_from_the_cache(cluster: Cluster, tmp_path: Path) -> None:
    before = {s: cluster.invocations(s) for s in ("encode", "sample", "decode")}
    batch = write_batch(tmp_path / "again.json", [{"id": f"c{i}", "seed": i} for i in range(3)])
    run_id = submit(cluster, batch)
    assert h3(cluster, "wait", run_id).returncode == 0
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    assert all(rec.stages["sample"].cached and rec.stages["decode"].cached for rec in manifest.clips.values())
    assert {s: cluster.invocations(s) for s in before} == before


def test_a_sampler_killed_mid_sample_still_delivers_every_clip(cluster: Cluster, tmp_path: Path) -> None:
    """Pool a0's worker dies mid-sample: Prefect reports the pool not ready, so what a0 had not
    started goes to a1 at once; the clip it was sampling stops beating and Prefect's silence
    automation marks it Crashed; the dispatcher sends that one again too."""
    ids = [f"k{i}" for i in range(4)]
    slow = {"spec": "sd", "seconds": 2, "steps": 24}  # seconds a sample: long enough to be caught mid-stage
    run_id = submit(
        cluster, write_batch(tmp_path / "kill.json", [{"id": c, "seed": 100 + i, **slow} for i, c in enumerate(ids)])
    )
    on_a0: list[str] = []

    def a0_sampling() -> bool:
        on_a0[:] = [
            line["clip"]
            for line in cluster.journal("host-a")
            if line["pool"] == "a0" and line["clip"] in ids and line["stage"] == "sample"
        ]
        return bool(on_a0)

    wait_until(a0_sampling, 180, "pool a0 to start sampling a clip of this batch")
    kill_tree(cluster.pidfile_pid("h3-a0"))
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    assert len(manifest.delivered) == 4
    victim = manifest.clips[on_a0[0]]
    assert victim.attempts == 2 and victim.pool == "a1", "the clip a0 was sampling was sent again, to a1"
    from h3flow.pipeline.prefect_api import prefect_api, run_flow_runs

    with prefect_api(cluster.config):
        runs = [
            r
            for r in run_flow_runs(cluster.config, run_id, manifest.flow_run_ids)
            if r.clip == victim.clip.id and r.stage == "sample"
        ]
    assert sorted((r.pool, r.state) for r in runs) == [("a0", "CRASHED"), ("a1", "COMPLETED")], runs
    cluster.start()  # brings the dead worker back for the next tests


def test_a_killed_dispatcher_is_resumed_without_redoing_finished_stages(cluster: Cluster, tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "resume.json", [{"id": f"r{i}", "seed": 200 + i} for i in range(4)])
    run_id = submit(cluster, batch)
    runs = Path(cluster.config.runs_dir)

    def delivered() -> int:  # the dispatcher writes the manifest once it starts
        return len(load_manifest(runs, run_id).delivered) if (runs / run_id / "manifest.json").exists() else 0

    wait_until(lambda: delivered() >= 1, 180, "a first delivered clip")
    kill_tree(cluster.pidfile_pid("h3-control"))
    cluster.start()
    tries: list[subprocess.CompletedProcess[str]] = []

    def resumed() -> bool:  # refused ("still running") until the dead dispatcher's heartbeat is stale
        tries.append(h3(cluster, "resume", run_id))
        return "still running" not in tries[-1].stderr

    try:
        wait_until(resumed, DISPATCHER_SILENCE_S + 60, "resume to take over from the dead dispatcher", every=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{tries[-1].stderr}\n{cluster.dispatcher_record(run_id)}") from None
    res = tries[-1]
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(r.returncode == 2 for r in tries[:-1])
    assert "delivered (verified)" in res.stdout
    record = cluster.dispatcher_record(run_id)
    assert "CRASHED it sent no heartbeat" in record and "prefect.flow-run.Crashed" in record, record
    manifest = load_manifest(runs, run_id)
    assert manifest.state == "completed" and len(manifest.delivered) == 4
    for clip in manifest.clips:
        assert cluster.invocations("encode", clip) <= 1, clip  # the prompt may be cached from earlier runs
        for stage in ("sample", "decode"):
            assert cluster.invocations(stage, clip) == 1, (stage, clip)


def test_a_latent_damaged_on_the_decoder_is_sent_again_not_decoded(cluster: Cluster, tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "corrupt.json", [{"id": "z0", "seed": 300}])
    store = Path(cluster.config.hosts["host-b"].storage.latents)
    before = set(store.rglob("*.h3latent"))
    run_id = submit(cluster, batch)
    damaged: list[Path] = []

    def damage_new_latent() -> bool:
        for path in set(store.rglob("*.h3latent")) - before:
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))
            damaged.append(path)
            return True
        return False

    wait_until(damage_new_latent, 180, "the latent to reach the decoder", every=0.02)
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    rec = manifest.clips["z0"]
    assert rec.state == "delivered" and damaged[0].name == f"{rec.latent_sha256}.h3latent"
    assert cluster.invocations("transfer", "z0") == 2
    assert cluster.invocations("decode", "z0") == 1


def test_bad_input_is_refused_before_anything_starts(cluster: Cluster, tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "dupe.json", [{"id": "d"}, {"id": "d"}])
    res = h3(cluster, "run", str(batch), "--background")
    assert res.returncode == 2 and "duplicate clip id 'd'" in res.stderr and "Traceback" not in res.stderr
    missing = write_batch(tmp_path / "missing.json", [{"id": "m", "image": "nope.png"}])
    res = h3(cluster, "run", str(missing))
    assert res.returncode == 2 and "does not exist" in res.stderr
    res = h3(cluster, "wait", "no-such-run")
    assert res.returncode == 2 and "unknown run id 'no-such-run'" in res.stderr
    runs = list(Path(cluster.config.runs_dir).glob("dupe-*")) + list(Path(cluster.config.runs_dir).glob("missing-*"))
    assert runs == []


def batch_run(cluster: Cluster, run_id: str) -> Any:
    """The run's (first) batch flow run, as Prefect has it."""
    from prefect.client.orchestration import get_client

    from h3flow.pipeline.prefect_api import PrefectApi, prefect_api

    with prefect_api(cluster.config), get_client(sync_client=True):
        api = PrefectApi()
        try:
            return api.batch_runs(run_id)[0]
        finally:
            api.close()


def test_a_batch_travels_by_reference_staged_on_the_dispatchers_host(cluster: Cluster, tmp_path: Path) -> None:
    """A batch over Prefect's 512 KiB parameter limit (inline, its clips would be refused after
    validation): `run` stages it by content and passes its SHA-256; its clips start."""
    long = "a slow pan left over a calm lake at dawn with gentle music, " * 10  # ~600 characters
    clips = [{"id": f"big{i:04d}", "seed": 9000 + i, "prompt": f"{long} take {i}"} for i in range(1200)]
    batch = write_batch(tmp_path / "big.json", clips)
    assert batch.stat().st_size > 600 * 1024, "inline, this batch's clips would be over Prefect's limit"
    run_id = submit(cluster, batch)
    parameters = batch_run(cluster, run_id).parameters
    staged = parameters["staged"]
    assert staged["clips"] == 1200 and len(json.dumps(parameters)) < 1024, parameters
    from h3flow.pipeline.params import StagedBatch

    assert file_intact(StagedBatch.path(cluster.config, staged["sha256"]), staged["sha256"])
    wait_until(lambda: any(line["clip"].startswith("big") for line in cluster.journal("host-a")), 240, "its first clip")
    assert h3(cluster, "cancel", run_id).returncode == 0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_10000_clip_batch_is_dispatched_with_the_dispatcher_under_300_mb(cluster: Cluster, tmp_path: Path) -> None:
    """Accepted, staged, planned (heuristics: over 500 clips), its first clips started, and the
    dispatcher — a thread of the control worker — has grown that process by under 300 MB."""
    control = cluster.pidfile_pid("h3-control")
    before = rss_mb(control)
    clips = [{"id": f"tenk{i:05d}", "seed": 20000 + i} for i in range(10_000)]
    run_id = submit(cluster, write_batch(tmp_path / "tenk.json", clips))
    wait_until(lambda: any(line["clip"].startswith("tenk") for line in cluster.journal("host-a")), 300, "a first clip")
    grown = rss_mb(control) - before
    assert h3(cluster, "cancel", run_id).returncode == 0
    assert grown < 300, f"the control worker grew by {grown:.0f} MB dispatching 10,000 clips"


def prefect_run(cluster: Cluster, *params: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cluster.env()}
    argv = [str(Path(sys.prefix) / "bin" / "prefect"), "deployment", "run", "batch/run", "--watch"]
    for param in params:
        argv += ["--param", param]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def run_story(cluster: Cluster, started: subprocess.CompletedProcess[str]) -> tuple[str, list[str]]:
    """The state message and log lines of the flow run `prefect deployment run` started (it prints
    its UUID; the newest "batch" run may be one the inbox's schedule made)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from h3flow.pipeline.prefect_api import prefect_api

    found = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout)
    assert found, started.stdout + started.stderr
    with prefect_api(cluster.config), get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(found.group(1)))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
    return (run.state.message or "") if run.state else "", [log.message for log in logs]


def test_a_bad_batch_started_from_prefect_fails_saying_every_problem(cluster: Cluster, tmp_path: Path) -> None:
    """`prefect deployment run batch/run --param batch=FILE`: the failed state and the run's log
    carry the whole list of problems, and a relative path is refused saying what to give."""
    bad = write_batch(tmp_path / "five.json", [{"id": f"b{i}", "spec": f"huge{i}"} for i in range(5)])
    done = prefect_run(cluster, f"batch={bad}")
    assert done.returncode != 0
    state, lines = run_story(cluster, done)
    assert "5 problems" in state and all(f"huge{i}" in state for i in range(5)), state + done.stdout + done.stderr
    assert any(all(f"huge{i}" in line for i in range(5)) for line in lines), lines
    relative = prefect_run(cluster, "batch=five.json")
    assert relative.returncode != 0 and "absolute path" in run_story(cluster, relative)[0]


def test_the_batch_deployment_describes_its_parameters_in_the_ui(cluster: Cluster) -> None:
    from prefect.client.orchestration import get_client

    from h3flow.pipeline.prefect_api import prefect_api

    with prefect_api(cluster.config), get_client(sync_client=True) as client:
        schema = client.read_deployment_by_name("batch/run").parameter_openapi_schema
    described = {name: p.get("description") for name, p in schema["properties"].items()}
    assert set(described) == {"batch", "run_id", "config_path", "staged", "resume"}
    assert all(described.values()), described
    assert "absolute path" in described["batch"]


def test_the_scheduled_inbox_deployment_files_each_batch_under_its_run_id(cluster: Cluster, tmp_path: Path) -> None:
    inbox = Path(cluster.config.prefect.schedule.inbox)
    inbox.mkdir(parents=True, exist_ok=True)
    write_batch(inbox / "good.json", [{"id": "i0", "seed": 400}])
    (inbox / "broken.json").write_text("{not json")
    env = {**os.environ, **cluster.env()}
    res = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "prefect"), "deployment", "run", "batch/inbox", "--watch"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    # the good batch ran; the bad one is filed with its reason, and the inbox run says it failed
    assert res.returncode != 0 and "Failed" in res.stdout + res.stderr, res.stdout + res.stderr
    done = list((inbox / "done").glob("good.*.json"))
    failed = list((inbox / "failed").glob("broken.*.json"))
    assert len(done) == 1 and len(failed) == 1 and not list(inbox.glob("*.json"))
    reason = failed[0].with_name(failed[0].name + ".reason.txt").read_text()
    assert "invalid JSON at line 1" in reason and reason.count("\n") == 1
    run_id = done[0].name.removeprefix("good.").removesuffix(".json")
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    assert manifest.state == "completed" and manifest.clips["i0"].state == "delivered"


def _deployments(cluster: Cluster) -> dict[str, tuple]:
    from prefect.client.orchestration import get_client

    from h3flow.pipeline.prefect_api import prefect_api

    with prefect_api(cluster.config), get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        return {
            f"{flows[d.flow_id]}/{d.name}": (
                d.work_pool_name,
                d.entrypoint,
                json.dumps(d.parameters, sort_keys=True),
                json.dumps(d.job_variables, sort_keys=True),
                sorted(s.schedule.cron for s in d.schedules),
            )
            for d in client.read_deployments()
        }


def test_prefect_deploy_all_from_the_written_yaml_gives_the_same_deployments(cluster: Cluster) -> None:
    from prefect.client.orchestration import get_client

    from h3flow.pipeline.prefect_api import prefect_api

    ours = _deployments(cluster)
    assert {"sample-clip/a0", "sample-clip/a1", "decode-clip/b", "batch/run", "batch/inbox"} <= set(ours)
    with prefect_api(cluster.config), get_client(sync_client=True) as client:
        for d in client.read_deployments():
            client.delete_deployment(d.id)
    assert _deployments(cluster) == {}
    env = {**os.environ, **cluster.env()}
    res = subprocess.run(
        [
            str(Path(sys.prefix) / "bin" / "prefect"),
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            str(cluster.config_path.parent / "prefect.yaml"),
        ],
        cwd=SOURCE_DIR,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert _deployments(cluster) == ours
