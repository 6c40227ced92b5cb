"""Check and apply the Turing patches (``patches/*.patch``) to ComfyUI and Raylight checkouts.

Why GNU ``patch``: it is what an operator would run by hand, works on any checkout (git or
not) and tolerates line offsets from later upstream commits. It always runs with
``--batch --forward --fuzz=0``: ``--batch`` alone silently flips direction (a reverse check
on an unpatched tree "succeeds" by ignoring ``-R``), and fuzz would let a hunk land on
context that has changed. A patch counts as *applied* when it reverses cleanly, as *not
applied* when it applies cleanly, and otherwise names the file and hunk that do not fit.
Every real apply is preceded by dry runs of every patch, so nothing is half-applied.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from h3flow.core.errors import H3FlowError
from h3flow.core.paths import PATCHES_DIR

# which checkout each patch belongs to, keyed by the CLI option that names it
PATCH_FOR_TARGET = {"comfy": "comfy-turing-lerp.patch", "raylight": "raylight-sm75-ulysses.patch"}
PATCH_TOOL_PACKAGE = "patch"  # the Debian package that provides GNU patch

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` block: its header numbers and its body lines (each with its prefix)."""

    number: int  # 1-based within its file, as GNU patch counts them
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str
    lines: tuple[str, ...]

    @property
    def old_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"


@dataclass(frozen=True)
class FileDiff:
    """The hunks for one file; ``path`` is relative to the checkout root (``-p1``)."""

    path: str
    hunks: tuple[Hunk, ...]


def _strip_path(raw: str) -> str:
    name = raw.split("\t", 1)[0].strip()
    return name.split("/", 1)[1] if name.startswith(("a/", "b/")) else name


def parse_patch(text: str, name: str = "patch") -> tuple[FileDiff, ...]:
    """Parse a unified diff, checking every hunk's line counts and header arithmetic."""
    lines = text.splitlines()
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old, new = _strip_path(lines[i][4:]), _strip_path(lines[i + 1][4:])
        path = old if new == "/dev/null" else new
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (match := _HUNK_HEADER.match(lines[i])):
            old_start, new_start = int(match[1]), int(match[3])
            old_len = int(match[2]) if match[2] is not None else 1
            new_len = int(match[4]) if match[4] is not None else 1
            i += 1
            body: list[str] = []
            olds = news = 0
            while i < len(lines) and (olds < old_len or news < new_len):
                line = lines[i] or " "  # an empty line is context whose trailing blank was stripped
                if line[0] not in " -+\\":
                    break
                i += 1
                if line[0] == "\\":  # "\ No newline at end of file"
                    continue
                body.append(line)
                olds += line[0] in " -"
                news += line[0] in " +"
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            number = len(hunks) + 1
            if (olds, news) != (old_len, new_len):
                raise H3FlowError(
                    f"{name}: {path} hunk #{number} header says -{old_len} +{new_len} lines, its body has -{olds} +{news}"
                )
            hunks.append(Hunk(number, old_start, old_len, new_start, new_len, match[5], tuple(body)))
        if not hunks:
            raise H3FlowError(f"{name}: {path} has a file header but no hunks")
        _check_header_arithmetic(name, path, hunks)
        files.append(FileDiff(path, tuple(hunks)))
    if not files:
        raise H3FlowError(f"{name}: no file diffs found (is it a unified diff?)")
    return tuple(files)


def _check_header_arithmetic(name: str, path: str, hunks: list[Hunk]) -> None:
    """Hunks must be ordered, not overlap, and their new starts must follow the earlier hunks' growth."""
    shift = 0
    previous_end = 0
    for hunk in hunks:
        if hunk.old_start <= previous_end:
            raise H3FlowError(f"{name}: {path} hunk #{hunk.number} overlaps or precedes the hunk before it")
        if hunk.old_len and hunk.new_len and hunk.new_start != hunk.old_start + shift:
            raise H3FlowError(
                f"{name}: {path} hunk #{hunk.number} {hunk.header} should start at +{hunk.old_start + shift}"
            )
        shift += hunk.new_len - hunk.old_len
        previous_end = hunk.old_start + hunk.old_len - 1


