"""The command line as an operator meets it: help, --version, finding the config, tables
that fit 80 columns, --json twins, errors printed verbatim, bad batches reported whole.

No Prefect server here: a run is a manifest written the way the dispatcher writes it
(tests/test_cli_prefect.py asks a real server for links, logs and cancellation).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.config.adapt import adapt, local_host_map, render
from h3flow.config.models import load_local_config
from h3flow.core.batch import Clip
from h3flow.core.fsutil import atomic_write_json, sha256_bytes
from h3flow.pipeline.manifest import new_manifest, save_manifest
from h3flow.pipeline.results import StageResult

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "examples" / "images" / "landscape.png"
H3FLOW = str(Path(sys.executable).with_name("h3flow"))
runner = CliRunner()


def make_config(folder: Path) -> Path:
    """An embedded-default local.json in ``folder`` (nothing started)."""
    folder.mkdir(parents=True, exist_ok=True)
    hm = local_host_map(folder, base_port=21400)
    path = folder / "local.json"
    atomic_write_json(path, render(adapt(hm, work_dir=str(folder.resolve()))), private=True)
    return path


LONG_IDS = ["lake-sunrise-wide-0001", "lake-sunrise-wide-0002", "mountain-pass-at-dusk-with-fog-03"]


def make_run(config_path: Path, run_id: str = "demo-20250101-000000-abcd", clips: list[str] = LONG_IDS) -> str:
    """A finished run as the dispatcher records it: two delivered clips, one failed."""
    config = load_local_config(config_path)
    outputs = Path(config.hosts["host-b"].storage.outputs) / run_id
    manifest = new_manifest(
        run_id,
        "demo",
        [Clip(id=c, prompt="slow pan", image=IMAGE, spec="tiny", seconds=1, seed=i) for i, c in enumerate(clips)],
        str(config_path.resolve()),
    )
    for i, rec in enumerate(manifest.clips.values()):
        rec.pool = "a0" if i % 2 == 0 else "a1"
        rec.stages = {
            s: StageResult(stage=s, seconds=1.25 + i, started=1000.0 + i) for s in ("encode", "sample", "transfer")
        }
        if i < 2:
            rec.state = "delivered"
            rec.stages["decode"] = StageResult(stage="decode", seconds=2.5, started=1010.0)
            rec.output = str(outputs / f"{rec.clip.id}.mp4")
        else:
            rec.state, rec.error = "failed", "pattern '^[a-z][a-z0-9-]{0,31}$' did not match [sic]"
    manifest.state, manifest.started, manifest.finished = "failed", 1000.0, 1060.0
    save_manifest(config.runs_dir, manifest)
    return run_id


def table_rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """(table lines, rows as {column: cell}) of the first table in ``text``, folding undone."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if "│" in line)
    names = [n.strip() for n in lines[head].split("│")]
    end = next(
        i
        for i in range(head + 2, len(lines))
        if "╵" in lines[i] or ("│" not in lines[i] and not lines[i].lstrip().startswith("╶"))
    )
    body = lines[head + 2 : end]
    blocks: list[list[str]] = [[]]
    separated = any(line.lstrip().startswith("╶") for line in body)
    for line in body:
        if line.lstrip().startswith("╶"):
            blocks.append([])
        elif separated:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    rows = []
    for block in filter(None, blocks):
        parts = [[frag.strip() for frag in line.split("│")] for line in block]
        rows.append({name: "".join(p[i] for p in parts) for i, name in enumerate(names)})
    return lines[head - 1 : end + 1], rows


