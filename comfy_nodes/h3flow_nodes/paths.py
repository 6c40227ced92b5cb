"""Which files the nodes may touch: ComfyUI's own folders and the stores h3flow configures.

Torch-free (h3flow's service code imports :data:`ALLOWED_ENV` from here); ComfyUI's
``folder_paths`` is imported lazily, so this runs outside ComfyUI too.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import H3FlowError


def output_dir() -> Path:
    """ComfyUI's output folder (``output/`` beside the current directory outside ComfyUI)."""
    try:
        import folder_paths

        return Path(folder_paths.get_output_directory())
    except ImportError:
        return Path.cwd() / "output"


ALLOWED_ENV = "H3FLOW_NODES_ALLOWED_DIRS"  # os.pathsep-separated folders; h3flow's `start` sets the host's stores


def allowed_folders() -> list[Path]:
    """Where the nodes may read and write: ComfyUI's output, input and temp folders, and the
    folders in ``$H3FLOW_NODES_ALLOWED_DIRS`` (h3flow's ``start`` puts the host's stores there).

    A ComfyUI started with ``--listen`` takes prompts from anyone who can reach it: without
    this, any client could have a save node overwrite any file the ComfyUI user can write.
    """
    try:
        import folder_paths

        folders = [folder_paths.get_output_directory(), folder_paths.get_input_directory()]
        folders.append(folder_paths.get_temp_directory())
    except ImportError:  # outside ComfyUI (h3flow's tests): the output folder output_dir() names
        folders = [str(output_dir())]
    return [Path(folder).expanduser().resolve() for folder in [*folders, *_configured_folders()]]


def _configured_folders() -> list[str]:
    return [part.strip() for part in os.environ.get(ALLOWED_ENV, "").split(os.pathsep) if part.strip()]


def resolve_path(path: str) -> Path:
    """A path a node may use: relative ones under ComfyUI's output folder (no escaping it),
    absolute ones inside :func:`allowed_folders`, symlinks resolved first."""
    text = path.strip()
    if not text:
        raise H3FlowError("a file path is required")
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        base = output_dir().resolve()
        resolved = (base / candidate).resolve()
        if base not in resolved.parents:
            raise H3FlowError(f"relative path {text!r} leaves ComfyUI's output folder")
        return resolved
    resolved = candidate.resolve()
    folders = allowed_folders()
    if not any(folder in resolved.parents for folder in folders):
        raise H3FlowError(
            f"path {text!r} is outside the folders the h3flow nodes may use (ComfyUI's output, input and temp "
            f"folders, and ${ALLOWED_ENV}: {os.pathsep.join(_configured_folders()) or 'not set'})"
        )
    return resolved
