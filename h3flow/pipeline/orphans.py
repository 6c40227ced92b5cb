"""Run before a pool's worker starts: mark Crashed the pool runners its previous worker left.

A pool runner is a process its pool's worker started. When the worker is not running
and is started again (a host rebooted, a killed worker), the runners it had started are
gone with it — but Prefect still shows them Running, and nothing else would ever end
them: the dispatcher would wait on their clips for good if the worker came back before
its heartbeat went stale. So the worker's service runs this first (a ``setup`` step,
docs/services.md): every unfinished ``pool-runner`` flow run of this pool becomes
Crashed, and the dispatcher, seeing its runner end, re-sends the clips it held to a
fresh runner. A runner that did survive its worker sees itself Crashed and stops taking
clips (the clip it is running finishes; its stages are cached).

``python -m h3flow.pipeline.orphans --pool NAME``; Prefect's address and credential
come from the worker's environment. An unreachable API skips the step (one line, exit 0):
the worker must start anyway.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from h3flow.core.contracts import pool_tag
from h3flow.pipeline.prefect_api import UNAVAILABLE

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

RUNNER_FLOW = "pool-runner"


def crash_orphaned_runners(client: SyncPrefectClient, pool: str) -> list[str]:
    """Mark this pool's Pending/Running pool-runner flow runs Crashed; returns their ids."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    runs = client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=[RUNNER_FLOW])),
        flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[pool_tag(pool)]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING])),
        ),
    )
    why = f"the worker of pool {pool} was started again: the runner its previous worker started is gone"
    for run in runs:
        client.set_flow_run_state(run.id, Crashed(message=why), force=True)
    return [str(run.id) for run in runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m h3flow.pipeline.orphans", description=__doc__.splitlines()[0])
    parser.add_argument("--pool", required=True, help="the h3flow pool whose worker is about to start")
    args = parser.parse_args(argv)
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "1")  # a server that is down: say so, do not hold the start
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            crashed = crash_orphaned_runners(client, args.pool)
    except UNAVAILABLE as exc:
        print(f"pool {args.pool}: orphaned runners not checked (Prefect API unavailable: {type(exc).__name__})")
        return 0
    print(f"pool {args.pool}: {len(crashed)} orphaned runner(s) marked Crashed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
