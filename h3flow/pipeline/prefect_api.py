"""Talk to the Prefect server local.json names: every Prefect API call h3flow makes.

:func:`prefect_api` points Prefect's client at the config's server with the cluster's
credential (never an ephemeral server, never ``~/.prefect``, whatever the caller's
environment says); :func:`api_headers` is the same credential for plain HTTP calls;
:class:`PrefectApi` is the handful of calls the dispatcher makes, in one place so tests
can stand in for it. Inside a worker's flow run the worker's
environment already holds the URL and the credential (``h3flow start`` gives them). The
functions at the end are what the operator's commands ask about a run (``status`` links,
``logs``, ``cancel``): a run's flow runs are its batch (dispatcher) runs, by id, and
every flow run tagged ``h3flow-run:<id>`` (the clips' children, named
``<run>/<clip> <stage> on <pool>``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx

from h3flow.config.models import LocalConfig
from h3flow.config.settings import prefect_client_home
from h3flow.core.contracts import run_tag
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.results import StageResult, results_from_rows

TERMINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
RunState = tuple[str, str | None]
"""A flow run's state type (RUNNING, COMPLETED, ...) and its message."""


@dataclass(frozen=True)
class Submission:
    """One child flow run to create: kept until Prefect answers, so a retry is the same call."""

    deployment: str
    parameters: dict[str, Any]
    key: str
    name: str
    tags: list[str]


UNAVAILABLE: tuple[type[BaseException], ...] = (httpx.HTTPError, ConnectionError, TimeoutError)
"""What a busy, restarting or unreachable Prefect server raises (waited out, not a defect)."""

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun


def client_home(config: LocalConfig) -> Path:
    """PREFECT_HOME for h3flow's own Prefect client: the work dir's for the embedded default,
    h3flow's cache folder otherwise, never ``~/.prefect`` (another Prefect's profiles,
    database and memo store live there)."""
    if config.work_dir:
        return Path(config.work_dir) / "prefect"
    return prefect_client_home()


def api_credential(config: LocalConfig) -> str | None:
    """The cluster API's basic-auth credential ('user:password'), None for an open API."""
    if config.prefect.auth is None:
        return None
    from h3flow.config.secret import load_secret

    return load_secret(config.prefect.auth).decode().strip()


def api_headers(config: LocalConfig) -> dict[str, str]:
    """Headers for a plain HTTP call to the API (httpx, a browser test): the credential, if any."""
    from h3flow.config.secret import basic_auth_header

    credential = api_credential(config)
    return {} if credential is None else basic_auth_header(credential)


@contextlib.contextmanager
def prefect_api(config: LocalConfig) -> Iterator[None]:
    """Point Prefect's client at ``config.prefect.api_url``, with the cluster's credential.

    The single way h3flow talks to Prefect: never an ephemeral server (the caller's
    environment cannot send it elsewhere, and with no server there is an error, not a
    temporary one), never ``~/.prefect`` (PREFECT_HOME is h3flow's, see :func:`client_home`).
    """
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_SERVER_ALLOW_EPHEMERAL_MODE,
        temporary_settings,
    )

    home = client_home(config)
    home.mkdir(parents=True, exist_ok=True)
    updates: dict[Any, Any] = {
        PREFECT_API_URL: config.prefect.api_url,
        PREFECT_API_AUTH_STRING: api_credential(config),
        PREFECT_HOME: str(home),
        PREFECT_SERVER_ALLOW_EPHEMERAL_MODE: False,
    }
    with temporary_settings(updates):
        yield


