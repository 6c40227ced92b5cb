"""Batch files: the clips an operator asks for.

A batch is JSON::

    {"name": "demo", "clips": [
        {"id": "c01", "prompt": "slow pan left over a calm lake", "image": "images/lake.png",
         "spec": "sd", "seconds": 5, "seed": 1}
    ]}

Relative image paths are resolved against the batch file's folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from h3flow.core.errors import ConfigError
from h3flow.core.jsonio import format_validation_error, load_json_file
from h3flow.core.specs import SPECS, Spec, frames_for_seconds, get_spec

CLIP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Clip(BaseModel):
    """One image-to-video request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    prompt: str = Field(min_length=1, max_length=4000)
    image: Path
    spec: str = "sd"
    seconds: Annotated[float, Field(gt=0, le=30)] = 5.0
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    steps: Annotated[int, Field(ge=1, le=100)] = 6
    image_sha256: str | None = Field(None, description="the image's content address (set by `run`, not by hand)")

    @field_validator("id")
    @classmethod
    def _id_is_a_safe_name(cls, value: str) -> str:
        if not CLIP_ID.match(value):
            raise ValueError("clip id must be 1-64 letters, digits, '.', '_' or '-' (it names files)")
        return value

    @field_validator("spec")
    @classmethod
    def _spec_is_known(cls, value: str) -> str:
        if value not in SPECS:
            raise ValueError(f"unknown spec {value!r} (known: {', '.join(SPECS)})")
        return value

    @property
    def frames(self) -> int:
        return frames_for_seconds(self.seconds)

    @property
    def resolved_spec(self) -> Spec:
        return get_spec(self.spec)


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "batch"
    clips: list[Clip] = Field(min_length=1)

    @model_validator(mode="after")
    def _ids_unique(self) -> Batch:
        seen: set[str] = set()
        for clip in self.clips:
            if clip.id in seen:
                raise ValueError(f"duplicate clip id {clip.id!r}")
            seen.add(clip.id)
        return self


def load_batch(path: Path, *, check_images: bool = True) -> Batch:
    """Parse and validate a batch file; image paths become absolute."""
    path = Path(path)
    raw = load_json_file(path)
    try:
        batch = Batch.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from None
    base = path.resolve().parent
    clips = [c.model_copy(update={"image": (base / c.image).resolve()}) for c in batch.clips]
    if check_images:
        for clip in clips:
            if not clip.image.is_file():
                raise ConfigError(f"{path}: clip {clip.id!r}: image {clip.image} does not exist")
    return batch.model_copy(update={"clips": clips})
