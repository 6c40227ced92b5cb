"""The flows' parameters that are more than a name: pydantic models Prefect validates.

Prefect checks a flow run's parameters against these before the flow body runs (from
``h3flow run``, the dispatcher, the UI's form or ``prefect deployment run``) and shows
their fields, with these descriptions, in the UI. The flow bodies receive the models.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from h3flow.config.models import LocalConfig
from h3flow.core.contracts import MAX_SUBMISSIONS
from h3flow.pipeline.lifecycle import ClipState


def _left(stage: str) -> int:
    return Field(MAX_SUBMISSIONS, ge=0, le=MAX_SUBMISSIONS, description=f"{stage} prompts this clip may still submit")


class Budget(BaseModel):
    """Per stage, the submissions of a clip's prompt still allowed in this run (the dispatcher's
    tally of every earlier try, subtracted from MAX_SUBMISSIONS)."""

    model_config = ConfigDict(extra="forbid")

    encode: int = _left("encode")
    sample: int = _left("sample")
    transfer: int = _left("transfer")
    decode: int = _left("decode")

    def left(self, stage: str) -> int:
        return int(getattr(self, stage, MAX_SUBMISSIONS))


class StagedBatch(BaseModel):
    """A validated batch that ``h3flow run`` staged by content where the dispatcher reads it
    (``<control host's store>/inputs/<sha256>.json``): passed by reference, so a batch's size is
    bounded by disk, not by Prefect's parameter limit."""

    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="the staged batch file's SHA-256 (its name)")
    clips: int = Field(ge=1, description="how many clips it holds")
    name: str = Field(description="the batch's name")

    @staticmethod
    def path(config: LocalConfig, sha256: str) -> Path:
        """Where a staged batch lives: the control host's input store, named by content."""
        from h3flow.handoff.inputs import input_path

        return input_path(Path(config.hosts[config.control_host].storage.root), sha256, ".json")


class ResumePlan(BaseModel):
    """What ``h3flow resume`` verified on the hosts: each clip's state to continue from."""

    model_config = ConfigDict(extra="forbid")

    states: dict[str, ClipState] = Field(
        description="clip id -> pending (sample again), sampled (its decoder holds the latent) or delivered"
    )
    resend: list[str] = Field(default_factory=list, description="clips whose latent must be sent to the decoder again")