def require_api(config: LocalConfig, timeout: float = 5.0) -> None:
    """One line, not a temporary server, when the config's API does not answer or refuses h3flow."""
    url = config.prefect.api_url.rstrip("/")
    try:
        health = httpx.get(f"{url}/health", timeout=timeout)
        version = httpx.get(f"{url}/admin/version", headers=api_headers(config), timeout=timeout)
    except httpx.HTTPError as exc:
        raise H3FlowError(
            f"the Prefect API at {config.prefect.api_url} does not answer ({type(exc).__name__}): "
            "start it with `h3flow start` (h3flow never starts a temporary server)"
        ) from None
    if version.status_code == 401:
        raise H3FlowError(
            f"the Prefect API at {config.prefect.api_url} refused h3flow's credential (401): "
            "prefect.auth must name the file (or variable) the server was started with"
        )
    if health.status_code != 200 or version.status_code != 200:
        raise H3FlowError(
            f"the Prefect API at {config.prefect.api_url} answered {version.status_code}: is it a Prefect server?"
        )


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
    """The Prefect calls the dispatcher makes (sync client), in one place.

    Inside a flow run (the batch flow), children are linked to it as subflow runs the
    way ``run_deployment`` links them: one task run in the parent per child, so the UI's
    run graph and "Subflow runs" tab show every clip, and Prefect's cancellation cascade
    covers them when the batch run is cancelled.
    """

    def __init__(self, parent_flow_run_id: str | None = None) -> None:
        from prefect.client.orchestration import get_client

        self.client = get_client(sync_client=True)
        self.client.__enter__()
        self.parent = parent_flow_run_id
        self._deployment_ids: dict[str, Any] = {}
        self.calls = 0  # API calls made (what the orchestration benchmark reports per clip)

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def submit(self, submission: Submission) -> str:
        """Create a child flow run of a deployment (two API calls: the link, the run; the
        deployment's id is read once). ``run_deployment`` costs several calls a child, which on
        a busy 2-core server dominated the dispatcher's time."""
        s = submission
        deployment_id = self._deployment_ids.get(s.deployment)
        if deployment_id is None:
            self.calls += 1
            deployment_id = self._deployment_ids[s.deployment] = self.client.read_deployment_by_name(s.deployment).id
        link = self._link(s.deployment, s.key) if self.parent else None
        self.calls += 1
        run = self.client.create_flow_run_from_deployment(
            deployment_id, parameters=s.parameters, idempotency_key=s.key, name=s.name, tags=s.tags,
            parent_task_run_id=link,
        )  # fmt: skip
        return str(run.id)

    def _link(self, deployment: str, key: str) -> Any:
        """A task run in the parent flow run standing for one child (what makes it a subflow run)."""
        from uuid import UUID

        from prefect import Task
        from prefect.states import Pending

        stand_in: Task[[], None] = Task(name=deployment, fn=_nothing)
        stand_in.task_key = f"h3flow.child.{deployment}"
        self.calls += 1
        task_run = self.client.create_task_run(
            task=stand_in, flow_run_id=UUID(str(self.parent)), dynamic_key=key, state=Pending()
        )
        return task_run.id

    def states(self, run_ids: list[str]) -> dict[str, RunState]:
        """Each run's state type and message; a run that no longer exists is absent."""
        from uuid import UUID

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        if not run_ids:
            return {}
        self.calls += 1
        runs = self.client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(r) for r in run_ids])), limit=len(run_ids)
        )
        return {
            str(r.id): (r.state_type.value if r.state_type else "PENDING", r.state.message if r.state else None)
            for r in runs
        }

    def results(self, run_id: str) -> dict[str, StageResult]:
        """A child's stage results: the rows of the table artifact it published (none: ``{}``)."""
        from uuid import UUID

        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

        self.calls += 1
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

        self.calls += 1
        runs = self.client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(run_id)])))
        tries: dict[str, int] = {}
        for run in runs:
            if run.state is not None and run.state.name == "Cached":
                continue
            stage = run.name.rsplit("-", 1)[0]
            tries[stage] = tries.get(stage, 0) + int(run.run_count or 0)
        return tries

    def ready_pools(self, work_pools: list[str]) -> set[str]:
        """The work pools Prefect reports READY (a worker online): one call for all of them."""
        from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

        self.calls += 1
        pools = self.client.read_work_pools(work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=work_pools)))
        return {p.name for p in pools if p.status is not None and p.status.value == "READY"}

    def queue_limits(self, work_pools: list[str]) -> dict[str, int | None]:
        """Each work pool's default queue's concurrency limit (None: unlimited)."""
        limits: dict[str, int | None] = {}
        for name in work_pools:
            self.calls += 1
            queue = self.client.read_work_queue_by_name("default", work_pool_name=name)
            limits[name] = queue.concurrency_limit
        return limits

    def withdraw(self, run_id: str, why: str) -> None:
        """Cancel a child no worker has started (it is routed again)."""
        from uuid import UUID

        from prefect.states import Cancelled

        self.calls += 1
        self.client.set_flow_run_state(UUID(run_id), Cancelled(message=why))

    def cancel(self, run_id: str, why: str) -> None:
        """Ask a started child to stop (Cancelling): its worker stops it at its next stage boundary."""
        from uuid import UUID

        from prefect.states import Cancelling

        self.calls += 1
        self.client.set_flow_run_state(UUID(run_id), Cancelling(message=why))

    def name_run(self, run_id: str, name: str | None, tags: list[str]) -> None:
        """Give a flow run h3flow's name and tags (a batch run started from the UI or the Prefect CLI too)."""
        from uuid import UUID

        current = self.client.read_flow_run(UUID(run_id))
        self.client.update_flow_run(UUID(run_id), name=name, tags=sorted({*current.tags, *tags}))

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

    def live_dispatcher(self, run_id: str) -> Any | None:
        """A dispatcher flow run of this run that has not finished, if any."""
        for run in self.batch_runs(run_id):
            if run.state_type is None or run.state_type.value not in TERMINAL_STATES:
                return run
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
        total = next((int(r.parameters["staged"]["clips"]) for r in runs if r.parameters.get("staged")), None)
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

    def now(self) -> float:
        return time.time()

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)  # the poll interval of an API poll loop, not synchronisation


