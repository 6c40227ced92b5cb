"""The exact upstream files in ``../shared/upstream`` (beside the checkout), read in place.

They are third-party code (ComfyUI GPL-3.0, Raylight and yunchang Apache-2.0) and never
copied into the project: tests read them where they are, check each file's SHA-256
against ``MANIFEST.tsv`` first, and skip with the reason when the folder is absent.
A test that must change one (a patch applied) copies it into its own tmp tree.
``H3FLOW_UPSTREAM`` points elsewhere (a checkout in a deeper worktree folder).
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from h3flow.ops.comfy_install import ComfyInstall

PROJECT_ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("H3FLOW_UPSTREAM") or PROJECT_ROOT.parent / "shared" / "upstream")
MANIFEST = UPSTREAM / "MANIFEST.tsv"


@dataclass(frozen=True)
class UpstreamFile:
    """One row of MANIFEST.tsv: a byte-exact upstream file at one commit."""

    repo: str  # owner/name
    commit: str  # 40 hex
    path: str  # inside the repository
    sha256: str
    file: str  # relative to UPSTREAM: <repo>@<commit[:8]>/<path>

    @property
    def location(self) -> Path:
        return UPSTREAM / self.file

    def cite(self) -> str:
        return f"{self.repo} {self.path} @ {self.commit}"


def require_upstream() -> None:
    """Skip the calling test when ../shared/upstream is not there, saying where it was looked for."""
    if not MANIFEST.is_file():
        pytest.skip(f"upstream reference files not found at {UPSTREAM} (../shared/upstream beside the checkout)")


@cache
def manifest() -> tuple[UpstreamFile, ...]:
    require_upstream()
    with open(MANIFEST, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return tuple(UpstreamFile(r["repo"], r["commit"], r["path"], r["sha256"], r["file"]) for r in rows)


def upstream(repo: str, path: str, commit: str) -> UpstreamFile:
    """The manifest entry of ``path`` in ``repo`` at ``commit`` (a full or 8-hex prefix), SHA-256 verified."""
    require_upstream()
    found = [f for f in manifest() if f.repo == repo and f.path == path and f.commit.startswith(commit)]
    assert len(found) == 1, f"{repo} {path} @ {commit}: {len(found)} manifest rows"
    entry = found[0]
    digest = hashlib.sha256(entry.location.read_bytes()).hexdigest()
    assert digest == entry.sha256, f"{entry.location} changed: SHA-256 {digest}, manifest says {entry.sha256}"
    return entry


def read_upstream(repo: str, path: str, commit: str) -> str:
    return upstream(repo, path, commit).location.read_text(encoding="utf-8")


def copy_tree(files: list[UpstreamFile], dest: Path) -> Path:
    """Copy upstream files into ``dest`` at their repository paths (a tmp checkout to patch)."""
    for entry in files:
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry.location, target)
    return dest


# --------------------------------------------------------------------------- the test ComfyUI
def require_comfyui_source() -> None:
    """Skip unless the test ComfyUI (0.33, upstream 783545f6) has a source here: the archive in
    ../shared/upstream, or ``$H3FLOW_COMFYUI_SOURCE`` (a ComfyUI folder, an archive, or a git URL)."""
    from h3flow.ops.comfy_install import ARCHIVE_NAME, SOURCE_ENV

    if not os.environ.get(SOURCE_ENV) and not (UPSTREAM / ARCHIVE_NAME).is_file():
        pytest.skip(f"no ComfyUI 0.33 to test against: {UPSTREAM / ARCHIVE_NAME} absent and {SOURCE_ENV} unset")


def comfyui_install() -> ComfyInstall:
    """The test ComfyUI, installed once into the cache (a few minutes the first time); skips without a source."""
    from h3flow.ops.comfy_install import ensure_comfyui

    require_comfyui_source()
    return ensure_comfyui()


def comfyui_archive() -> UpstreamFile:
    """The whole ComfyUI 0.33.0 tree (upstream 783545f6) as stored, SHA-256 verified."""
    require_upstream()
    (entry,) = [f for f in manifest() if f.file == "ComfyUI@783545f6.tar.gz"]
    digest = hashlib.sha256(entry.location.read_bytes()).hexdigest()
    assert digest == entry.sha256, f"{entry.location} changed: SHA-256 {digest}, manifest says {entry.sha256}"
    return entry


def extract_from_archive(entry: UpstreamFile, paths: list[str], dest: Path) -> Path:
    """Copy files of the archived tree (paths inside the repository) into ``dest`` at those paths."""
    import tarfile

    with tarfile.open(entry.location) as tar:
        for path in paths:
            member = tar.extractfile(f"ComfyUI/{path}")
            assert member is not None, path
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(member.read())
    return dest
