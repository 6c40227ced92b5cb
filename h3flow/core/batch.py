"""Batch files: the clips an operator asks for.

A batch is JSON::

    {"name": "demo", "clips": [
        {"id": "c01", "prompt": "slow pan left over a calm lake", "image": "images/lake.png",
         "spec": "sd", "seconds": 5, "seed": 1}
    ]}

Relative image paths are resolved against the batch file's folder. A bad batch is
reported before anything starts (how many problems, the first few, one line each); each
image is checked by reading its header only (a PNG/JPEG/WebP/... with a size, at most
:data:`MAX_IMAGE_PIXELS`), so ``/etc/passwd`` or a folder is refused at once, not 40 s
later in encode.

Hostile text never gets through: numbers are JSON numbers (``"seed": true`` is not seed
1), a prompt is printable text (no NUL, terminal escapes or direction overrides; newlines
and tabs are fine) with something in it, a path holds no control character, and the file
itself is read only if it is a regular file of at most :data:`MAX_BATCH_BYTES`.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from h3flow.core.fsutil import sha256_file
from h3flow.core.jsonio import capped_error, load_json_file, shown, validation_problems
from h3flow.core.specs import SPECS, Spec, frames_for_seconds, get_spec

CLIP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF")  # what the encoders read (through PIL)
MAX_IMAGE_PIXELS = 40_000_000  # an 8K frame (7680x4320, 33 Mpx) fits; it is scaled down to the spec anyway
MAX_BATCH_BYTES = 64 << 20  # ~100k clips with long prompts; a batch file is never larger
# C0 controls but tab and newline, DEL, C1 controls (CSI \x9b starts a terminal escape too),
# the invisible line separators and direction overrides that make text read differently, and
# lone surrogates (JSON's "\ud800": text no UTF-8 encoder takes)
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_printable(value: str, what: str) -> str:
    """``value`` if it holds no unprintable character (tab and newline are fine) and is not blank."""
    if found := UNPRINTABLE.search(value):
        raise ValueError(
            f"{what} holds an unprintable character {found.group()!r} at {found.start()} "
            "(control characters and terminal escapes never reach the model)"
        )
    if not value.strip():
        raise ValueError(f"{what} is blank")
    return value


class Clip(BaseModel):
    """One image-to-video request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    prompt: str = Field(min_length=1, max_length=4000)
    image: Path
    spec: str = "sd"
    seconds: Annotated[float, Strict(), Field(gt=0, le=30, allow_inf_nan=False)] = 5.0
    seed: Annotated[int, Strict(), Field(ge=0, lt=2**63)] = 0
    steps: Annotated[int, Strict(), Field(ge=1, le=100)] = 6
    image_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="the image's content address (set by `run`, not by hand)"
    )

    @field_validator("id")
    @classmethod
    def _id_is_a_safe_name(cls, value: str) -> str:
        if not CLIP_ID.match(value):
            raise ValueError("clip id must be 1-64 letters, digits, '.', '_' or '-' (it names files)")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_is_text(cls, value: str) -> str:
        return check_printable(value, "prompt")

    @field_validator("image", mode="before")
    @classmethod
    def _image_path_is_a_path(cls, value: object) -> object:
        if isinstance(value, str):
            if len(value) > 4096:
                raise ValueError(f"image path is {len(value)} characters long (at most 4096)")
            if found := CONTROL.search(value):
                raise ValueError(f"image path {shown(value)} holds a control character {found.group()!r}")
            try:
                os.fsencode(value)
            except UnicodeEncodeError:
                raise ValueError(f"image path {shown(value)} is not text a file name can hold") from None
            if not value.strip():
                raise ValueError("image path is blank")
        return value

    @field_validator("spec", mode="before")
    @classmethod
    def _spec_is_known(cls, value: object) -> object:
        """Any case (the README's tables say "SD"), stored in lower case."""
        if not isinstance(value, str):
            return value
        if value.lower() not in SPECS:
            raise ValueError(f"unknown spec {shown(value)} (known: {', '.join(SPECS)})")
        return value.lower()

    @property
    def frames(self) -> int:
        return frames_for_seconds(self.seconds)

    @property
    def resolved_spec(self) -> Spec:
        return get_spec(self.spec)


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("batch", min_length=1, max_length=200)
    clips: list[Clip] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name_is_text(cls, value: str) -> str:
        return check_printable(value, "batch name")

    @model_validator(mode="after")
    def _ids_unique(self) -> Batch:
        dupes = duplicates(clip.id for clip in self.clips)
        if dupes:
            raise ValueError(", ".join(f"duplicate clip id {d!r}" for d in dupes[:3]) + _more(len(dupes) - 3))
        return self


def _more(count: int) -> str:
    return f" and {count} more" if count > 0 else ""


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
        with warnings.catch_warnings():  # PIL warns of a "decompression bomb": the size check below says it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open(path, "rb") as handle, Image.open(handle) as im:
                fmt, (width, height) = im.format, im.size
    except PermissionError as exc:
        return f"cannot be read: {exc.strerror}"
    except Image.DecompressionBombError:
        return f"is larger than {MAX_IMAGE_PIXELS // 1_000_000} Mpx: scale it down first"
    except Exception:  # noqa: BLE001 - PIL raises many kinds for "not an image"
        return f"is not an image ({', '.join(IMAGE_FORMATS)})"
    if fmt not in IMAGE_FORMATS:
        return f"is a {fmt} image; use {', '.join(IMAGE_FORMATS)}"
    if width < 1 or height < 1:
        return f"has no pixels ({width}x{height})"
    if width * height > MAX_IMAGE_PIXELS:
        return (
            f"is {width}x{height} ({width * height / 1e6:.0f} Mpx), more than "
            f"{MAX_IMAGE_PIXELS // 1_000_000} Mpx: scale it down first (it is resized to the spec anyway)"
        )
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

    Every problem is found at once, and reported as one :class:`ConfigError`: how many,
    and the first few (:func:`~h3flow.core.jsonio.capped_error`).
    """
    path = Path(path)
    raw = load_json_file(path, MAX_BATCH_BYTES)
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
            problems += [f"clips: duplicate clip id {shown(d)}" for d in duplicates(ids)]
        valid = _valid_clips(raw)
    resolved = {index: clip.model_copy(update={"image": (base / clip.image).resolve()}) for index, clip in valid}
    if check_images:
        verdicts: dict[Path, str | None] = {}  # one header read per image, however many clips use it
        for index, clip in resolved.items():
            if clip.image not in verdicts:
                verdicts[clip.image] = image_problem(clip.image)
            why = verdicts[clip.image]
            if why:
                problems.append(f"clips[{index}] {clip.id!r}: image {clip.image} {why}")
    if problems:
        raise capped_error(str(path), problems)
    assert batch is not None
    return batch.model_copy(update={"clips": list(resolved.values())})


def with_image_hashes(batch: Batch) -> Batch:
    """Each clip names its image by content too, so a host without the file can still find it."""
    hashes: dict[Path, str] = {}
    clips = []
    for clip in batch.clips:
        if clip.image not in hashes:
            hashes[clip.image] = sha256_file(clip.image)
        clips.append(clip.model_copy(update={"image_sha256": hashes[clip.image]}))
    return batch.model_copy(update={"clips": clips})
