"""The Turing patches and ``h3flow patches check|apply``, with the real GNU patch and git,
on the real upstream files.

The pre-images are the byte-exact upstream files in ``../shared/upstream`` at the commits
patches/README.md pins (SHA-256 checked against its MANIFEST.tsv). Each test copies them
into its own tmp checkout, never writing there, and skips with the reason when that
folder is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from upstream import UpstreamFile, copy_tree, upstream

from h3flow.core.errors import H3FlowError
from h3flow.core.paths import PATCHES_DIR
from h3flow.ops import patches
from h3flow.ops.patches import PATCH_FOR_TARGET, State

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch missing: apt-get install patch")

COMFY = PATCHES_DIR / PATCH_FOR_TARGET["comfy"]
RAYLIGHT = PATCHES_DIR / PATCH_FOR_TARGET["raylight"]
COMFY_FILE = "comfy/ldm/minimax/model.py"
ATTENTION_FILE = "src/raylight/distributed_modules/attention.py"


def pre_images(patch_file: Path) -> list[UpstreamFile]:
    """The real files a patch was made against, at the commits patches/README.md pins."""
    if patch_file == COMFY:
        return [upstream("Comfy-Org/ComfyUI", COMFY_FILE, "01a56b76")]
    return [
        upstream("komikndr/raylight", "src/raylight/comfy_dist/sd.py", "612d8c9f"),
        upstream("komikndr/raylight", "src/raylight/diffusion_models/minimax/xdit_context_parallel.py", "612d8c9f"),
        upstream("komikndr/raylight", ATTENTION_FILE, "ef4e42f1"),  # not stored at 612d8c9f (see the README)
    ]


def checkout(root: Path, patch_file: Path) -> dict[str, bytes]:
    """A tmp checkout holding a patch's real pre-image; returns its bytes by path."""
    files = pre_images(patch_file)
    copy_tree(files, root)
    return {f.path: (root / f.path).read_bytes() for f in files}


def read_tree(root: Path, paths) -> dict[str, bytes]:
    return {path: (root / path).read_bytes() for path in paths}