def _nothing() -> None:
    """The body of the task run that stands for a child in its parent (never called)."""


# --------------------------------------------------------------------------- a run, as the operator asks about it
@contextlib.contextmanager
def api_client(config: LocalConfig) -> Iterator[SyncPrefectClient]:
    """A sync client of the config's server; a server that cannot be reached (or that
    answers with an error) is one H3FlowError naming it."""
    import httpx
    from prefect.client.orchestration import get_client

    try:
        with prefect_api(config), get_client(sync_client=True) as client:
            yield client
    except httpx.HTTPError as exc:
        raise H3FlowError(
            f"Prefect server at {config.prefect.api_url}: {exc or type(exc).__name__} (is `h3flow start` done?)"
        ) from None


def ui_url(config: LocalConfig) -> str:
    """The Prefect UI's address: the API URL without its ``/api``."""
    return config.prefect.api_url.rstrip("/").removesuffix("/api")


def flow_run_link(config: LocalConfig, flow_run_id: str) -> str:
    return f"{ui_url(config)}/runs/flow-run/{flow_run_id}"


@dataclass(frozen=True)
class RunFlowRun:
    """One flow run of an h3flow run: the batch (``clip`` None) or a clip's child."""

    id: str
    name: str
    state: str  # the state type: SCHEDULED, RUNNING, COMPLETED, CANCELLING, ...
    state_name: str  # what the UI shows: Late, Cached, Cancelling, ...
    clip: str | None
    stage: str | None  # sample | decode
    pool: str | None
    link: str

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


CHILD_NAME = re.compile(r"^(?:[^/]+/)?(?P<clip>\S+) (?P<stage>sample|decode) on (?P<pool>\S+)$")


def child_name_parts(name: str, run_id: str) -> tuple[str, str, str] | None:
    """``[<run>/]<clip> <stage> on <pool>`` (:func:`~h3flow.pipeline.dispatcher.child_name`) ->
    (clip, stage, pool); None for any other name."""
    match = CHILD_NAME.match(name.removeprefix(f"{run_id}/"))
    return (match["clip"], match["stage"], match["pool"]) if match else None


def _describe(config: LocalConfig, run: FlowRun, run_id: str) -> RunFlowRun:
    child = child_name_parts(run.name, run_id)
    return RunFlowRun(
        id=str(run.id),
        name=run.name,
        state=run.state_type.value if run.state_type else "PENDING",
        state_name=run.state_name or (run.state_type.value.title() if run.state_type else "Pending"),
        clip=child[0] if child else None,
        stage=child[1] if child else None,
        pool=child[2] if child else None,
        link=flow_run_link(config, str(run.id)),
    )


