"""The run manifest: ``<runs_dir>/<run_id>/manifest.json``, the source of truth for a run.

One writer (the dispatcher, or ``resume`` through it) rewrites it atomically after every
state change, so ``wait``/``status`` can read it at any time and a killed dispatcher
leaves a consistent record behind.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError
from h3flow.core.fsutil import atomic_write_json
from h3flow.core.jsonio import format_validation_error, load_json_file
from h3flow.pipeline.results import FailureKind, StageResult

ClipState = Literal["pending", "sampling", "sampled", "decoding", "delivered", "failed"]
RunState = Literal["pending", "running", "completed", "failed", "cancelled"]
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def new_run_id(batch_name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9-]+", "-", batch_name).strip("-")[:24] or "batch"
    return f"{safe}-{stamp}-{secrets.token_hex(2)}"


class ClipRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clip: Clip
    state: ClipState = "pending"
    pool: str | None = None
    decoder: str | None = None
    attempts: int = 0  # sample-clip runs submitted (by this dispatcher incarnation)
    decode_attempts: int = 0
    latent_sha256: str | None = None
    output: str | None = None
    output_sha256: str | None = None
    error: str | None = None
    stages: dict[str, StageResult] = Field(default_factory=dict)
    submissions: dict[str, int] = Field(
        default_factory=dict,
        description="per stage: prompts submitted so far, over every attempt (MAX_SUBMISSIONS caps it)",
    )
    failure: FailureKind | None = None
    planned: dict[str, float] = Field(default_factory=dict)
    timeline: dict[str, float] = Field(
        default_factory=dict, description="dispatcher's clock: sample_submitted, sampled, decode_submitted, delivered"
    )


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    batch_name: str
    config_path: str
    created: str = Field(default_factory=now)
    updated: str = Field(default_factory=now)
    state: RunState = "pending"
    flow_run_ids: list[str] = Field(default_factory=list)
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    planned_makespan: float | None = None
    dispatch_overhead_s: float = Field(
        0.0, description="the dispatcher's per-clip API work: submitting children, reading their records"
    )
    clips: dict[str, ClipRecord]

    @property
    def delivered(self) -> list[ClipRecord]:
        return [c for c in self.clips.values() if c.state == "delivered"]

    @property
    def failed(self) -> list[ClipRecord]:
        return [c for c in self.clips.values() if c.state == "failed"]


def run_dir(runs_dir: str | Path, run_id: str) -> Path:
    if not RUN_ID.match(run_id):
        raise ConfigError(f"invalid run id {run_id!r}")
    return Path(runs_dir) / run_id


def manifest_path(runs_dir: str | Path, run_id: str) -> Path:
    return run_dir(runs_dir, run_id) / "manifest.json"


def save_manifest(runs_dir: str | Path, manifest: Manifest) -> Path:
    manifest.updated = now()
    path = manifest_path(runs_dir, manifest.run_id)
    atomic_write_json(path, manifest.model_dump(mode="json"))
    return path


def load_manifest(runs_dir: str | Path, run_id: str) -> Manifest:
    path = manifest_path(runs_dir, run_id)
    if not path.exists():
        raise ConfigError(f"unknown run id {run_id!r} (no {path})")
    raw = load_json_file(path)
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(f"unreadable manifest {path}", exc)) from None


def new_manifest(run_id: str, batch_name: str, clips: list[Clip], config_path: str) -> Manifest:
    return Manifest(
        run_id=run_id,
        batch_name=batch_name,
        config_path=config_path,
        clips={c.id: ClipRecord(clip=c) for c in clips},
    )
