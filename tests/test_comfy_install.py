"""The test ComfyUI's installer without installing: where the tree comes from, its cache key,
the requirements it installs, and unpacking an archive (fast tier; the install itself runs
in the comfy tier)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.ops import comfy_install
from h3flow.ops.comfy_install import (
    ARCHIVE_NAME,
    COMFYUI_COMMIT,
    COMFYUI_GIT,
    SOURCE_ENV,
    TORCH,
    comfyui_source,
    requirements_for,
)


def make_tree(root: Path) -> Path:
    (root / "comfy").mkdir(parents=True)
    (root / "main.py").write_text("print('comfy')\n")
    (root / "comfy" / "sd.py").write_text("x = 1\n")
    return root


def make_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_tree_comes_from_the_setting_then_the_shared_archive_then_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("H3FLOW_UPSTREAM", str(shared))
    git = comfyui_source()
    assert (git.kind, git.location, git.key) == ("git", COMFYUI_GIT, f"comfyui-{COMFYUI_COMMIT[:8]}")
    (shared / ARCHIVE_NAME).write_bytes(b"not read until installing")
    archive = comfyui_source()
    assert (archive.kind, archive.key) == ("archive", f"comfyui-{COMFYUI_COMMIT[:8]}")  # the same commit, one cache

    tree = make_tree(tmp_path / "mine")
    monkeypatch.setenv(SOURCE_ENV, str(tree))
    first = comfyui_source()
    assert first.kind == "tree" and first.key.startswith("comfyui-tree-") and first.key != archive.key
    (tree / "comfy" / "sd.py").write_text("x = 2  # edited\n")
    assert comfyui_source().key != first.key  # an edited tree is another install

    monkeypatch.setenv(SOURCE_ENV, "https://example.invalid/ComfyUI.git")
    assert comfyui_source().kind == "git" and comfyui_source().key == f"comfyui-{COMFYUI_COMMIT[:8]}"
    other = make_archive(tmp_path / "other.tar.gz", {"ComfyUI/main.py": b""})
    monkeypatch.setenv(SOURCE_ENV, str(other))
    assert comfyui_source().kind == "archive" and comfyui_source().key.startswith("comfyui-archive-")


def test_a_bad_source_setting_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=rf"^{SOURCE_ENV}=.*empty: not a ComfyUI folder \(no main.py and comfy/\)$"):
        comfyui_source()
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path / "nothing-here"))
    with pytest.raises(ConfigError, match=r"neither a ComfyUI folder, a \.tar\.gz of one, nor a git URL$"):
        comfyui_source()


def test_requirements_pin_cpu_torch_and_leave_out_torchaudio_and_the_optional_packages(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        "comfyui-frontend-package==1.49.6\ncomfyui-workflow-templates==0.11.44\ncomfyui-embedded-docs==0.5.10\n"
        "torch\ntorchsde\ntorchvision\ntorchaudio\nnumpy>=1.25.0\n\n#non essential dependencies:\nkornia>=0.7.1\n"
        "pydantic~=2.0\n"
    )
    assert requirements_for(tmp_path) == [
        "comfyui-frontend-package==1.49.6", TORCH, "torchsde", "torchvision", "numpy>=1.25.0", "kornia>=0.7.1",
        "pydantic~=2.0",
    ]  # fmt: skip


def test_an_archive_unpacks_without_its_top_folder_and_nothing_outside(tmp_path: Path) -> None:
    good = make_archive(
        tmp_path / "good.tar.gz",
        {"ComfyUI/main.py": b"m", "ComfyUI/comfy/sd.py": b"s", "ComfyUI/extra_model_paths.yaml": b"elsewhere"},
    )
    dest = tmp_path / "install" / "ComfyUI"
    dest.parent.mkdir()
    comfy_install._extract_archive(good, dest)
    assert (dest / "main.py").read_bytes() == b"m" and (dest / "comfy" / "sd.py").read_bytes() == b"s"
    assert not (dest / "extra_model_paths.yaml").exists()  # it would point ComfyUI at another folder
    assert sorted(p.name for p in dest.parent.iterdir()) == ["ComfyUI"]  # no staging left behind

    evil = make_archive(tmp_path / "evil.tar.gz", {"ComfyUI/main.py": b"m", "ComfyUI/../../escaped": b"x"})
    (tmp_path / "install2").mkdir()
    with pytest.raises(H3FlowError, match=r"evil.tar.gz: cannot unpack it"):
        comfy_install._extract_archive(evil, tmp_path / "install2" / "ComfyUI")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "install2" / "ComfyUI").exists()
    lone = make_archive(tmp_path / "lone.tar.gz", {"a/main.py": b"", "b/main.py": b""})
    with pytest.raises(H3FlowError, match="expected one top folder, found 2"):
        comfy_install._extract_archive(lone, tmp_path / "install" / "other")
