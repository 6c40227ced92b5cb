"""Stop requests for flow runs executing in this process (the h3flow worker runs them in-process).

Prefect cancels a flow run by killing its process; an h3flow worker runs many flow runs
in one warm process, so it cannot. When Prefect asks it to cancel one (the UI's Cancel,
``h3flow cancel``, or Prefect's cascade from a cancelled batch run), the worker files a
request here and the flow stops at its next stage boundary (:func:`checkpoint`), ending
Cancelled. A stage that has started finishes first: its result is cached either way.
"""

from __future__ import annotations

import threading

_requests: dict[str, str] = {}  # flow run id -> why
_guard = threading.Lock()


class StopRequested(Exception):
    """Raised at a stage boundary of a flow run whose stop was requested."""


def request_stop(flow_run_id: str, why: str) -> None:
    with _guard:
        _requests[flow_run_id] = why


def forget(flow_run_id: str) -> None:
    with _guard:
        _requests.pop(flow_run_id, None)


def stop_reason(flow_run_id: str | None) -> str | None:
    with _guard:
        return _requests.get(flow_run_id) if flow_run_id else None


def checkpoint() -> None:
    """Raise :class:`StopRequested` if the current flow run was asked to stop."""
    from prefect.runtime import flow_run

    why = stop_reason(str(flow_run.id) if flow_run.id else None)
    if why is not None:
        raise StopRequested(why)