def h3(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command, in a pipe (not a terminal: what a log or a CI job sees)."""
    full = {k: v for k, v in os.environ.items() if k not in ("H3FLOW_CONFIG", "COLUMNS")}
    return subprocess.run(
        [H3FLOW, *args], cwd=cwd, env={**full, **(env or {})}, capture_output=True, text=True, timeout=120
    )


def commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command, sub-commands included (typer's click is vendored: groups by duck typing)."""
    out = []
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out += commands(cmd, (*path, name))
        else:
            out.append(((*path, name), cmd))
    return out


ALL = commands(typer.main.get_group(app))


# --------------------------------------------------------------------------- help and version
def test_every_command_and_option_has_help_and_no_flag_shows_a_type() -> None:
    assert len(ALL) >= 24
    missing = [
        f"{' '.join(p)} {param.name}" for p, cmd in ALL for param in cmd.params if not getattr(param, "help", "")
    ]
    assert missing == []
    for path, _ in ALL:
        res = runner.invoke(app, [*path, "--help"], terminal_width=80)
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, path
    res = runner.invoke(app, ["status", "--help"], terminal_width=80)
    assert "--json" in res.output and "<path>" in res.output  # options that take a value keep their type


def test_version() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"h3flow {version('h3flow')}"


def test_help_groups_commands_by_the_operators_steps() -> None:
    out = runner.invoke(app, ["--help"], terminal_width=100).output
    panels = ["Try it", "Set up (steps 1-3)", "Bring up the services (steps 4-5)", "Run batches (steps 6-8)"]
    at = [out.index(p) for p in panels]
    assert at == sorted(at)
    run_panel = out[out.index(panels[3]) :]
    for command in ("run", "wait", "status", "runs", "logs", "cancel", "resume"):
        assert re.search(rf"│ {command}\s", run_panel), command


def test_every_command_that_reads_a_config_takes_dash_c() -> None:
    readers = [(p, cmd) for p, cmd in ALL if any(param.name == "config" for param in cmd.params)]
    names = {" ".join(p) for p, _ in readers}
    assert {"start", "stop", "plan", "preflight", "status", "runs", "logs", "cancel", "resume", "deploy"} <= names
    for path, cmd in readers:
        (param,) = [param for param in cmd.params if param.name == "config"]
        assert set(param.opts) == {"--config", "-c"}, path


# --------------------------------------------------------------------------- finding the config
def test_config_found_in_dot_h3flow_after_make_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo` writes .h3flow/local.json: status and stop find it from the checkout."""
    monkeypatch.delenv("H3FLOW_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    run_id = make_run(make_config(tmp_path / ".h3flow"))
    res = runner.invoke(app, ["status", run_id, "--no-links"])
    assert res.exit_code == 0, res.output
    assert [row["clip"] for row in table_rows(res.output)[1]] == LONG_IDS
    res = runner.invoke(app, ["stop"])
    assert res.exit_code == 0, res.output
    assert "not running" in res.output


def test_config_lookup_order_and_what_was_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("H3FLOW_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["runs"])
    assert res.exit_code == 2
    assert "tried --config (not given), $H3FLOW_CONFIG (unset), ./local.json, ./.h3flow/local.json" in res.output
    demo = make_config(tmp_path / ".h3flow")
    make_run(demo, "from-demo-dir")
    here = make_config(tmp_path / "here")
    (tmp_path / "local.json").write_text(here.read_text())
    make_run(here, "from-cwd")
    other = make_config(tmp_path / "other")
    make_run(other, "from-env")

    def listed(*args: str) -> list[str]:
        res = runner.invoke(app, ["runs", "--json", *args])
        assert res.exit_code == 0, res.output
        return [r["run_id"] for r in json.loads(res.output)["runs"]]

    assert listed() == ["from-cwd"]  # ./local.json before ./.h3flow/local.json
    monkeypatch.setenv("H3FLOW_CONFIG", str(other))
    assert listed() == ["from-env"]  # $H3FLOW_CONFIG before both
    assert listed("-c", str(demo)) == ["from-demo-dir"]  # -c before everything
    res = runner.invoke(app, ["runs", "-c", str(tmp_path / "missing.json")])
    assert (
        res.exit_code == 2
        and res.output == f"error: {tmp_path / 'missing.json'}: no such file (run `h3flow config-adapt` first)\n"
    )
    monkeypatch.setenv("H3FLOW_CONFIG", str(tmp_path))
    res = runner.invoke(app, ["runs"])
    assert res.exit_code == 2 and f"$H3FLOW_CONFIG={tmp_path}: is a directory" in res.output


# --------------------------------------------------------------------------- output that fits
def test_status_at_80_columns_in_a_pipe_cuts_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path / "wd")
    run_id = make_run(config)
    res = h3("status", run_id, "-c", str(config), "--no-links", cwd=tmp_path, env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout
    table, rows = table_rows(res.stdout)
    assert max(len(line) for line in table) <= 80
    assert [(r["clip"], r["pool"], r["state"], r["dec"]) for r in rows] == [
        (LONG_IDS[0], "a0", "delivered", "2.5s"),
        (LONG_IDS[1], "a1", "delivered", "2.5s"),
        (LONG_IDS[2], "a0", "failed", "·"),
    ]
    outputs = Path(load_local_config(config).hosts["host-b"].storage.outputs) / run_id
    assert res.stdout.count(str(outputs)) == 1  # the folder once, whole (a log keeps it copyable)
    assert f"outputs: {outputs}/<clip>.mp4\n" in res.stdout  # every output is <folder>/<clip>.mp4
    error = "pattern '^[a-z][a-z0-9-]{0,31}$' did not match [sic]"
    assert f"failed: {LONG_IDS[2]}: {error}\n" in res.stdout  # verbatim: no markup eaten


def test_status_shows_other_output_names_relative_to_their_folder(tmp_path: Path) -> None:
    from h3flow.pipeline.manifest import load_manifest

    config = make_config(tmp_path / "wd")
    run_id = make_run(config)
    runs_dir = load_local_config(config).runs_dir
    manifest = load_manifest(runs_dir, run_id)
    base = Path(manifest.clips[LONG_IDS[0]].output or "").parent
    manifest.clips[LONG_IDS[1]].output = str(base / "retakes" / "second-take.mp4")
    save_manifest(runs_dir, manifest)
    res = h3("status", run_id, "-c", str(config), "--no-links", cwd=tmp_path, env={"COLUMNS": "80"})
    table, rows = table_rows(res.stdout)
    assert max(len(line) for line in table) <= 80 and "…" not in res.stdout
    assert [r["output"] for r in rows] == [f"{LONG_IDS[0]}.mp4", "retakes/second-take.mp4", ""]
    assert f"outputs: {base}\n" in res.stdout


def test_status_json_and_links_skipped_when_prefect_is_down(tmp_path: Path) -> None:
    config = make_config(tmp_path / "wd")
    run_id = make_run(config)
    res = runner.invoke(app, ["status", run_id, "-c", str(config), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["run_id"] == run_id and data["delivered"] == 2 and data["failed"] == 1
    assert set(data["clips"]) == set(LONG_IDS) and "prefect" not in data  # no server: no links, no error
    res = runner.invoke(app, ["status", run_id, "-c", str(config)])
    assert res.exit_code == 0 and "no Prefect UI links" in res.output
    assert load_local_config(config).prefect.api_url in res.output


def test_runs_lists_recent_runs_newest_first(tmp_path: Path) -> None:
    config = make_config(tmp_path / "wd")
    older = make_run(config, "older-run-20240101-000000-0001", ["a", "b"])
    newer = make_run(config, "a-much-longer-batch-name-20250101-000000-ffff", LONG_IDS)
    os.utime(Path(load_local_config(config).runs_dir) / older / "manifest.json", (1, 1))
    broken = Path(load_local_config(config).runs_dir) / "broken-run"
    broken.mkdir()
    (broken / "manifest.json").write_text("{")
    res = runner.invoke(app, ["runs", "-c", str(config), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["runs"]
    assert [r["run_id"] for r in got][1:] == [newer, older] and got[0]["state"] == "unreadable"
    assert got[1]["counts"] == {"delivered": 2, "failed": 1} and got[1]["clips"] == 3
    res = runner.invoke(app, ["runs", "-c", str(config), "-n", "2"])
    assert res.exit_code == 0 and older not in res.output and "…" not in res.output
    table, rows = table_rows(res.output)
    assert max(len(line) for line in table) <= 80
    assert [(r["run"], r["state"], r["delivered"], r["failed"], r["left"]) for r in rows] == [
        ("broken-run", "unreadable", "0/0", "0", "0"),
        (newer, "failed", "2/3", "1", "0"),
    ]


def test_services_json(tmp_path: Path) -> None:
    config = make_config(tmp_path / "wd")
    res = runner.invoke(app, ["status", "--services", "--json", "-c", str(config)])
    assert res.exit_code == 0, res.output
    services = json.loads(res.output)["services"]
    assert {s["kind"] for s in services} >= {"prefect-server", "receiver"}
    assert all(s["running"] is False and s["pid"] is None for s in services)


# --------------------------------------------------------------------------- bad input
def test_errors_are_printed_verbatim(tmp_path: Path) -> None:
    hm = json.loads((ROOT / "examples" / "host-map.example.json").read_text())
    hm["hosts"][0]["name"] = "Host_A"
    (tmp_path / "hm.json").write_text(json.dumps(hm))
    res = h3("config-adapt", str(tmp_path / "hm.json"), "-o", str(tmp_path / "o.json"), cwd=tmp_path)
    assert res.returncode == 2
    assert "String should match pattern '^[a-z][a-z0-9-]{0,31}$'" in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def write_batch(path: Path, clips: list[dict]) -> Path:
    full = [{"prompt": "slow pan", "image": str(IMAGE), "spec": "tiny", "seconds": 1, **c} for c in clips]
    path.write_text(json.dumps({"name": path.stem, "clips": full}))
    return path


def test_a_bad_batch_reports_every_problem_and_starts_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path / "wd")
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    (tmp_path / "folder.png").mkdir()
    batch = write_batch(
        tmp_path / "bad.json",
        [
            {"id": "ok"},
            {"id": "ok"},
            {"id": "passwd", "image": "/etc/passwd"},
            {"id": "dir", "image": str(tmp_path / "folder.png")},
            {"id": "fifo", "image": str(fifo)},
            {"id": "gone", "image": "nope.png"},
            {"id": "spec", "spec": "8k"},
            {"id": "bad id!"},
        ],
    )
    res = h3("run", str(batch), "-c", str(config), cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == f"error: {batch}: 7 problems:"
    expected = [
        "clips[6].spec: unknown spec '8k'",
        "clips[7].id: clip id must be",
        "duplicate clip id 'ok'",
        "'passwd': image /etc/passwd is not an image (PNG, JPEG, WEBP, BMP, TIFF)",
        "'dir': image",
        "is a directory, not an image file",
        "'fifo': image",
        "is not a regular file",
        "'gone': image",
        "does not exist",
    ]
    for text in expected:
        assert text in res.stderr, text
    assert len(lines) == 8 and all(line.startswith("  ") for line in lines[1:])
    assert not Path(load_local_config(config).runs_dir).exists()  # nothing started


def test_deeply_nested_json_is_one_line(tmp_path: Path) -> None:
    config = make_config(tmp_path / "wd")
    deep = tmp_path / "deep.json"
    deep.write_text('{"name": "x", "clips": ' + "[" * 100_000 + "]" * 100_000 + "}")
    res = runner.invoke(app, ["run", str(deep), "-c", str(config)])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: {deep}: invalid JSON: nested more than 64 levels deep"
    res = runner.invoke(app, ["config-adapt", str(deep), "-o", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and "nested more than 64 levels" in res.output


def test_an_image_file_is_checked_by_its_header(tmp_path: Path) -> None:
    from h3flow.core.batch import image_problem

    assert image_problem(IMAGE) is None
    header_only = tmp_path / "cut.png"
    header_only.write_bytes(IMAGE.read_bytes()[:64])  # magic + IHDR: enough for the cheap check
    assert image_problem(header_only) is None
    (tmp_path / "empty.png").write_bytes(b"")
    assert "is not an image" in str(image_problem(tmp_path / "empty.png"))
    (tmp_path / "text.png").write_text("not a picture")
    assert "is not an image" in str(image_problem(tmp_path / "text.png"))
    link = tmp_path / "dangling.png"
    link.symlink_to(tmp_path / "nowhere.png")
    assert image_problem(link) == "does not exist"


def test_store_verify_json(tmp_path: Path) -> None:
    from h3flow.handoff.store import LatentStore

    store = LatentStore(tmp_path / "store")
    src = tmp_path / "x.bin"
    src.write_bytes(b"latent bytes")
    ref = store.put_file(src)
    res = runner.invoke(app, ["store", "verify", "--store", str(tmp_path / "store"), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["damaged"] == []
    ref.path.chmod(0o644)
    ref.path.write_bytes(b"damaged")
    res = runner.invoke(app, ["store", "verify", "--store", str(tmp_path / "store"), "--json"])
    assert res.exit_code == 2
    body, _, error = res.output.partition("error: ")
    assert json.loads(body)["damaged"] == [
        {"object": ref.path.name, "problem": f"bytes hash to {sha256_bytes(b'damaged')}"}
    ]
    assert error.startswith("1 of 1 objects")


def test_database_choice_goes_with_local_only(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    bad = runner.invoke(app, ["config-adapt", "--local", "--database", "mysql", "-o", str(out)])
    assert bad.exit_code == 2 and bad.output.strip() == "error: --database 'mysql': choose one of sqlite, postgresql"
    host_map = runner.invoke(app, ["config-adapt", str(ROOT / "examples" / "host-map.example.json"), "--database", "postgresql", "-o", str(out)])  # fmt: skip
    assert host_map.exit_code == 2 and "--database goes with --local" in host_map.output and not out.exists()
    ok = runner.invoke(app, ["config-adapt", "--local", "--database", "postgresql", "--workdir", str(tmp_path / "wd"), "-o", str(out)])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert json.loads(out.read_text())["prefect"]["database"]["kind"] == "postgresql"


# --------------------------------------------------------------------------- after `make demo`
def test_a_run_that_delivered_nothing_reports_no_none(tmp_path: Path) -> None:
    """report.md and status of a failed run: "0 clips/h", never "None clips/h" or "planned None s"."""
    from h3flow.pipeline.manifest import load_manifest
    from h3flow.pipeline.run_report import write_run_report

    config_path = make_config(tmp_path / "wd")
    config = load_local_config(config_path)
    run_id = make_run(config_path)
    manifest = load_manifest(config.runs_dir, run_id)
    for rec in manifest.clips.values():
        rec.state, rec.output, rec.error = "failed", None, "decoder host unreachable"
    save_manifest(config.runs_dir, manifest)
    paths = write_run_report(manifest, config)
    report = paths["md"].read_text()
    assert "None" not in report
    assert "state **failed** · 0/3 delivered · makespan 60.0 s · 0 clips/h\n" in report
    res = h3("status", run_id, "-c", str(config_path), "--no-links", cwd=tmp_path, env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "None" not in res.stdout and "makespan 60.0 s · 0 clips/h\n" in res.stdout


def test_open_without_a_server_says_how_to_start_it(tmp_path: Path) -> None:
    config = make_config(tmp_path / ".h3flow")
    run_id = make_run(config)
    res = h3("open", run_id, "--no-browser", cwd=tmp_path)  # found as ./.h3flow/local.json: no -c
    assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1
    api = load_local_config(config).prefect.api_url
    assert (
        res.stderr
        == f"error: the Prefect server at {api} does not answer: start the services with `{H3FLOW} start --local`\n"
    )
    res = h3("open", run_id, "no-such-clip", cwd=tmp_path)
    assert res.returncode == 2 and "has no clip 'no-such-clip'" in res.stderr and "Traceback" not in res.stderr


def test_a_command_in_a_fresh_terminal_prints_nothing_of_prefects_own(tmp_path: Path) -> None:
    """In a terminal (not a pipe), on a machine where h3flow never ran (no ~/.cache): no
    telemetry notice from Prefect's first import, no warning about its home folder."""
    from pseudo_terminal import run_in_terminal

    config = make_config(tmp_path / "wd")
    run_id = make_run(config)
    home = tmp_path / "home"
    home.mkdir()
    ci = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE", "CI_NAME")  # Prefect is quiet in CI
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "H3FLOW_")) and k not in ci}
    env.pop("DO_NOT_TRACK", None)
    env["HOME"] = str(home)
    screen = run_in_terminal([H3FLOW, "status", run_id, "-c", str(config)], cwd=tmp_path, env=env)
    assert screen.returncode == 0, screen.text
    assert LONG_IDS[0] in screen.text and "no Prefect UI links" in screen.text  # it asked Prefect
    assert "anonymous usage data" not in screen.text and "telemetry" not in screen.text
    assert "Warning" not in screen.text, screen.text
    assert not (home / ".prefect").exists()