def h3flow(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "h3flow.cli", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


# --------------------------------------------------------------------------- parsing
def test_comfy_patch_parses_to_its_two_hunks() -> None:
    (diff,) = patches.load_patch(COMFY)
    assert diff.path == COMFY_FILE
    assert [h.header for h in diff.hunks] == ["@@ -179,8 +179,9 @@", "@@ -740,7 +741,9 @@"]
    added = [line for h in diff.hunks for line in h.lines if line.startswith("+")]
    assert any("cast_to(self.adaln_t_table, dtype=torch.float32, device=device)" in line for line in added)
    assert any("cast_to(self.q_norm.weight, dtype=q.dtype, device=x.device)" in line for line in added)


def test_raylight_patch_parses_to_three_files() -> None:
    diffs = {d.path: d for d in patches.load_patch(RAYLIGHT)}
    assert sorted(diffs) == [
        "src/raylight/comfy_dist/sd.py",
        "src/raylight/diffusion_models/minimax/xdit_context_parallel.py",
        "src/raylight/distributed_modules/attention.py",
    ]
    assert [len(d.hunks) for d in diffs.values()] == [1, 2, 2]
    attention = "".join(line for h in diffs["src/raylight/distributed_modules/attention.py"].hunks for line in h.lines)
    assert '+_SM75_FALLBACK = "TORCH_EFFICIENT"' in attention
    assert "+    attn_type = sm75_safe_attn_type(attn_type)" in attention


@pytest.mark.parametrize("patch_file", [COMFY, RAYLIGHT], ids=["comfy", "raylight"])
def test_hunks_carry_normal_three_line_context(patch_file: Path) -> None:
    for diff in patches.load_patch(patch_file):
        for hunk in diff.hunks:
            prefixes = "".join(line[0] for line in hunk.lines)
            assert prefixes.startswith("   ") and prefixes.endswith("   "), (diff.path, hunk.number)
            assert len(prefixes) - len(prefixes.strip(" ")) == 6, (diff.path, hunk.number)


def test_parser_names_file_and_hunk_of_a_bad_header() -> None:
    text = COMFY.read_text().replace("@@ -740,7 +741,9 @@", "@@ -740,8 +741,9 @@")
    with pytest.raises(
        H3FlowError, match=r"comfy/ldm/minimax/model.py hunk #2 header says -8 \+9 lines, its body has -7 \+9"
    ):
        patches.parse_patch(text, "bad.patch")
    shifted = COMFY.read_text().replace("@@ -740,7 +741,9 @@", "@@ -740,7 +740,9 @@")
    with pytest.raises(H3FlowError, match=r"hunk #2 @@ -740,7 \+740,9 @@ should start at \+741"):
        patches.parse_patch(shifted, "bad.patch")
    with pytest.raises(H3FlowError, match="no file diffs"):
        patches.parse_patch("just words\n", "empty.patch")


# --------------------------------------------------------------------------- the real pre-images
@pytest.mark.parametrize("patch_file", [COMFY, RAYLIGHT], ids=["comfy", "raylight"])
def test_every_hunk_sits_exactly_at_its_header_in_the_real_file(tmp_path: Path, patch_file: Path) -> None:
    """The pinned commits are the ones the hunks were made from: no offset, no fuzz, old lines verbatim."""
    before = checkout(tmp_path, patch_file)
    for diff in patches.load_patch(patch_file):
        lines = before[diff.path].decode().splitlines()
        for hunk in diff.hunks:
            at = hunk.old_start - 1
            assert lines[at : at + hunk.old_len] == hunk.old_lines, (diff.path, hunk.number)
    assert git("apply", "--check", str(patch_file), cwd=tmp_path).returncode == 0
    dry = subprocess.run(
        ["patch", "-p1", "--dry-run", "--fuzz=0", "-i", str(patch_file)], cwd=tmp_path, capture_output=True, text=True
    )
    assert dry.returncode == 0 and "offset" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout


@pytest.mark.parametrize("patch_file", [COMFY, RAYLIGHT], ids=["comfy", "raylight"])
def test_applies_to_the_real_files_then_reports_applied_and_reverses(tmp_path: Path, patch_file: Path) -> None:
    before = checkout(tmp_path, patch_file)

    # an unpatched tree is "not applied" (GNU patch --batch alone would wrongly call it reversed)
    assert patches.check_patch(patch_file, tmp_path).state is State.NOT_APPLIED

    report = patches.apply_patch(patch_file, tmp_path)
    assert (report.state, report.changed) == (State.APPLIED, True)
    after = read_tree(tmp_path, before)
    for diff in patches.load_patch(patch_file):  # the post-image: every hunk's new lines at its new start
        lines = after[diff.path].decode().splitlines()
        for hunk in diff.hunks:
            at = hunk.new_start - 1
            assert lines[at : at + hunk.new_len] == hunk.new_lines, (diff.path, hunk.number)
        grown = sum(h.new_len - h.old_len for h in diff.hunks)
        assert len(lines) == len(before[diff.path].decode().splitlines()) + grown
    assert not list(tmp_path.rglob("*.orig")) and not list(tmp_path.rglob("*.rej"))

    assert patches.check_patch(patch_file, tmp_path).state is State.APPLIED
    stamps = {path: (tmp_path / path).stat().st_mtime_ns for path in before}
    again = patches.apply_patch(patch_file, tmp_path)
    assert (again.state, again.changed) == (State.APPLIED, False)
    assert {path: (tmp_path / path).stat().st_mtime_ns for path in before} == stamps

    # the patch also reverses with git's semantics, back to the exact upstream bytes
    assert git("apply", "-R", str(patch_file), cwd=tmp_path).returncode == 0
    assert read_tree(tmp_path, before) == before
    assert patches.check_patch(patch_file, tmp_path).state is State.NOT_APPLIED


def test_changed_context_names_the_file_and_hunk(tmp_path: Path) -> None:
    checkout(tmp_path, COMFY)
    target = tmp_path / COMFY_FILE
    text = target.read_text()
    context = "            pos = t_vals.clamp(0.0, 1.0) * (table.shape[0] - 1)"  # a context line of hunk #2 only
    assert text.count(context) == 1
    target.write_text(text.replace(context, "            pos = t_vals.clamp(0.0, 1.0) * table.shape[0]"))
    drifted = target.read_bytes()

    report = patches.check_patch(COMFY, tmp_path)
    assert report.state is State.CONFLICT
    assert report.problem.startswith(f"{COMFY_FILE} hunk #2 (@@ -740,7 +741,9 @@) does not match its context")
    with pytest.raises(H3FlowError, match=r"hunk #2"):
        patches.apply_patch(COMFY, tmp_path)
    assert target.read_bytes() == drifted

    result = h3flow("patches", "apply", "--comfy-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert f"{COMFY_FILE} hunk #2" in lines[0] and lines[0].startswith("error: ")
    assert target.read_bytes() == drifted


def test_a_partly_patched_file_is_a_conflict_not_applied(tmp_path: Path) -> None:
    """Hunk #1 applied by hand, hunk #2 not: neither direction fits, and the report says so."""
    checkout(tmp_path, COMFY)
    target = tmp_path / COMFY_FILE
    (diff,) = patches.load_patch(COMFY)
    first = diff.hunks[0]
    text = target.read_text()
    old, new = "\n".join(first.old_lines), "\n".join(first.new_lines)
    assert text.count(old) == 1
    target.write_text(text.replace(old, new))
    report = patches.check_patch(COMFY, tmp_path)
    assert report.state is State.CONFLICT
    assert report.problem == f"{COMFY_FILE} is partly patched: hunk #1 applied, hunk #2 not"


def test_a_conflict_anywhere_changes_nothing(tmp_path: Path) -> None:
    comfy, raylight = tmp_path / "comfy", tmp_path / "raylight"
    comfy_before = checkout(comfy, COMFY)
    checkout(raylight, RAYLIGHT)
    attention = raylight / ATTENTION_FILE
    text = attention.read_text()
    assert text.count("def make_xfuser_attention(attn_type, sync_ulysses):") == 1
    attention.write_text(text.replace("def make_xfuser_attention(attn_type, sync_ulysses):", "def other():"))

    with pytest.raises(H3FlowError, match=r"attention.py hunk #2 .*nothing was changed"):
        patches.apply_trees(comfy, raylight)
    assert read_tree(comfy, comfy_before) == comfy_before


def test_wrong_checkout_names_the_missing_file(tmp_path: Path) -> None:
    checkout(tmp_path, COMFY)  # a ComfyUI file where a Raylight checkout is expected
    report = patches.check_patch(RAYLIGHT, tmp_path)
    assert report.state is State.CONFLICT
    assert (
        report.problem
        == f"src/raylight/comfy_dist/sd.py hunk #1: file not found (is {tmp_path.resolve()} the right checkout?)"
    )


# --------------------------------------------------------------------------- CLI
def test_cli_check_then_apply_then_check(tmp_path: Path) -> None:
    comfy, raylight = tmp_path / "comfy", tmp_path / "raylight"
    comfy_before = checkout(comfy, COMFY)
    raylight_before = checkout(raylight, RAYLIGHT)
    dirs = ("--comfy-dir", str(comfy), "--raylight-dir", str(raylight))

    first = h3flow("patches", "check", *dirs)
    assert first.returncode == 1, first.stderr
    assert first.stdout.splitlines() == [
        f"comfy-turing-lerp.patch not applied in {comfy}",
        f"raylight-sm75-ulysses.patch not applied in {raylight}",
    ]
    assert read_tree(comfy, comfy_before) == comfy_before  # check changes nothing
    assert read_tree(raylight, raylight_before) == raylight_before

    applied = h3flow("patches", "apply", *dirs)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines() == [
        f"comfy-turing-lerp.patch applied now in {comfy}",
        f"raylight-sm75-ulysses.patch applied now in {raylight}",
    ]

    again = h3flow("patches", "apply", "--raylight-dir", str(raylight))
    assert again.stdout.splitlines() == [f"raylight-sm75-ulysses.patch already applied, left alone in {raylight}"]

    checked = h3flow("patches", "check", *dirs)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines() == [
        f"comfy-turing-lerp.patch applied in {comfy}",
        f"raylight-sm75-ulysses.patch applied in {raylight}",
    ]

    # a drifted Raylight checkout: exit 2 and the file + hunk, the applied ComfyUI still reported
    attention = raylight / ATTENTION_FILE
    patched_line = "    attn_type = sm75_safe_attn_type(attn_type)\n"  # added by hunk #2 only
    assert attention.read_text().count(patched_line) == 1
    attention.write_text(attention.read_text().replace(patched_line, "    attn_type = str(attn_type)\n"))
    conflict = h3flow("patches", "check", *dirs)
    assert conflict.returncode == 2, conflict.stdout + conflict.stderr
    assert f"comfy-turing-lerp.patch applied in {comfy}" in conflict.stdout
    (error,) = conflict.stderr.strip().splitlines()
    assert error == (  # only the drifted hunk: the fully patched files and hunk #1 are not blamed
        f"error: raylight-sm75-ulysses.patch does not apply in {raylight}: "
        f"{ATTENTION_FILE} hunk #2 (@@ -34,6 +47,7 @@) does not match its context"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--comfy-dir", "/nonexistent/ComfyUI"), "error: --comfy-dir /nonexistent/ComfyUI: not a directory"),
        ((), "error: give --comfy-dir and/or --raylight-dir (or --host NAME)"),
        (
            ("--host", "xtx", "--config", "/nonexistent/local.json"),
            "error: /nonexistent/local.json: no such file (run `h3flow config-adapt` first)",
        ),
    ],
    ids=["missing-dir", "no-dir", "host"],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = h3flow("patches", "check", *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert result.stdout == ""


# --------------------------------------------------------------------------- ComfyUI 0.33.0 (upstream 783545f6)
@pytest.mark.upstream_h3
def test_the_comfy_patch_also_fits_comfyui_0_33(tmp_path: Path) -> None:
    """783545f6's model.py has every line the patch touches, and its context, unchanged; the code moved
    (hunk #1 five lines up, hunk #2 57), which GNU patch follows without fuzz. One patch serves both."""
    from upstream import comfyui_archive, extract_from_archive

    extract_from_archive(comfyui_archive(), [COMFY_FILE], tmp_path)
    before = (tmp_path / COMFY_FILE).read_bytes()
    lines = before.decode().splitlines()
    (diff,) = patches.load_patch(COMFY)
    offsets = {}
    for hunk in diff.hunks:
        found = [i for i in range(len(lines)) if lines[i : i + hunk.old_len] == hunk.old_lines]
        assert len(found) == 1, hunk.number  # the whole old side, context included, once
        offsets[hunk.number] = found[0] + 1 - hunk.old_start
    assert offsets == {1: -5, 2: -57}
    dry = subprocess.run(
        ["patch", "-p1", "--dry-run", "--fuzz=0", "-i", str(COMFY)], cwd=tmp_path, capture_output=True, text=True
    )
    assert dry.returncode == 0 and "fuzz" not in dry.stdout
    assert "Hunk #1 succeeded at 174 (offset -5 lines)" in dry.stdout
    assert "Hunk #2 succeeded at 684 (offset -57 lines)" in dry.stdout
    assert patches.check_patch(COMFY, tmp_path).state is State.NOT_APPLIED
    assert patches.apply_patch(COMFY, tmp_path).changed
    assert patches.check_patch(COMFY, tmp_path).state is State.APPLIED
    after = (tmp_path / COMFY_FILE).read_text()
    assert "cast_to(self.adaln_t_table, dtype=torch.float32, device=device)" in after
    assert after.count("cast_to(self.q_norm.weight, dtype=q.dtype, device=x.device)") == 1
    assert git("apply", "-R", "-C3", str(COMFY), cwd=tmp_path).returncode == 0  # git too, at the moved lines
    assert (tmp_path / COMFY_FILE).read_bytes() == before
