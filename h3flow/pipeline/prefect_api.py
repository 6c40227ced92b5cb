"""Talk to the Prefect server local.json names: every Prefect API call h3flow makes.

:func:`prefect_api` points Prefect's client at the config's server (never an ephemeral
one, whatever the caller's environment says); :class:`PrefectApi` is the handful of
calls the dispatcher makes, in one place so tests can stand in for it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import httpx

from h3flow.config.models import LocalConfig
from h3flow.config.settings import settings
from h3flow.core.contracts import CLIPS_QUEUE, STOP_TAG, run_tag
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.results import StageResult, results_from_rows

TERMINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
UNAVAILABLE: tuple[type[BaseException], ...] = (httpx.HTTPError, ConnectionError, TimeoutError)
"""What a busy, restarting or unreachable Prefect server raises (waited out, not a defect)."""


@contextlib.contextmanager
def prefect_api(config: LocalConfig) -> Iterator[None]:
    """Point Prefect's client at ``config.prefect.api_url`` (never an ephemeral server)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: config.prefect.api_url}):
        yield


@dataclass(frozen=True)
class RunProgress:
    """A run as Prefect sees it: the dispatcher's state and its children's counts."""

    state: str  # the newest batch flow run's state type (RUNNING, COMPLETED, ...), or UNREACHABLE
    sampled: int
    delivered: int
    total: int | None
    message: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


