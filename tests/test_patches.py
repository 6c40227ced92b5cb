"""The Turing patches and ``h3flow patches check|apply``, with the real GNU patch and git.

Upstream ComfyUI / Raylight are not committed, so each test rebuilds a checkout that holds
exactly a patch's pre-image: the hunks' context and removed lines at their header line
numbers, with distinct filler lines in the gaps (and the post-image the same way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from h3flow.core.errors import H3FlowError
from h3flow.core.paths import PATCHES_DIR
from h3flow.ops import patches
from h3flow.ops.patches import PATCH_FOR_TARGET, FileDiff, State

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch missing: apt-get install patch")

COMFY = PATCHES_DIR / PATCH_FOR_TARGET["comfy"]
RAYLIGHT = PATCHES_DIR / PATCH_FOR_TARGET["raylight"]
COMFY_FILE = "comfy/ldm/minimax/model.py"


def image(diff: FileDiff, side: str) -> str:
    """The file a diff was made from (side 'old') or produces (side 'new'), fillers in the gaps."""
    out: list[str] = []
    old_line = 1  # next line number of the pre-image
    for hunk in diff.hunks:
        gap = hunk.old_start - old_line
        out += [f"# filler {diff.path}:{old_line + k}" for k in range(gap)]
        out += hunk.old_lines if side == "old" else hunk.new_lines
        old_line = hunk.old_start + hunk.old_len
    out += [f"# filler {diff.path}:{old_line + k}" for k in range(3)]
    return "\n".join(out) + "\n"


def build_tree(root: Path, patch_file: Path, side: str = "old") -> dict[str, str]:
    texts = {}
    for diff in patches.load_patch(patch_file):
        target = root / diff.path
        target.parent.mkdir(parents=True, exist_ok=True)
        texts[diff.path] = image(diff, side)
        target.write_text(texts[diff.path])
    return texts


def read_tree(root: Path, paths) -> dict[str, str]:
    return {path: (root / path).read_text() for path in paths}


def h3flow(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "h3flow.cli", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


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


# --------------------------------------------------------------------------- check / apply / reverse
@pytest.mark.parametrize("patch_file", [COMFY, RAYLIGHT], ids=["comfy", "raylight"])
def test_applies_to_its_preimage_then_reports_applied_and_reverses(tmp_path: Path, patch_file: Path) -> None:
    before = build_tree(tmp_path, patch_file, "old")
    expected_after = build_tree(tmp_path / "expected", patch_file, "new")

    # an unpatched tree is "not applied" (GNU patch --batch alone would wrongly call it reversed)
    assert patches.check_patch(patch_file, tmp_path).state is State.NOT_APPLIED

    report = patches.apply_patch(patch_file, tmp_path)
    assert (report.state, report.changed) == (State.APPLIED, True)
    assert read_tree(tmp_path, before) == expected_after
    assert not list(tmp_path.rglob("*.orig")) and not list(tmp_path.rglob("*.rej"))

    assert patches.check_patch(patch_file, tmp_path).state is State.APPLIED
    stamps = {path: (tmp_path / path).stat().st_mtime_ns for path in before}
    again = patches.apply_patch(patch_file, tmp_path)
    assert (again.state, again.changed) == (State.APPLIED, False)
    assert {path: (tmp_path / path).stat().st_mtime_ns for path in before} == stamps

    # the patch also reverses with git's semantics, back to the exact pre-image
    subprocess.run(["git", "apply", "-R", str(patch_file)], cwd=tmp_path, check=True, capture_output=True)
    assert read_tree(tmp_path, before) == before


def test_changed_context_names_the_file_and_hunk(tmp_path: Path) -> None:
    build_tree(tmp_path, COMFY)
    target = tmp_path / COMFY_FILE
    text = target.read_text()
    context = "            pos = t_vals.clamp(0.0, 1.0) * (table.shape[0] - 1)"  # a context line of hunk #2 only
    assert text.count(context) == 1
    target.write_text(text.replace(context, "            pos = t_vals.clamp(0.0, 1.0) * table.shape[0]"))
    drifted = target.read_text()

    report = patches.check_patch(COMFY, tmp_path)
    assert report.state is State.CONFLICT
    assert report.problem.startswith(f"{COMFY_FILE} hunk #2 (@@ -740,7 +741,9 @@) does not match its context")
    with pytest.raises(H3FlowError, match=r"hunk #2"):
        patches.apply_patch(COMFY, tmp_path)
    assert target.read_text() == drifted

    result = h3flow("patches", "apply", "--comfy-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert f"{COMFY_FILE} hunk #2" in lines[0] and lines[0].startswith("error: ")
    assert target.read_text() == drifted


def test_a_conflict_anywhere_changes_nothing(tmp_path: Path) -> None:
    comfy, raylight = tmp_path / "comfy", tmp_path / "raylight"
    comfy_before = build_tree(comfy, COMFY)
    build_tree(raylight, RAYLIGHT)
    attention = raylight / "src/raylight/distributed_modules/attention.py"
    attention.write_text(
        attention.read_text().replace("def make_xfuser_attention(attn_type, sync_ulysses):", "def other():")
    )

    with pytest.raises(H3FlowError, match=r"attention.py hunk #2 .*nothing was changed"):
        patches.apply_trees(comfy, raylight)
    assert read_tree(comfy, comfy_before) == comfy_before


def test_wrong_checkout_names_the_missing_file(tmp_path: Path) -> None:
    report = patches.check_patch(RAYLIGHT, tmp_path)
    assert report.state is State.CONFLICT
    assert (
        report.problem
        == f"src/raylight/comfy_dist/sd.py hunk #1: file not found (is {tmp_path.resolve()} the right checkout?)"
    )


# --------------------------------------------------------------------------- CLI
def test_cli_check_then_apply_then_check(tmp_path: Path) -> None:
    comfy, raylight = tmp_path / "comfy", tmp_path / "raylight"
    build_tree(comfy, COMFY)
    build_tree(raylight, RAYLIGHT)
    dirs = ("--comfy-dir", str(comfy), "--raylight-dir", str(raylight))

    first = h3flow("patches", "check", *dirs)
    assert first.returncode == 1, first.stderr
    assert first.stdout.splitlines() == [
        f"comfy-turing-lerp.patch not applied in {comfy}",
        f"raylight-sm75-ulysses.patch not applied in {raylight}",
    ]

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
