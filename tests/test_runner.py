"""The pool runner's claims and what a lost API answer leaves behind, against a real Prefect server.

A server restarting between acting on a call and answering it leaves two kinds of
stranded clip flow runs (h3flow/pipeline/flows/runner.py): a claim that went through
unanswered (Pending, run by nobody) and a clip whose end Prefect never heard (still
Running). ``settle`` is what the runner does about them once the API answers again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from conftest import PrefectServer  # tests/ is on sys.path (rootdir conftest)

from h3flow.core.contracts import pool_tag
from h3flow.pipeline.flows.runner import settle
from h3flow.pipeline.orphans import crash_orphaned_runners
from h3flow.pipeline.prefect_api import PrefectApi, prefect_api

pytestmark = pytest.mark.prefect


@pytest.fixture
def api(prefect_server: PrefectServer) -> Iterator[PrefectApi]:
    with prefect_api(prefect_server.config):
        client = PrefectApi()
        yield client
        client.close()


def flow_run(api: PrefectApi, state: Any, flow_name: str = "sample-clip", tags: list[str] | None = None) -> Any:
    from prefect import flow

    stand_in = flow(name=flow_name)(lambda: None)  # only its name reaches the server
    return api.client.create_flow_run(stand_in, name=f"{flow_name}·a0", state=state, tags=tags or [])


def state_of(api: PrefectApi, run: Any) -> str:
    return api.states([str(run.id)])[str(run.id)][0]


def test_a_run_is_claimed_once(api: PrefectApi) -> None:
    from prefect.states import Scheduled

    run = flow_run(api, Scheduled())
    assert api.take(str(run.id)) is True and state_of(api, run) == "PENDING"
    assert api.take(str(run.id)) is False, "a second runner (or a retry) cannot claim it again"


def test_a_claim_whose_answer_was_lost_is_run_by_its_runner(api: PrefectApi) -> None:
    from prefect.states import Pending, Scheduled

    accepted_unanswered, never_reached = flow_run(api, Scheduled()), flow_run(api, Scheduled())
    api.client.set_flow_run_state(accepted_unanswered.id, Pending())  # the server took the claim, then went away
    unsure = {str(r.id): r for r in (accepted_unanswered, never_reached)}
    started: list[str] = []
    settle(api, unsure, set(), lambda child: started.append(str(child.id)))
    assert started == [str(accepted_unanswered.id)] and not unsure
    assert state_of(api, never_reached) == "SCHEDULED", "left for the next claim"


def test_a_clip_that_ended_unheard_is_marked_crashed_and_a_heard_end_is_kept(api: PrefectApi) -> None:
    from prefect.states import Completed, Running

    unheard, heard = flow_run(api, Running()), flow_run(api, Completed())
    unreported = {str(unheard.id), str(heard.id)}
    settle(api, {}, unreported, lambda child: None)
    assert not unreported
    assert state_of(api, heard) == "COMPLETED"
    crashed = api.client.read_flow_run(UUID(str(unheard.id))).state
    assert crashed is not None and crashed.type.value == "CRASHED"
    assert crashed.message == "it ended while the Prefect API was away, which never heard how"


def test_a_workers_restart_ends_the_runners_its_previous_worker_left_and_nothing_else(api: PrefectApi) -> None:
    """h3flow.pipeline.orphans, run before pool b's worker starts again (a host reboot)."""
    from prefect.states import Completed, Pending, Running

    b = [pool_tag("b")]
    orphaned = [flow_run(api, Running(), "pool-runner", b), flow_run(api, Pending(), "pool-runner", b)]
    kept = [
        flow_run(api, Completed(), "pool-runner", b),  # already over
        flow_run(api, Running(), "pool-runner", [pool_tag("a0")]),  # another pool's
        flow_run(api, Running(), "decode-clip", b),  # a clip: the dispatcher handles it once its runner ended
        flow_run(api, Running(), "batch", b),  # the dispatcher's own run
    ]
    crashed = crash_orphaned_runners(api.client, "b")
    assert sorted(crashed) == sorted(str(r.id) for r in orphaned)
    assert [state_of(api, r) for r in orphaned] == ["CRASHED", "CRASHED"]
    assert [state_of(api, r) for r in kept] == ["COMPLETED", "RUNNING", "RUNNING", "RUNNING"]
    assert crash_orphaned_runners(api.client, "b") == []


def test_with_the_api_down_the_step_says_so_and_lets_the_worker_start(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL="http://127.0.0.1:9/api", PREFECT_HOME=str(tmp_path))  # port 9: nothing listens
    done = subprocess.run(
        [sys.executable, "-m", "h3flow.pipeline.orphans", "--pool", "b"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pool b: orphaned runners not checked (Prefect API unavailable: ConnectError)"
