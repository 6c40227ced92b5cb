"""What a stage hands back, and how a failure is told apart: the pipeline's typed seams.

A :class:`StageResult` travels from a task to its flow, from the flow to the dispatcher
(as the rows of the flow run's table artifact, so no storage is shared) and into the
manifest. A :class:`FailureKind` is decided once, where the exception is caught
(:func:`classify`), and read by the dispatcher to pick the one layer that retries it.
"""

from __future__ import annotations

import errno
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from h3flow.core.errors import ConfigError, H3FlowError, IntegrityError, TransientError
from h3flow.core.files import FileRef


class BudgetSpent(H3FlowError):
    """The clip has used every submission of a stage it is allowed (MAX_SUBMISSIONS)."""


class FailureKind(StrEnum):
    """Why a stage failed, which says who may retry it (docs/pipeline.md, "Retries")."""

    INPUT = "input"  # the batch, config or an input file is wrong: the operator fixes it, nobody retries
    RESOURCE = "resource"  # disk full, permission denied: retrying cannot help until the operator acts
    TRANSIENT = "transient"  # a dropped connection, a timeout, a restarted service: the task retries it
    INTEGRITY = "integrity"  # bytes that do not match their SHA-256 on the decoder: the dispatcher re-sends
    CRASHED = "crashed"  # the process or pool running it is gone: the dispatcher re-routes it
    TIMEOUT = "timeout"  # it ran past its deadline (docs/operations.md): stopped, and the dispatcher re-sends it
    BUDGET = "budget"  # the clip's submissions of this stage are spent (MAX_SUBMISSIONS)
    CANCELLED = "cancelled"
    BUG = "bug"  # anything else: a defect in h3flow, reported with its type, never retried

    @property
    def dispatcher_retries(self) -> bool:
        """The kinds the dispatcher acts on by submitting the clip again."""
        return self in (FailureKind.INTEGRITY, FailureKind.CRASHED, FailureKind.TIMEOUT)


PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def classify(exc: BaseException) -> FailureKind:
    """The kind of a stage's exception (the only place this is decided)."""
    import httpx
    from prefect.task_engine import TaskRunTimeoutError

    if isinstance(exc, BudgetSpent):
        return FailureKind.BUDGET
    if isinstance(exc, httpx.TransportError):  # the run's engine lost the Prefect API (ComfyUI's are wrapped)
        return FailureKind.CRASHED
    if isinstance(exc, TaskRunTimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, IntegrityError):
        return FailureKind.INTEGRITY
    if isinstance(exc, TransientError | ConnectionError | TimeoutError):
        return FailureKind.TRANSIENT
    if isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNOS:
        return FailureKind.RESOURCE
    if isinstance(exc, ConfigError):
        return FailureKind.INPUT
    if isinstance(exc, OSError):
        return FailureKind.TRANSIENT
    if isinstance(exc, H3FlowError):
        return FailureKind.INPUT  # something the operator can fix, explained in one line
    return FailureKind.BUG


class StageResult(BaseModel):
    """One stage of one clip: where it ran, what it made (a file named by content), how long."""

    model_config = ConfigDict(extra="allow")  # stage-specific facts (transfer method, freed bytes...)

    stage: str
    host: str | None = None
    pool: str | None = None
    path: str | None = None
    sha256: str | None = None
    size: int | None = None
    started: float | None = None
    seconds: float | None = None
    cached: bool = False
    tries: int = 0  # submissions of this stage's prompt in this flow run (0 when cached)
    failure: FailureKind | None = None
    error: str | None = None

    @property
    def file(self) -> FileRef:
        if self.path is None or self.sha256 is None or self.size is None:
            raise ValueError(f"stage {self.stage} produced no file")
        return FileRef.from_json({"path": self.path, "sha256": self.sha256, "size": self.size})

    def row(self) -> dict[str, Any]:
        """The stage as a table-artifact row (JSON values only)."""
        return self.model_dump(mode="json")


def results_from_rows(rows: list[dict[str, Any]]) -> dict[str, StageResult]:
    """A child's table artifact back into its results, by stage."""
    results = [StageResult.model_validate(row) for row in rows]
    return {r.stage: r for r in results}
