"""Reference images where the encoders read them: ``<store root>/inputs/<sha256><suffix>``.

A batch names each image by path (on the operator's machine) and by SHA-256. ``run``
stages the bytes into each encoder host's input store; the encode stage uses the path
when it holds the right bytes on that host (the embedded default: same machine) and the
store's copy otherwise. No host reads another host's disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError
from h3flow.core.files import file_intact
from h3flow.core.fsutil import atomic_path


def input_path(store_root: Path, sha256: str, suffix: str) -> Path:
    return Path(store_root) / "inputs" / f"{sha256}{suffix.lower()}"


def put_input(store_root: Path, source: Path, sha256: str) -> Path:
    """Copy ``source`` into the store under its content address (kept if already intact there)."""
    target = input_path(store_root, sha256, source.suffix)
    if not file_intact(target, sha256):
        with atomic_path(target) as tmp:
            shutil.copyfile(source, tmp)
        if not file_intact(target, sha256):
            target.unlink(missing_ok=True)
            raise ConfigError(f"image {source} changed while it was being staged: run the batch again")
    return target


def image_on_this_host(clip: Clip, store_root: Path, host: str) -> Clip:
    """The clip with an image path that holds its bytes here (the given path, or the staged copy)."""
    if clip.image_sha256 is None or file_intact(clip.image, clip.image_sha256):
        return clip
    staged = input_path(store_root, clip.image_sha256, clip.image.suffix)
    if file_intact(staged, clip.image_sha256):
        return clip.model_copy(update={"image": staged})
    raise ConfigError(
        f"clip {clip.id}: image {clip.image.name} ({clip.image_sha256[:12]}) is not on host {host}: "
        "`h3flow run` stages images to the encoder hosts; run the batch from there or with `h3flow run`"
    )
