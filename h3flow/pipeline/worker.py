"""The ``h3flow`` Prefect worker type: runs each flow run in its own warm process, in a thread.

``prefect worker start --pool h3-a0 --type h3flow`` (what ``h3flow start`` runs per pool)
is a Prefect :class:`~prefect.workers.base.BaseWorker`: Prefect does the claiming, the
worker heartbeats, the pool's READY / NOT_READY status, the queue's concurrency limit
and the cancellation events. What it does differently from a process worker is *where*
a flow run executes: here, in the worker's own process, one thread per flow run, with
Prefect's own engine (``run_flow``). So the start-up a flow-run process pays (Python,
Prefect, torch, the engine's weights) is paid once per worker, when it starts — the
engine is loaded before the worker reports for work — and never per clip or per batch.

Each flow run is still a flow run: claimed, named, tagged, cached, retried, heart-beating,
cancellable, its logs and artifacts in the UI. Cancelling one (the UI, ``h3flow cancel``,
or Prefect's cascade from a cancelled batch run) cannot kill a process shared with other
runs: it files a stop request (:mod:`h3flow.pipeline.stopping`) and the flow ends
Cancelled at its next stage boundary. A worker that dies takes its runs along: their
heartbeats stop, and Prefect's silence automation (``h3flow deploy``) marks them Crashed.

It runs h3flow's flows only (``sample-clip``, ``decode-clip``, ``batch``), imported from
this installation; job variables are not applied (the runs share the worker's
environment: the pool's devices, set by ``h3flow start``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from prefect.states import State
from prefect.workers.base import BaseJobConfiguration, BaseVariables, BaseWorker, BaseWorkerResult

from h3flow.core.contracts import WORKER_TYPE
from h3flow.pipeline import stopping
from h3flow.pipeline.prefect_api import TERMINAL_STATES

if TYPE_CHECKING:
    from uuid import UUID

    from prefect import Flow
    from prefect.client.schemas.objects import FlowRun


log = logging.getLogger(__name__)
MAX_STARTS = 3
"""Starts of one claimed flow run whose engine lost the API before it began; after that it is Crashed."""
LOST_API_WAIT_S = 1800.0
"""How long a flow run whose engine lost Prefect's API waits for the API to be back before it is left as is."""


class H3flowWorkerResult(BaseWorkerResult):
    """The outcome of one in-process flow run (its state is already in Prefect)."""


def flows() -> dict[str, Flow[..., Any]]:
    """The flows an h3flow worker runs, by Prefect flow name."""
    from h3flow.pipeline.flows.batch import batch
    from h3flow.pipeline.flows.clip import decode_clip, sample_clip

    return {f.name: f for f in (sample_clip, decode_clip, batch)}


def warm_up() -> None:
    """Load this pool's engine (imports, weights) before the worker reports for work."""
    from h3flow.config.models import config_at
    from h3flow.config.settings import settings
    from h3flow.engines import engine_for

    flows()  # Prefect, h3flow and the planner imported once
    config_path, pool = settings().config, settings().pool
    if config_path is None or pool is None:
        return  # the control pool: no engine
    config = config_at(config_path)
    engine_for(config, config.pool(pool).encoder_pool or pool)
    engine_for(config, pool)


def execute(flow: Flow[..., Any], flow_run: FlowRun) -> str:
    """Run one flow run here, with Prefect's engine; returns its final state's type.

    Nothing a flow run raises may reach the worker (its other runs share the process). An
    end the server refused (the run was over already: crashed by the silence automation
    while it was stalled) is logged and Prefect's record stands. An engine that lost
    Prefect's API — it could not start the run it was given, or not report its end — is
    followed by :func:`settle` once the API answers again: a claim that never started is
    started again here, a run that did start is marked Crashed (its clip is sent again).
    The silence automations cannot be relied on for these: the events that would time
    them can be lost with the server that went away.
    """
    from prefect.exceptions import Abort
    from prefect.flow_engine import run_flow

    run_id = str(flow_run.id)
    starts = 1
    try:
        while True:
            try:
                state = run_flow(flow, flow_run=flow_run, parameters=flow_run.parameters, return_type="state")
            except Abort as exc:
                log.warning("flow run %s: the server kept its own end of it (%s)", run_id, exc)
                return "ABORTED"
            except Exception as exc:  # noqa: BLE001 - the API went away under the engine (any error: settled below)
                log.warning(
                    "flow run %s: its engine lost Prefect's API (%s); settling it once the API answers", run_id, exc
                )
                settled = settle(run_id, start_again=starts < MAX_STARTS)
                if settled != "START AGAIN":
                    return settled
                starts += 1
                log.warning("flow run %s: it never started; starting it again (start %d)", run_id, starts)
                continue
            return state.type.value if isinstance(state, State) else "COMPLETED"
    finally:
        stopping.forget(run_id)