def load_patch(path: Path) -> tuple[FileDiff, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise H3FlowError(f"cannot read patch {path}: {exc.strerror}") from None
    return parse_patch(text, path.name)


class State(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"
    CONFLICT = "does not apply"


@dataclass(frozen=True)
class PatchReport:
    """Where one patch stands in one checkout; ``problem`` names the file and hunk on a conflict."""

    patch: str
    tree: Path
    state: State
    problem: str = ""
    changed: bool = False  # True when this call applied it

    def line(self) -> str:
        text = f"{self.patch} {self.state.value} in {self.tree}"
        return f"{text}: {self.problem}" if self.problem else text


def patch_tool() -> str:
    tool = shutil.which("patch")
    if tool is None:
        raise H3FlowError(
            f"GNU patch is not installed: apt-get install {PATCH_TOOL_PACKAGE} (Debian package '{PATCH_TOOL_PACKAGE}')"
        )
    return tool


def _run_patch(
    patch_file: Path, tree: Path, *, reverse: bool = False, dry_run: bool = True
) -> subprocess.CompletedProcess[str]:
    args = [patch_tool(), "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-"]
    args += ["-R"] if reverse else []
    args += ["--dry-run"] if dry_run else []
    args += ["-d", str(tree), "-i", str(patch_file)]
    env = {**os.environ, "LC_ALL": "C"}  # the messages parsed below are the C locale's
    try:
        return subprocess.run(
            args, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120, check=False
        )
    except subprocess.TimeoutExpired:
        raise H3FlowError(f"patch timed out on {patch_file.name} in {tree}") from None


def _describe_failure(output: str, files: Iterable[FileDiff]) -> str:
    """Turn GNU patch's dry-run output into 'file hunk #N (@@ ... @@) ...' statements."""
    hunks = {(f.path, h.number): h for f in files for h in f.hunks}
    problems: list[str] = []
    current = "?"
    for line in output.splitlines():
        if match := re.match(r"(?:checking|patching) file (.+)$", line):
            current = match[1].strip("'\"")
        elif match := re.match(r"Hunk #(\d+) FAILED at (\d+)", line):
            number = int(match[1])
            hunk = hunks.get((current, number))
            header = f" ({hunk.header})" if hunk else ""
            problems.append(f"{current} hunk #{number}{header} does not match its context (tried at line {match[2]})")
        elif line.startswith("Reversed (or previously applied) patch detected"):
            problems.append(f"{current} hunk #1 is already applied but later hunks are not (a partly patched file)")
    if problems:
        return "; ".join(problems)
    first = next((line for line in output.splitlines() if line.strip()), "patch failed")
    return first.strip()


def _require_dir(tree: Path, option: str) -> Path:
    if not tree.is_dir():
        raise H3FlowError(f"{option} {tree}: not a directory")
    return tree.resolve()


def check_patch(patch_file: Path, tree: Path) -> PatchReport:
    """Reverse-check, then forward-check, one patch against one checkout; changes nothing."""
    tree = _require_dir(tree, "checkout")
    files = load_patch(patch_file)
    missing = [f.path for f in files if not (tree / f.path).is_file()]
    if missing:
        problem = f"{missing[0]} hunk #1: file not found (is {tree} the right checkout?)"
        return PatchReport(patch_file.name, tree, State.CONFLICT, problem)
    if _run_patch(patch_file, tree, reverse=True).returncode == 0:
        return PatchReport(patch_file.name, tree, State.APPLIED)
    forward = _run_patch(patch_file, tree)
    if forward.returncode == 0:
        return PatchReport(patch_file.name, tree, State.NOT_APPLIED)
    problem = _describe_hunks(files, tree) or _describe_failure(forward.stdout + forward.stderr, files)
    return PatchReport(patch_file.name, tree, State.CONFLICT, problem)


def _one_hunk(diff: FileDiff, hunk: Hunk) -> str:
    return (
        f"--- a/{diff.path}\n+++ b/{diff.path}\n@@ -{hunk.old_start},{hunk.old_len} +{hunk.new_start},{hunk.new_len} @@\n"
        + "".join(line + "\n" for line in hunk.lines)
    )


def _describe_hunks(files: Iterable[FileDiff], tree: Path) -> str:
    """Why a patch neither applies nor reverses, hunk by hunk: each hunk dry-run on its own both ways.

    A whole-patch dry run stops at the first file that does not fit and then blames hunks
    that are merely applied already; this names the hunks whose context changed, and the
    files left half patched.
    """
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="h3flow-hunk-") as tmp:
        for diff in files:
            applied: list[int] = []
            pending: list[int] = []
            for hunk in diff.hunks:
                single = Path(tmp) / f"{len(problems)}-{hunk.number}.patch"
                single.write_text(_one_hunk(diff, hunk), encoding="utf-8")
                if _run_patch(single, tree, reverse=True).returncode == 0:
                    applied.append(hunk.number)
                elif _run_patch(single, tree).returncode == 0:
                    pending.append(hunk.number)
                else:
                    problems.append(f"{diff.path} hunk #{hunk.number} ({hunk.header}) does not match its context")
            if applied and pending:
                done = ", ".join(f"#{n}" for n in applied)
                left = ", ".join(f"#{n}" for n in pending)
                problems.append(f"{diff.path} is partly patched: hunk {done} applied, hunk {left} not")
    return "; ".join(problems)


def _apply_checked(report: PatchReport, patch_file: Path) -> PatchReport:
    if report.state is not State.NOT_APPLIED:
        return report
    done = _run_patch(patch_file, report.tree, dry_run=False)
    if done.returncode != 0:
        why = _describe_failure(done.stdout + done.stderr, load_patch(patch_file))
        raise H3FlowError(f"{patch_file.name} failed in {report.tree} after a clean dry run: {why}")
    after = check_patch(patch_file, report.tree)
    if after.state is not State.APPLIED:
        raise H3FlowError(f"{patch_file.name} was applied in {report.tree} but does not reverse-check: {after.problem}")
    return PatchReport(patch_file.name, report.tree, State.APPLIED, changed=True)


def apply_patch(patch_file: Path, tree: Path) -> PatchReport:
    """Apply one patch after a clean dry run; an already-applied patch is left alone."""
    report = check_patch(patch_file, tree)
    if report.state is State.CONFLICT:
        raise H3FlowError(report.line())
    return _apply_checked(report, patch_file)


def _targets(comfy_dir: Path | None, raylight_dir: Path | None, patches_dir: Path) -> list[tuple[Path, Path]]:
    chosen = {"comfy": comfy_dir, "raylight": raylight_dir}
    if all(tree is None for tree in chosen.values()):
        raise H3FlowError("give --comfy-dir and/or --raylight-dir (or --host NAME)")
    pairs = []
    for target, tree in chosen.items():
        if tree is not None:
            pairs.append((patches_dir / PATCH_FOR_TARGET[target], _require_dir(tree, f"--{target}-dir")))
    return pairs


def check_trees(
    comfy_dir: Path | None, raylight_dir: Path | None, patches_dir: Path = PATCHES_DIR
) -> list[PatchReport]:
    """Where each patch stands in the given checkouts (ComfyUI, Raylight or both)."""
    return [check_patch(patch, tree) for patch, tree in _targets(comfy_dir, raylight_dir, patches_dir)]


def apply_trees(
    comfy_dir: Path | None, raylight_dir: Path | None, patches_dir: Path = PATCHES_DIR
) -> list[PatchReport]:
    """Dry-run every patch first; apply only if none conflicts, skipping those already applied."""
    pairs = _targets(comfy_dir, raylight_dir, patches_dir)
    reports = [check_patch(patch, tree) for patch, tree in pairs]
    conflicts = [r for r in reports if r.state is State.CONFLICT]
    if conflicts:
        raise H3FlowError("; ".join(r.line() for r in conflicts) + " (nothing was changed)")
    return [_apply_checked(report, patch) for report, (patch, _) in zip(reports, pairs, strict=False)]


def agent_request(
    action: str, comfy_dir: str | None, raylight_dir: str | None, patches_dir: Path = PATCHES_DIR
) -> dict[str, object]:
    """What the h3flow agent on a host needs to check / apply: the dirs there and this checkout's patch texts."""
    texts = {name: (patches_dir / name).read_text(encoding="utf-8") for name in PATCH_FOR_TARGET.values()}
    return {"action": action, "comfy_dir": comfy_dir, "raylight_dir": raylight_dir, "patches": texts}


def reports_from(answer: dict[str, Any]) -> list[PatchReport]:
    return [
        PatchReport(r["patch"], Path(r["tree"]), State(r["state"]), r["problem"], r["changed"])
        for r in answer["reports"]
    ]
