"""Talk to the Prefect server local.json names: every Prefect API call h3flow makes.

:func:`prefect_api` points Prefect's client at the config's server with the cluster's
credential (never an ephemeral server, never ``~/.prefect``, whatever the caller's
environment says); :func:`api_headers` is the same credential for plain HTTP calls;
:class:`PrefectApi` is the handful of calls the dispatcher makes, in one place so tests
can stand in for it. Inside a worker's flow run the worker's environment already holds
the URL and the credential (``h3flow start`` gives them).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from h3flow.config.models import LocalConfig
from h3flow.config.settings import prefect_client_home, settings
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.results import StageResult, results_from_rows


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
    import httpx

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


class PrefectApi:
    """The few Prefect calls the dispatcher makes (sync client), in one place."""

    def __init__(self) -> None:
        from prefect.client.orchestration import get_client

        self.client = get_client(sync_client=True)
        self.client.__enter__()
        self._deployment_ids: dict[str, Any] = {}

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def submit(self, deployment: str, parameters: dict[str, Any], idempotency_key: str, name: str, run_tag: str) -> str:
        """One API call per child: the deployment's id is looked up once and cached.

        (``run_deployment`` costs several calls a child, which on a busy 2-core server
        dominated the dispatcher's time.) Children carry the run's tag, so the UI lists a
        run's flow runs with one filter.
        """
        deployment_id = self._deployment_ids.get(deployment)
        if deployment_id is None:
            deployment_id = self._deployment_ids[deployment] = self.client.read_deployment_by_name(deployment).id
        run = self.client.create_flow_run_from_deployment(
            deployment_id, parameters=parameters, idempotency_key=idempotency_key, name=name, tags=[run_tag]
        )
        return str(run.id)

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
        from uuid import UUID

        from prefect.states import Crashed

        self.client.set_flow_run_state(UUID(run_id), Crashed(message=why), force=True)

    def now(self) -> float:
        return time.time()

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)  # the poll interval of an API poll loop, not synchronisation