def settle(flow_run_id: str, start_again: bool) -> str:
    """After its engine lost the API: wait for Prefect (up to :data:`LOST_API_WAIT_S`), then go by its record.

    Pending (this worker's claim went through, the start did not): ``"START AGAIN"``, or
    Crashed when ``start_again`` is false or the worker is stopping. Running or Cancelling
    (it started here; its engine is gone): Crashed. Scheduled (the claim did not go through):
    left to the queue. Over: its state. Returns the state type it leaves the run in.
    """
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    deadline, pause = time.monotonic() + LOST_API_WAIT_S, 1.0
    while True:
        try:
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(UUID(flow_run_id))
                kind = run.state.type.value if run.state is not None else "SCHEDULED"
                if kind in ("SCHEDULED", *TERMINAL_STATES):
                    return kind
                if kind == "PENDING" and start_again and stopping.stop_reason(flow_run_id) is None:
                    return "START AGAIN"
                why = "its engine lost Prefect's API " + ("before it started" if kind == "PENDING" else "while it ran")
                client.set_flow_run_state(run.id, Crashed(message=f"{why}: its worker marked it Crashed"))
                return "CRASHED"
        except Exception as exc:  # noqa: BLE001 - the API is still away: wait for it
            if time.monotonic() > deadline:
                log.error(
                    "flow run %s: Prefect's API did not answer for %g s; its record stands",
                    flow_run_id,
                    LOST_API_WAIT_S,
                )
                return "UNREPORTED"
            log.debug("flow run %s: waiting for Prefect's API (%s)", flow_run_id, exc)
            time.sleep(pause)
            pause = min(2 * pause, 15.0)


class H3flowWorker(BaseWorker[BaseJobConfiguration, BaseVariables, H3flowWorkerResult]):
    """Runs h3flow's flow runs in this warm process, one thread each (see the module docstring)."""

    type = WORKER_TYPE
    job_configuration = BaseJobConfiguration
    job_configuration_variables = BaseVariables
    _description = "Runs h3flow's flow runs in-process, in a worker that keeps its GPU engine warm between runs."
    _documentation_url = "https://github.com/h3flow/h3flow/blob/main/docs/pipeline.md"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flows: dict[str, Flow[..., Any]] = {}
        self._flow_names: dict[str, str] = {}  # flow id -> name
        self._running: set[str] = set()

    async def setup(self) -> None:
        await anyio.to_thread.run_sync(warm_up)
        self._flows = flows()
        await super().setup()

    async def run(
        self,
        flow_run: FlowRun,
        configuration: BaseJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> H3flowWorkerResult:
        flow = self._flows.get(await self._flow_name(flow_run))
        if flow is None:
            raise ValueError(f"the h3flow worker runs h3flow's flows only ({', '.join(self._flows)})")
        run_id = str(flow_run.id)
        self._running.add(run_id)
        if task_status is not None:
            task_status.started(os.getpid())  # its "infrastructure" is this worker
        try:
            final = await anyio.to_thread.run_sync(execute, flow, flow_run)
        finally:
            self._running.discard(run_id)
        if final == "CANCELLING":  # asked to stop after its last boundary: it has ended, so it is cancelled
            await self._mark_flow_run_as_cancelled(
                flow_run, state_updates={"message": "cancelled: it ended before it could stop at a stage boundary"}
            )
        if self._runs_task_group is not None:  # the pool's next clip is likely queued already: claim it now
            self._runs_task_group.start_soon(self._ask_for_work)
        return H3flowWorkerResult(identifier=f"{os.getpid()}:{run_id}", status_code=0 if final != "CRASHED" else 1)

    async def _ask_for_work(self) -> None:
        """Poll the pool once, now, as the worker's loop does every PREFECT_WORKER_QUERY_SECONDS (Prefect's
        own claim: a run already being submitted is skipped). Without it, a pool whose clips take less
        than a poll period can idle up to a period between them (the demo batch: pool gap median 0.34-0.43 s
        before, 0.03 s after; bench/orchestration.py)."""
        try:
            await self.get_and_submit_flow_runs()
        except Exception as exc:  # noqa: BLE001 - the loop's next poll tries again
            self._logger.debug("asking for work after a run failed: %s", exc)

    async def _flow_name(self, flow_run: FlowRun) -> str:
        key = str(flow_run.flow_id)
        if key not in self._flow_names:
            self._flow_names[key] = (await self.client.read_flow(flow_run.flow_id)).name
        return self._flow_names[key]

    async def _cancel_run(self, flow_run_id: UUID) -> None:
        """A run executing here stops at its next stage boundary; one not started yet Prefect's way."""
        if str(flow_run_id) in self._running:
            stopping.request_stop(str(flow_run_id), "cancelled in Prefect")
            self._logger.info("flow run %s: stop requested; it ends at its next stage boundary", flow_run_id)
            return
        await super()._cancel_run(flow_run_id)

    async def teardown(self, *exc_info: Any) -> None:
        """Stopping the worker stops its runs at their next boundary (they end Cancelled)."""
        for run_id in list(self._running):
            stopping.request_stop(run_id, f"worker {self.name} stopped")
        await super().teardown(*exc_info)
