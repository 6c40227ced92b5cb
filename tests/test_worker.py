"""The ``h3flow`` Prefect worker type and the runtime Prefect owns, against a real local cluster.

Each GPU pool is a work pool of the ``h3flow`` type served by a worker that runs its
flow runs in its own warm process; the pool's queue holds AHEAD clips, a global
concurrency limit keeps its GPU stages to one clip; a cancelled clip stops at its next
stage boundary; cancelling a batch run cancels its clips (the dispatcher, and Prefect's cascade); a
claim that never starts, or a start that never beats, is marked Crashed by the silence
automations ``deploy`` made.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from cluster import DISPATCHER_SILENCE_S, SILENCE_S, SILENCES, Cluster, make_cluster, wait_until, write_batch

from h3flow.core.contracts import AHEAD, CLIP_TAG, DISPATCHER_TAG, H3FLOW_TAG, WORKER_TYPE, gpu_limit
from h3flow.pipeline.automations import NEVER_STARTED, SILENT_CLIP, SILENT_DISPATCHER
from h3flow.pipeline.manifest import load_manifest
from h3flow.pipeline.prefect_api import RunFlowRun, prefect_api, run_flow_runs

pytestmark = pytest.mark.prefect

BEAT_OR_START = {"prefect.flow-run.heartbeat", "prefect.flow-run.Running"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("worker"))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Any]:
    from prefect.client.orchestration import get_client

    with prefect_api(cluster.config), get_client(sync_client=True) as c:
        yield c


def children(cluster: Cluster, run_id: str) -> list[RunFlowRun]:
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    return [r for r in run_flow_runs(cluster.config, run_id, manifest.flow_run_ids) if r.clip is not None]


def test_prefect_holds_the_pools_their_limits_and_the_automations(cluster: Cluster, client: Any) -> None:
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

    names = [p.work_pool for p in cluster.config.pools] + [cluster.config.control_work_pool]
    wait_until(lambda: all(p.status.value == "READY" for p in client.read_work_pools(
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=names)))), 60, "every pool READY")  # fmt: skip
    for name in names:
        assert client.read_work_pool(name).type == WORKER_TYPE
        limit = client.read_work_queue_by_name("default", work_pool_name=name).concurrency_limit
        assert limit == (None if name == cluster.config.control_work_pool else AHEAD), name
    for pool in cluster.config.pools:
        assert client.read_global_concurrency_limit_by_name(gpu_limit(pool.name)).limit == 1
    watches = {SILENT_CLIP: (CLIP_TAG, SILENCE_S), SILENT_DISPATCHER: (DISPATCHER_TAG, DISPATCHER_SILENCE_S),
               NEVER_STARTED: (H3FLOW_TAG, SILENCE_S)}  # fmt: skip
    for name, (tag, within) in watches.items():
        (automation,) = client.read_automations_by_name(name)
        assert automation.enabled and automation.trigger.within.total_seconds() == within, name
        assert automation.trigger.after == ({"prefect.flow-run.Pending"} if name == NEVER_STARTED else BEAT_OR_START)
        assert automation.trigger.match_related.root == {
            "prefect.resource.role": "tag",
            "prefect.resource.id": f"prefect.tag.{tag}",
        }


def test_deploying_again_leaves_the_automations_alone(cluster: Cluster, client: Any) -> None:
    """Updating an automation makes Prefect forget the runs it was timing: ``start`` deploys
    whenever it brings a worker back, so an automation already right is never touched."""
    from h3flow.pipeline.runs import deploy_everything

    before = {a.name: a.model_dump(mode="json") for a in client.read_automations()}
    os.environ.update(SILENCES)
    try:
        deploy_everything(cluster.config_path)
    finally:
        for key in SILENCES:
            os.environ.pop(key)
    assert {a.name: a.model_dump(mode="json") for a in client.read_automations()} == before


def test_clips_run_in_their_pools_warm_worker_process(cluster: Cluster, client: Any, tmp_path: Path) -> None:
    run_id = cluster.submit(write_batch(tmp_path / "warm.json", [{"id": f"w{i}", "seed": 500 + i} for i in range(4)]))
    assert cluster.h3("wait", run_id).returncode == 0
    workers = {pool: cluster.pidfile_pid(f"h3-{pool}") for pool in ("a0", "a1", "b")}
    lines = [line for host in ("host-a", "host-b") for line in cluster.journal(host) if line["clip"].startswith("w")]
    assert lines and all(line["pid"] == workers[line["pool"]] for line in lines), (workers, lines)
    for run in children(cluster, run_id):
        flow_run = client.read_flow_run(UUID(run.id))
        assert flow_run.infrastructure_pid == str(workers[run.pool]) and {H3FLOW_TAG, CLIP_TAG} <= set(flow_run.tags)


def test_a_cancelled_clip_stops_at_its_next_stage_boundary_and_is_sent_again(
    cluster: Cluster, client: Any, tmp_path: Path
) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    long = {"spec": "hd", "seconds": 2, "steps": 24}  # a sample of 10-30 s: cancelled while it runs
    run_id = cluster.submit(write_batch(tmp_path / "cancel-one.json", [{"id": "x0", "seed": 600, **long}]))
    wait_until(lambda: any(j["clip"] == "x0" and j["stage"] == "sample" for j in cluster.journal("host-a")), 180,
               "x0 to start sampling")  # fmt: skip
    (first,) = [r for r in children(cluster, run_id) if r.stage == "sample"]
    client.set_flow_run_state(UUID(first.id), State(type=StateType.CANCELLING, message="cancelled in the UI"))
    assert cluster.h3("wait", run_id).returncode == 0
    ended = client.read_flow_run(UUID(first.id)).state
    assert ended.type.value == "CANCELLED" and "stage boundary" in (ended.message or ""), ended
    transfers = [j for j in cluster.journal("host-a") if j["clip"] == "x0" and j["stage"] == "transfer"]
    assert len(transfers) == 1, "the cancelled run stopped before its transfer; the second run made the one"
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    assert manifest.clips["x0"].state == "delivered" and manifest.clips["x0"].attempts == 2
    assert cluster.invocations("sample", "x0") == 1, "the second run took the sample from the cache"


def test_cancelling_the_batch_run_cancels_its_clips_through_prefect_and_resume_finishes(
    cluster: Cluster, client: Any, tmp_path: Path
) -> None:
    """The UI's Cancel on the batch run alone: its clip runs (its subflow runs) are cancelled, by the
    dispatcher as it stops and by Prefect's cascade; the dispatcher records the clips as cancelled."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    ids = [f"y{i}" for i in range(4)]
    long = {"spec": "hd", "seconds": 2, "steps": 24}  # 10-30 s a sample: most of the batch is still to do
    run_id = cluster.submit(
        write_batch(tmp_path / "cancel-all.json", [{"id": c, "seed": 700 + i, **long} for i, c in enumerate(ids)])
    )
    wait_until(lambda: any(j["clip"] in ids and j["stage"] == "sample" for j in cluster.journal("host-a")), 180,
               "a sample to start")  # fmt: skip
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    client.set_flow_run_state(UUID(manifest.flow_run_ids[0]), State(type=StateType.CANCELLING))
    assert cluster.h3("wait", run_id).returncode == 1

    def all_over() -> bool:
        return all(r.terminal for r in children(cluster, run_id))

    wait_until(all_over, 120, "Prefect to cancel every clip run of the cancelled batch run", every=1)
    states = {r.state for r in children(cluster, run_id)}
    assert "CANCELLED" in states and states <= {"CANCELLED", "COMPLETED"}, states
    manifest = load_manifest(cluster.config.runs_dir, run_id)
    assert manifest.state == "cancelled"
    assert {rec.state for rec in manifest.clips.values()} <= {"cancelled", "delivered"}
    res = cluster.h3("resume", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(load_manifest(cluster.config.runs_dir, run_id).delivered) == 4


def test_a_claim_that_never_starts_and_a_start_that_never_beats_are_marked_crashed(
    cluster: Cluster, client: Any
) -> None:
    """A worker's Pending proposal that the server took but whose answer was lost: nobody starts
    the run. A clip run killed as it started, before its first heartbeat reached the server: no
    beat will ever come. Prefect's automations mark both Crashed, and a dispatcher sends their
    clips again."""
    from prefect import flow
    from prefect.states import Pending, Running

    stand_in = flow(name="sample-clip")(lambda: None)  # only its name reaches the server
    claimed = client.create_flow_run(stand_in, name="claimed/z0 sample on a0", tags=[H3FLOW_TAG], state=Pending())
    started = client.create_flow_run(stand_in, name="started/z1 sample on a0", tags=[H3FLOW_TAG, CLIP_TAG])
    client.set_flow_run_state(started.id, Running(), force=True)

    def crashed() -> bool:
        states = [client.read_flow_run(run.id).state for run in (claimed, started)]
        return all(state is not None and state.type.value == "CRASHED" for state in states)

    wait_until(crashed, SILENCE_S + 60, "the never-started claim and the never-beating start to be Crashed", every=2)
    assert "did not start" in (client.read_flow_run(claimed.id).state.message or "")
    assert "sent no heartbeat" in (client.read_flow_run(started.id).state.message or "")


def test_a_pools_clips_take_its_gpu_slot_one_at_a_time_holding_prefects_slot_meanwhile(cluster: Cluster) -> None:
    """Three clips of a pool in one process: never two on the GPUs at once; Prefect's slot (the
    Concurrency page) is held while they run, handed on in-process, and free after the last."""
    import threading
    import time

    from h3flow.pipeline.gpu_slot import gpu_slot

    pool = cluster.config.pools[0].name
    inside: list[str] = []
    most, active = [0], []
    guard = threading.Lock()

    def clip(name: str) -> None:
        with prefect_api(cluster.config), gpu_slot(pool):
            with guard:
                inside.append(name)
                most[0] = max(most[0], len(inside))
            active.append(client_slots(cluster, pool))
            time.sleep(0.3)  # a clip's GPU stages
            with guard:
                inside.remove(name)

    threads = [threading.Thread(target=clip, args=(f"c{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1 and active == [1, 1, 1], (most, active)
    wait_until(lambda: client_slots(cluster, pool) == 0, 30, "the slot to be free after the last clip")


def test_a_clip_that_waits_long_for_a_slot_held_elsewhere_says_so_and_takes_it_once_freed(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A slot taken by a holder outside this process (another worker, or one left taken): the waiting clip
    logs the wait past its patience with the command that frees it, and runs once the slot is given back."""
    import threading

    import httpx

    from h3flow.pipeline.gpu_slot import gpu_slot

    pool = cluster.config.pools[0].name
    api = cluster.config.prefect.api_url.rstrip("/") + "/v2/concurrency_limits"
    taken = httpx.post(
        f"{api}/increment-with-lease", json={"names": [gpu_limit(pool)], "slots": 1, "lease_duration": 300}
    )
    lease_id = taken.raise_for_status().json()["lease_id"]
    ran = threading.Event()

    def clip() -> None:
        with prefect_api(cluster.config), gpu_slot(pool, patience=0.5):
            ran.set()

    def waits() -> list[str]:
        return [r.getMessage() for r in caplog.records if "taken by another holder" in r.getMessage()]

    thread = threading.Thread(target=clip)
    with caplog.at_level(logging.WARNING, logger="h3flow.pipeline.gpu_slot"):
        thread.start()
        try:
            wait_until(waits, 60, "the clip to log its wait")
            assert not ran.is_set()
        finally:
            httpx.post(f"{api}/decrement-with-lease", json={"lease_id": lease_id}).raise_for_status()
        thread.join(timeout=120)
    assert ran.is_set()
    assert f"`prefect gcl update {gpu_limit(pool)} --active-slots 0`" in waits()[0]
    wait_until(lambda: client_slots(cluster, pool) == 0, 30, "the slot to be free after the clip")


def client_slots(cluster: Cluster, pool: str) -> int:
    from prefect.client.orchestration import get_client

    with prefect_api(cluster.config), get_client(sync_client=True) as c:
        return int(c.read_global_concurrency_limit_by_name(gpu_limit(pool)).active_slots)


def test_a_pool_whose_worker_stops_is_not_ready_then_ready_again(cluster: Cluster, client: Any) -> None:
    def status() -> str:
        return client.read_work_pool("h3-a1").status.value

    os.kill(cluster.pidfile_pid("h3-a1"), signal.SIGKILL)
    wait_until(lambda: status() == "NOT_READY", 60, "pool h3-a1 to be NOT_READY", every=1)
    cluster.start()
    wait_until(lambda: status() == "READY", 60, "pool h3-a1 to be READY again", every=1)


def test_a_run_whose_engine_lost_the_api_is_started_again_or_crashed_once_the_api_is_back(
    cluster: Cluster, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The Prefect server goes away as a worker's engine starts a run it has claimed (Pending), and
    as another run it executes ends (Running). The events that would time the silence automations
    can go with the server, so nobody else will act on either: once the API is back, the worker
    starts the first again itself and marks the second Crashed, so its clip is sent again (before:
    both were left as they were; a multi-host batch waited on two Pending runs until `wait` gave up)."""
    import threading

    from prefect import flow
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from prefect.states import Pending

    from h3flow.pipeline.worker import execute

    inside, let_end, started_bodies = threading.Event(), threading.Event(), []

    def claimed_body() -> None:
        started_bodies.append("claimed")

    def running_body() -> None:
        inside.set()
        let_end.wait(60)

    claimed_flow = flow(name="probe-claimed")(claimed_body)
    running_flow = flow(name="probe-running")(running_body)
    claimed = client.create_flow_run(claimed_flow, name="probe: claimed, not started", state=Pending())
    running = client.create_flow_run(running_flow, name="probe: running as the API goes")
    claimed, running = client.read_flow_run(claimed.id), client.read_flow_run(running.id)  # as a worker has them
    outcome: dict[str, str] = {}

    def worker_thread(name: str, body: Any, run: Any) -> None:
        with prefect_api(cluster.config), temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
            outcome[name] = execute(body, run)

    threads = [threading.Thread(target=worker_thread, args=("running", running_flow, running))]
    try:
        threads[0].start()
        assert inside.wait(60), "the running probe never started"
        os.kill(cluster.pidfile_pid("prefect-server"), signal.SIGKILL)
        threads.append(threading.Thread(target=worker_thread, args=("claimed", claimed_flow, claimed)))
        threads[1].start()
        let_end.set()
        wait_until(  # both engines failed on the API (a worker that gives up on them ends its threads)
            lambda: len(lost_api(caplog)) == 2 or not any(t.is_alive() for t in threads),
            120,
            "both engines to lose the API",
        )
    finally:
        let_end.set()
        cluster.start()  # the server back (same database), as an operator's `start` brings it
        for thread in threads:
            thread.join(300)
    assert outcome == {"running": "CRASHED", "claimed": "COMPLETED"}, outcome
    assert started_bodies == ["claimed"], "the claimed run started once, here, once the API was back"
    assert client.read_flow_run(claimed.id).state.type.value == "COMPLETED"
    crashed = client.read_flow_run(running.id).state
    assert crashed.type.value == "CRASHED" and "lost Prefect's API while it ran" in (crashed.message or ""), crashed


def lost_api(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lost Prefect's API" in r.getMessage()]
