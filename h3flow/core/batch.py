"""Batch files: the clips an operator asks for.

A batch is JSON::

    {"name": "demo", "clips": [
        {"id": "c01", "prompt": "slow pan left over a calm lake", "image": "images/lake.png",
         "spec": "sd", "seconds": 5, "seed": 1}
    ]}

Relative image paths are resolved against the batch file's folder. A bad batch is
reported whole (every problem, one line each) before anything starts; each image is
checked by reading its header only (a PNG/JPEG/WebP/... with a size), so ``/etc/passwd``
or a folder is refused at once, not 40 s later in encode.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from h3flow.core.errors import ConfigError
from h3flow.core.jsonio import load_json_file, validation_problems
from h3flow.core.specs import SPECS, Spec, frames_for_seconds, get_spec

CLIP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF")  # what the encoders read (through PIL)


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
        dupes = duplicates(clip.id for clip in self.clips)
        if dupes:
            raise ValueError(", ".join(f"duplicate clip id {d!r}" for d in dupes))
        return self


def duplicates(ids: Iterable[object]) -> list[object]:
    """The values that occur more than once, in order of their second occurrence."""
    seen: set[object] = set()
    out: list[object] = []
    for value in ids:
        if value in seen and value not in out:
            out.append(value)
        seen.add(value)
    return out


def image_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a clip's image (None: a readable image with a size).

    Reads the header only: the format's magic bytes and the dimensions, never the pixels.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(info.st_mode):
        return "is a directory, not an image file"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a pipe, socket or device?)"
    from PIL import Image

    try:
        with open(path, "rb") as handle, Image.open(handle) as im:
            fmt, (width, height) = im.format, im.size
    except PermissionError as exc:
        return f"cannot be read: {exc.strerror}"
    except Exception:  # noqa: BLE001 - PIL raises many kinds for "not an image"
        return f"is not an image ({', '.join(IMAGE_FORMATS)})"
    if fmt not in IMAGE_FORMATS:
        return f"is a {fmt} image; use {', '.join(IMAGE_FORMATS)}"
    if width < 1 or height < 1:
        return f"has no pixels ({width}x{height})"
    return None


def _raw_clips(raw: object) -> list[object]:
    clips = raw.get("clips") if isinstance(raw, dict) else None
    return clips if isinstance(clips, list) else []


def _valid_clips(raw: object) -> list[tuple[int, Clip]]:
    """The clips of raw batch JSON that are valid on their own (whose images can be checked
    while other clips have errors)."""
    out = []
    for index, item in enumerate(_raw_clips(raw)):
        try:
            out.append((index, Clip.model_validate(item)))
        except ValidationError:
            continue
    return out


def load_batch(path: Path, *, check_images: bool = True) -> Batch:
    """Parse and validate a batch file; image paths become absolute.

    Every problem is reported at once: one :class:`ConfigError` whose details list each.
    """
    path = Path(path)
    raw = load_json_file(path)
    base = path.resolve().parent
    problems: list[str] = []
    batch: Batch | None = None
    try:
        batch = Batch.model_validate(raw)
        valid = list(enumerate(batch.clips))
    except ValidationError as exc:
        problems = validation_problems(exc)
        if not any("duplicate clip id" in p for p in problems):
            ids = [str(c.get("id")) for c in _raw_clips(raw) if isinstance(c, dict)]
            problems += [f"clips: duplicate clip id {d!r}" for d in duplicates(ids)]
        valid = _valid_clips(raw)
    resolved = {index: clip.model_copy(update={"image": (base / clip.image).resolve()}) for index, clip in valid}
    if check_images:
        for index, clip in resolved.items():
            why = image_problem(clip.image)
            if why:
                problems.append(f"clips[{index}] {clip.id!r}: image {clip.image} {why}")
    if problems:
        if len(problems) == 1:
            raise ConfigError(f"{path}: {problems[0]}")
        raise ConfigError(f"{path}: {len(problems)} problems:", details=problems)
    assert batch is not None
    return batch.model_copy(update={"clips": list(resolved.values())})