def _read_run_flow_runs(
    client: SyncPrefectClient, config: LocalConfig, run_id: str, batch_ids: Sequence[str]
) -> list[RunFlowRun]:
    from uuid import UUID

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    found: dict[str, RunFlowRun] = {}
    if batch_ids:
        by_id = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(i) for i in batch_ids]))
        for run in client.read_flow_runs(flow_run_filter=by_id):
            found[str(run.id)] = _describe(config, run, run_id)
    offset, page = 0, 200
    while True:  # a big batch has thousands of children: read them a page at a time
        tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[run_tag(run_id)]))
        runs = client.read_flow_runs(
            flow_run_filter=tagged, sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=page, offset=offset
        )
        for run in runs:
            found[str(run.id)] = _describe(config, run, run_id)
        if len(runs) < page:
            break
        offset += page
    batch = [found[i] for i in batch_ids if i in found]
    return batch + [r for r in found.values() if r.clip is not None or r.id not in batch_ids]


def run_flow_runs(config: LocalConfig, run_id: str, batch_ids: Sequence[str]) -> list[RunFlowRun]:
    """The run's batch flow runs (``batch_ids``, oldest first), then every flow run tagged with the run."""
    with api_client(config) as client:
        return _read_run_flow_runs(client, config, run_id, batch_ids)


@dataclass(frozen=True)
class LogLine:
    timestamp: str  # ISO 8601, UTC
    level: str
    flow_run: str  # the flow run's name
    message: str
    task_run: str | None = None  # the task run's name (encode-0, sample-0, ...) for a task's line

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def flow_run_logs(config: LocalConfig, runs: Sequence[RunFlowRun]) -> list[LogLine]:
    """Every log line of these flow runs, oldest first."""
    from uuid import UUID

    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    if not runs:
        return []
    names = {r.id: r.name for r in runs}
    lines: list[LogLine] = []
    with api_client(config) as client:
        log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(r.id) for r in runs]))
        offset, page = 0, 200
        while True:
            logs = client.read_logs(log_filter=log_filter, limit=page, offset=offset, sort=LogSort.TIMESTAMP_ASC)
            tasks = _task_run_names(client, {log.task_run_id for log in logs if log.task_run_id})
            lines += [
                LogLine(
                    timestamp=log.timestamp.astimezone(UTC).isoformat(timespec="milliseconds"),
                    level=logging.getLevelName(log.level),
                    flow_run=names.get(str(log.flow_run_id), str(log.flow_run_id)),
                    message=log.message,
                    task_run=tasks.get(log.task_run_id) if log.task_run_id else None,
                )
                for log in logs
            ]
            if len(logs) < page:
                return lines
            offset += page


def _task_run_names(client: SyncPrefectClient, ids: set[Any]) -> dict[Any, str]:
    """The names of these task runs (by UUID), as the UI shows them: one request per page of logs."""
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    if not ids:
        return {}
    found = client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=list(ids))), limit=len(ids))
    return {run.id: run.name for run in found}


def cancel_run_flow_runs(config: LocalConfig, run_id: str, batch_ids: Sequence[str]) -> list[RunFlowRun]:
    """Cancel the run's batch flow runs, then its children that have not ended, the way the
    UI's Cancel does (a Cancelling state: a worker stops what runs, the server cancels what
    is only scheduled). Returns each flow run it asked to cancel, in its state afterwards.

    Children the dispatcher submitted while this ran are caught by a second pass.
    """
    from uuid import UUID

    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    done: dict[str, RunFlowRun] = {}
    with api_client(config) as client:
        for _ in range(3):
            todo = [
                r
                for r in _read_run_flow_runs(client, config, run_id, batch_ids)
                if not r.terminal and r.id not in done and r.state != "CANCELLING"
            ]
            if not todo:
                break
            for run in sorted(todo, key=lambda r: r.clip is not None):  # the batch first: it submits no more
                state = State(type=StateType.CANCELLING, message=f"cancelled with `h3flow cancel {run_id}`")
                client.set_flow_run_state(UUID(run.id), state)
                got = client.read_flow_run(UUID(run.id))
                done[run.id] = _describe(config, got, run_id)
    return list(done.values())
