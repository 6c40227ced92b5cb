"""The run manifest: ``<runs_dir>/<run_id>/manifest.json``, the source of truth for a run.

One writer (the dispatcher, or ``resume`` through it; a lock beside it keeps it to one)
records every state change, so ``wait``/``status`` can read it at any time and a killed dispatcher
leaves a consistent record behind.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError
from h3flow.core.fsutil import atomic_write_json, atomic_write_text
from h3flow.core.jsonio import format_validation_error, load_json_file
from h3flow.pipeline.lifecycle import ClipState
from h3flow.pipeline.results import FailureKind, StageResult

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
    retransfer: bool = Field(False, description="its latent must be sent to the decoder again (damaged or lost there)")
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
    submitted: float | None = Field(None, description="when the batch run was submitted (its scheduled start, epoch s)")
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    journal_seq: int = Field(0, description="the last save folded into this record (snapshot + journal)")
    heartbeat: float | None = Field(None, description="the dispatcher's clock when it last saved")
    planned_makespan: float | None = None
    dispatch_overhead_s: float = Field(
        0.0, description="the dispatcher's per-clip API work: submitting children, reading their records"
    )
    dispatch_api_calls: int = Field(0, description="Prefect API calls the run's dispatchers made, polling included")
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


def journal_path(runs_dir: str | Path, run_id: str) -> Path:
    return run_dir(runs_dir, run_id) / "journal.jsonl"


class ManifestWriter:
    """The dispatcher's record of a run: a snapshot and an append-only journal of what changed.

    A save appends one line — the run's own fields and only the clips that changed — so it
    costs O(changes), not O(clips) (a 5000-clip batch does not rewrite megabytes on every
    change). Every ``SNAPSHOT_EVERY`` lines, and at the end, the snapshot is rewritten
    atomically and the journal started afresh. A line cut short by a crash is ignored.
    """

    SNAPSHOT_EVERY = 500

    def __init__(self, runs_dir: str | Path, run_id: str) -> None:
        self.snapshot_path = manifest_path(runs_dir, run_id)
        self.journal = journal_path(runs_dir, run_id)
        self.lines = 0

    def snapshot(self, manifest: Manifest) -> None:
        manifest.updated = now()
        manifest.journal_seq += 1
        atomic_write_json(self.snapshot_path, manifest.model_dump(mode="json"))
        atomic_write_text(self.journal, "")
        self.lines = 0

    def save(self, manifest: Manifest, changed: Iterable[str] = ()) -> None:
        if self.lines >= self.SNAPSHOT_EVERY or not self.snapshot_path.exists():
            self.snapshot(manifest)
            return
        manifest.updated = now()
        manifest.journal_seq += 1
        header = manifest.model_dump(mode="json", exclude={"clips"})
        clips = {cid: manifest.clips[cid].model_dump(mode="json") for cid in changed}
        with open(self.journal, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"header": header, "clips": clips}, separators=(",", ":")) + "\n")
        self.lines += 1


def save_manifest(runs_dir: str | Path, manifest: Manifest) -> Path:
    """Write the whole manifest as a fresh snapshot (what every save of a small run may do)."""
    ManifestWriter(runs_dir, manifest.run_id).snapshot(manifest)
    return manifest_path(runs_dir, manifest.run_id)


def load_manifest(runs_dir: str | Path, run_id: str) -> Manifest:
    """The snapshot with the journal's later changes applied."""
    path = manifest_path(runs_dir, run_id)
    if not path.exists():
        raise ConfigError(f"unknown run id {run_id!r} (no {path})")
    raw = load_json_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"unreadable manifest {path}: not a JSON object")
    journal = journal_path(runs_dir, run_id)
    if journal.exists():
        for line in journal.read_text(encoding="utf-8").splitlines():
            try:
                change = json.loads(line)
            except ValueError:
                break  # the last line of a dispatcher that died mid-write
            if change["header"].get("journal_seq", 0) <= raw.get("journal_seq", 0):
                continue
            raw.update(change["header"])
            raw["clips"].update(change["clips"])
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
