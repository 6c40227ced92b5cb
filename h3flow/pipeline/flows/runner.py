"""The ``pool-runner`` flow: one long-lived flow run per pool per batch that runs its clips.

Starting a flow-run process costs seconds (the worker's pick-up, Python, Prefect, torch,
the engine) — more than a tiny clip's work, and on the decoder it would sit on every
clip's critical path. So the dispatcher starts one runner per pool through the pool's
work pool (its process worker launches it once per batch), and creates each clip's
``sample-clip`` / ``decode-clip`` flow run in the pool's ``clips`` work queue, which no
worker serves: the runner claims them and executes them here, in its warm process.
Each clip is still its own flow run — named, tagged, cached, retried, cancellable, in
the UI under the batch run — only its start-up is gone.

Up to ``AHEAD`` clips run at once (one on the devices behind the pool lock, one
transferring or waiting), each in its own thread so Prefect's run context of one never
leaks into another. The runner stops when the dispatcher tags it ``h3flow:stop`` (its batch has no more work for
it), or when it or its batch run is cancelled or over.

The Prefect server may go away at any call (a restart) and come back. Two answers lost
that way would strand a clip, each settled here once the API answers again: a claim whose
Pending proposal went through unanswered (the run is Pending and nobody runs it: this
runner starts it — it is the pool's only runner for the batch), and a clip that ended
while Prefect could not be told (its flow run still Running: it is marked Crashed, and the
dispatcher sends it again; its finished stages are cached).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger

from h3flow.config.models import config_at
from h3flow.core.contracts import AHEAD, pool_tag, run_tag
from h3flow.engines import engine_for
from h3flow.pipeline.dispatcher import API_GIVE_UP_S
from h3flow.pipeline.flows.clip import config_path_or_env, decode_clip, sample_clip
from h3flow.pipeline.prefect_api import TERMINAL_STATES, UNAVAILABLE, PrefectApi

POLL = 1.0  # seconds between looks for a queued clip while the pool has room (see docs/pipeline.md)
BATCH_CHECK_S = 5.0  # how often the runner asks whether its batch run is still going


@flow(name="pool-runner", log_prints=True)
def pool_runner(
    run_id: str, pool: str, batch_flow_run_id: str | None = None, config_path: str | None = None
) -> dict[str, Any]:
    """Run this batch's clips for ``pool`` in this process until the batch run is over."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    path = config_path_or_env(config_path)
    config = config_at(path)
    pool_ = config.pool(pool)
    engine_for(config, pool_.encoder_pool or pool)  # warm: imports and weights once per batch
    engine_for(config, pool)
    clip_flow = sample_clip if pool_.role == "sample" else decode_clip
    tags = [run_tag(run_id), pool_tag(pool)]
    own_id = str(flow_run.id) if flow_run.id else None
    api = PrefectApi()
    active: dict[str, threading.Thread] = {}
    unsure: dict[str, Any] = {}  # claims whose answer was lost: ours if Pending
    unreported: set[str] = set()  # clips that ended while Prefect could not be told

    def start(child: Any) -> None:
        logger.info("running %s", child.name)
        thread = threading.Thread(target=execute, args=(clip_flow, child, unreported), daemon=True, name=child.name)
        thread.start()
        active[str(child.id)] = thread
        started.append(str(child.id))

    started: list[str] = []
    checked = 0.0
    down_since: float | None = None
    try:
        while True:
            for run_key in [k for k, thread in active.items() if not thread.is_alive()]:
                del active[run_key]
            try:
                settle(api, unsure, unreported, start)
                if own_id and time.monotonic() - checked > BATCH_CHECK_S:
                    checked = time.monotonic()
                    if api.runner_done(own_id, batch_flow_run_id):
                        break
                if len(active) < AHEAD:
                    for child in api.waiting(tags, AHEAD - len(active)):
                        unsure[str(child.id)] = child
                        if api.take(str(child.id)):
                            start(child)
                        del unsure[str(child.id)]
                down_since = None
            except UNAVAILABLE as exc:  # a busy or restarting server: wait it out, up to API_GIVE_UP_S
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > API_GIVE_UP_S:
                    raise
                logger.warning("Prefect API unavailable (%s); still trying", exc)
            api.pause(POLL)
    finally:
        api.close()
    for thread in active.values():  # take no more; let the clips already running finish (their results are cached)
        thread.join()
    return {"pool": pool, "clips_run": len(started)}


def settle(api: PrefectApi, unsure: dict[str, Any], unreported: set[str], start: Callable[[Any], None]) -> None:
    """Settle what lost API answers left (see the module docstring); raises while the API is still away."""
    if unsure:
        states = api.states(list(unsure))
        for run_id, child in list(unsure.items()):
            if states.get(run_id, ("", None))[0] == "PENDING":
                start(child)
            del unsure[run_id]
    if unreported:
        states = api.states(list(unreported))
        for run_id in list(unreported):
            if states.get(run_id, ("", None))[0] not in TERMINAL_STATES:
                api.abandon(run_id, "it ended while the Prefect API was away, which never heard how")
            unreported.discard(run_id)


def execute(clip_flow: Any, child: Any, unreported: set[str]) -> None:
    """Run one claimed clip flow run in this thread (a fresh thread: a fresh Prefect context)."""
    from prefect.flow_engine import run_flow

    try:
        run_flow(clip_flow, flow_run=child, parameters=child.parameters, return_type="state")
    except Exception:  # the engine could not report to Prefect (a failing flow returns its state)
        unreported.add(str(child.id))
        raise