class PrefectApi:
    """The Prefect calls the dispatcher and the pool runners make (sync client), in one place.

    Inside a flow run (the batch flow), children are linked to it as subflow runs the
    way ``run_deployment`` links them: one task run in the parent per child, so the UI's
    run graph and "Subflow runs" tab show every clip and cancelling the batch run reaches
    them.
    """

    def __init__(self, parent_flow_run_id: str | None = None) -> None:
        from prefect.client.orchestration import get_client

        self.client = get_client(sync_client=True)
        self.client.__enter__()
        self.parent = parent_flow_run_id
        self._deployment_ids: dict[str, Any] = {}

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def submit(
        self,
        deployment: str,
        parameters: dict[str, Any],
        idempotency_key: str,
        name: str,
        tags: list[str],
        work_queue: str | None = None,
    ) -> str:
        """Create a child flow run of ``deployment`` (two API calls: the link, the run; the id is cached).

        (``run_deployment`` costs several calls a child, which on a busy 2-core server
        dominated the dispatcher's time.) Children carry the run's tags, so the UI lists a
        run's flow runs with one filter.
        """
        deployment_id = self._deployment_ids.get(deployment)
        if deployment_id is None:
            deployment_id = self._deployment_ids[deployment] = self.client.read_deployment_by_name(deployment).id
        link = self._link(deployment, idempotency_key) if self.parent else None
        run = self.client.create_flow_run_from_deployment(
            deployment_id,
            parameters=parameters,
            idempotency_key=idempotency_key,
            name=name,
            tags=tags,
            parent_task_run_id=link,
            work_queue_name=work_queue,
        )
        return str(run.id)

    def _link(self, deployment: str, key: str) -> Any:
        """A task run in the parent flow run standing for one child (what makes it a subflow run)."""
        from uuid import UUID

        from prefect import Task
        from prefect.states import Pending

        stand_in: Task[[], None] = Task(name=deployment, fn=_nothing)
        stand_in.task_key = f"h3flow.child.{deployment}"
        task_run = self.client.create_task_run(
            task=stand_in, flow_run_id=UUID(str(self.parent)), dynamic_key=key, state=Pending()
        )
        return task_run.id

    def states(self, run_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        from uuid import UUID

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        runs = self.client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(r) for r in run_ids]))
        )
        return {
            str(r.id): (r.state_type.value if r.state_type else "PENDING", r.state.message if r.state else None)
            for r in runs
        }

    def results(self, run_id: str) -> dict[str, StageResult]:
        """A child's stage results: the rows of the table artifact it published (none: ``{}``)."""
        from uuid import UUID

        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

        arts = self.client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)]), type=ArtifactFilterType(any_=["table"])
            )
        )
        if not arts:
            return {}
        data = arts[-1].data
        rows: list[dict[str, Any]] = json.loads(data) if isinstance(data, str) else cast(list[dict[str, Any]], data)
        return results_from_rows(rows)

    def task_tries(self, run_id: str) -> dict[str, int]:
        """Per stage, the tries a flow run's task runs started (what a crashed child submitted)."""
        from uuid import UUID

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        runs = self.client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(run_id)])))
        tries: dict[str, int] = {}
        for run in runs:
            if run.state is not None and run.state.name == "Cached":
                continue
            stage = run.name.rsplit("-", 1)[0]
            tries[stage] = tries.get(stage, 0) + int(run.run_count or 0)
        return tries

    def worker_alive(self, work_pool: str) -> bool:
        workers = self.client.read_workers_for_work_pool(work_pool)
        stale_s = settings().worker_stale_s
        now = datetime.now(UTC)
        return any(
            w.last_heartbeat_time is not None and (now - w.last_heartbeat_time).total_seconds() < stale_s
            for w in workers
        )

    def abandon(self, run_id: str, why: str) -> None:
        """Mark a child whose process or pool is gone as Crashed (nobody else will)."""
        from uuid import UUID

        from prefect.states import Crashed

        self.client.set_flow_run_state(UUID(run_id), Crashed(message=why), force=True)

    def cancel(self, run_id: str, why: str) -> None:
        """Cancel a flow run that has not finished (a runner sees it and stops)."""
        from uuid import UUID

        from prefect.states import Cancelled

        self.client.set_flow_run_state(UUID(run_id), Cancelled(message=why), force=True)

    def name_run(self, run_id: str, name: str | None, tags: list[str]) -> None:
        """Give a flow run h3flow's name and tags (a batch run started from the UI or the Prefect CLI too)."""
        from uuid import UUID

        current = self.client.read_flow_run(UUID(run_id))
        self.client.update_flow_run(UUID(run_id), name=name, tags=sorted({*current.tags, *tags}))

    def stop_runner(self, run_id: str) -> None:
        """Ask a pool runner to finish: it sees the tag within seconds and ends Completed."""
        from uuid import UUID

        current = self.client.read_flow_run(UUID(run_id))
        self.client.update_flow_run(UUID(run_id), tags=sorted({*current.tags, STOP_TAG}))

    # -- readers: a run as Prefect sees it
    def batch_runs(self, run_id: str) -> list[Any]:
        """The run's dispatcher flow runs (the first one and every resume), oldest first."""
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterTags
        from prefect.client.schemas.sorting import FlowRunSort

        return list(
            self.client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["batch"])),
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[run_tag(run_id)])),
                sort=FlowRunSort.START_TIME_ASC,
            )
        )

    def live_dispatcher(self, run_id: str) -> str | None:
        """The id of a dispatcher flow run of this run that has not finished, if any."""
        for run in self.batch_runs(run_id):
            if run.state_type is None or run.state_type.value not in TERMINAL_STATES:
                return str(run.id)
        return None

    def run_progress(self, run_id: str) -> RunProgress:
        """The newest dispatcher's state and how many clips its children sampled and delivered."""
        from prefect.client.schemas.filters import (
            FlowFilter,
            FlowFilterName,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
            FlowRunFilterTags,
        )
        from prefect.client.schemas.objects import StateType

        runs = self.batch_runs(run_id)
        if not runs:
            raise H3FlowError(f"unknown run id {run_id!r}: Prefect has no batch run tagged {run_tag(run_id)}")
        newest = runs[-1]
        total = next((len(r.parameters["clips"]) for r in runs if r.parameters.get("clips")), None)
        done = FlowRunFilter(
            tags=FlowRunFilterTags(all_=[run_tag(run_id)]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED])),
        )

        def finished(flow: str) -> int:
            count = self.client.count_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])), flow_run_filter=done
            )
            return min(count, total) if total is not None else count

        state = newest.state_type.value if newest.state_type else "PENDING"
        message = newest.state.message if newest.state else None
        return RunProgress(state, finished("sample-clip"), finished("decode-clip"), total, message)

    # -- the pool runner's side
    def runner_done(self, own_id: str, batch_id: str | None) -> bool:
        """True when the runner should take no more clips: asked to stop, cancelled, or its batch run is over."""
        from uuid import UUID

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        ids = [UUID(own_id), *([UUID(batch_id)] if batch_id else [])]
        runs = {
            str(r.id): r
            for r in self.client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        }
        own = runs.get(own_id)
        if own is None or STOP_TAG in own.tags or (batch_id and batch_id not in runs):
            return True
        over = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED", "CANCELLING"}
        return any(r.state_type is not None and r.state_type.value in over for r in runs.values())

    def claim(self, tags: list[str], limit: int) -> list[Any]:
        """Take up to ``limit`` scheduled clip flow runs (queue ``clips``) carrying all ``tags``, oldest first.

        A run is ours once Prefect accepts our Pending proposal: two runners (or a worker)
        can never both start it.
        """
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
            FlowRunFilterTags,
            FlowRunFilterWorkQueueName,
        )
        from prefect.client.schemas.objects import StateType
        from prefect.client.schemas.responses import SetStateStatus
        from prefect.client.schemas.sorting import FlowRunSort
        from prefect.states import Pending

        waiting = self.client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=tags),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
                work_queue_name=FlowRunFilterWorkQueueName(any_=[CLIPS_QUEUE]),  # never another runner
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=limit,
        )
        claimed = []
        for run in waiting:
            if self.client.set_flow_run_state(run.id, Pending()).status == SetStateStatus.ACCEPT:
                claimed.append(run)
        return claimed

    def now(self) -> float:
        return time.time()

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)  # the poll interval of an API poll loop, not synchronisation


def _nothing() -> None:
    """The body of the task run that stands for a child in its parent (never called)."""
