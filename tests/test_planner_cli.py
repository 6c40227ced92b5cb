"""``h3flow plan`` through the real command line: output, JSON, Gantt PNG, bad input."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.config.adapt import adapt
from h3flow.config.models import load_host_map
from h3flow.planner.profile import DEFAULT_PROFILE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "host-map.example.json")
runner = CliRunner()


def plan(*args: str, cwd: Path | None = None):
    if cwd is None:
        return runner.invoke(app, ["plan", *args])
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(app, ["plan", *args])
    finally:
        os.chdir(old)


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output + result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def words(text: str) -> str:
    """The output with its line breaks undone (the report wraps sentences at the terminal's width)."""
    return " ".join(text.split())


def test_the_table_shows_the_design_figures_and_the_recommendation() -> None:
    result = plan("--host-map", EXAMPLE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    four_four = next(line for line in out.splitlines() if line.startswith("★ four_four_plus_one "))
    assert "296.9" in four_four and "72.75" in four_four and "+48.5%" in four_four
    assert "optimal" in four_four  # the analytic bound proves the design's schedule optimal
    text = words(out)
    assert "base (the 'vs base' column) is eight_plus_one: all 8 × T10 GPUs of host-a in one pool" in text
    assert "recommended: four_four_plus_one" in text
    assert (
        "four_four_xtx_plus_one would add only +11.5% over four_four_plus_one at 6 clips (both proven optimal" in text
    )
    # the 15% rule is not a 6-clip artefact: the gain grows with the batch, and the plan says from when it pays
    assert (
        "the xtx host adds +11.5% at 6 clips (both proven optimal); >= 15% from 7 clips on the best schedules "
        "found (proven); +32.0% in steady state (throughput bounds)"
    ) in text
    # 1 x T10 (16 GB) cannot hold the 20 GB DiT: one line says so
    assert "not planned, 1 topology has a pool too small for the DiT: one_one_plus_one" in text


def test_json_has_the_same_content_for_machines() -> None:
    result = plan("--host-map", EXAMPLE, "--spec", "hd", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["recommendation"]["topology"] == "four_four_xtx_plus_one"
    assert data["baseline"]["topology"] == "eight_plus_one"
    row = next(r for r in data["topologies"] if r["topology"] == "four_four_xtx_plus_one")
    assert row["makespan_s"] == pytest.approx(677.5, rel=0.005)
    assert row["clips_per_hour"] == pytest.approx(31.88, rel=0.005)
    assert row["decoder_idle_gaps_s"]["b"] == pytest.approx(188.1, abs=1.0)
    assert row["gap"] == pytest.approx(0.0, abs=1e-6) and row["proven_bound_s"] == pytest.approx(677.5, rel=0.005)
    assert row["steady_state_clips_per_hour"] > row["clips_per_hour"]
    # the per-clip schedule: every clip, every stage, on its resource, in order
    schedule = {c["clip"]: c for c in row["schedule"]}
    assert len(schedule) == 6
    for clip in schedule.values():
        stages = clip["stages"]
        assert list(stages) == ["encode", "offload", "sample", "handoff", "transfer", "decode", "mux"]
        assert stages["sample"]["resource"] == clip["pool"] and stages["decode"]["resource"] == clip["decoder"]
        ends = [(st["start_s"], st["end_s"]) for st in stages.values()]
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(ends))
        if clip["pool"] == "xtx":
            assert stages["encode"]["resource"] == "a0"
    assert max(c["stages"]["mux"]["end_s"] for c in schedule.values()) == pytest.approx(row["makespan_s"], abs=1e-3)
    xtx = data["recommendation"]["extra_hosts"]
    assert [(h["host"], h["with"], h["without"]) for h in xtx] == [
        ("xtx", "four_four_xtx_plus_one", "four_four_plus_one")
    ]
    assert xtx[0]["gain"] == pytest.approx(0.332, abs=0.005)
    assert set(row["utilisation"]) == {"a0", "a1", "xtx", "host-a->host-b", "xtx->host-b", "b"}
    assert row["pools"]["xtx"] == "1xRX 7900 XTX (encoded on a0)"
    infeasible = next(r for r in data["topologies"] if r["topology"] == "one_one_plus_one")
    assert infeasible["feasible"] is False and "needs 20 GB" in infeasible["reason"]


def test_search_tries_partitions_flags_modelled_times_and_draws_a_gantt_chart(tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    result = plan("--host-map", EXAMPLE, "--topology", "search", "--spec", "hd", "--json", "--gantt", str(png))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    names = {r["topology"] for r in data["topologies"] if r["feasible"]}
    assert {"eight_plus_one", "four_four_plus_one", "4+2+2", "4+2+2+xtx", "4+2+xtx"} <= names
    reasons = {r["topology"]: r["reason"] for r in data["topologies"] if not r["feasible"]}
    assert "text encoder" in reasons["2+2+2+2"] and "needs 20 GB" in reasons["4+2+1+1"]
    row = next(r for r in data["topologies"] if r["topology"] == "4+2+2")
    assert any("×2 hd sample" in k and "Amdahl" in v for k, v in row["modelled"].items())
    assert data["gantt"]["topology"] == data["recommendation"]["topology"]
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 1000 and img.height > 400


def test_a_comparison_chart_puts_the_designs_round_robin_above_the_plan(tmp_path: Path) -> None:
    png = tmp_path / "compare.png"
    result = plan("--host-map", EXAMPLE, "--topology", "eight_xtx_plus_one", "--compare", str(png), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["compare"] == {"topology": "eight_xtx_plus_one", "path": str(png)}
    row = data["topologies"][0]
    assert row["makespan_s"] < row["design_policy"]["makespan_s"]  # the chart shows a real difference
    with Image.open(png) as img:
        assert img.format == "PNG" and img.height > 700


def test_a_batch_file_and_a_local_json_are_planned(tmp_path: Path) -> None:
    config = adapt(load_host_map(Path(EXAMPLE)), "four_four_xtx_plus_one")
    (tmp_path / "local.json").write_text(config.model_dump_json())
    batch = tmp_path / "batch.json"
    batch.write_text(
        json.dumps(
            {
                "name": "mixed",
                "clips": [
                    {"id": f"m{i}", "prompt": "pan", "image": "missing.png", "spec": spec, "seconds": s}
                    for i, (spec, s) in enumerate([("hd", 5), ("sd", 5), ("sd", 2), ("hd", 8)])
                ],
            }
        )
    )
    result = plan("--batch", str(batch), "--topology", "four_four_xtx_plus_one", "--json", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["current_topology"] == "four_four_xtx_plus_one" and data["clips"] == 4
    # the one asked for, and the baseline for the 'vs base' column (never a candidate)
    assert [(r["topology"], r.get("reference_only", False)) for r in data["topologies"]] == [
        ("four_four_xtx_plus_one", False),
        ("eight_plus_one", True),
    ]
    # one topology asked for: nothing to compare it with, so nothing is recommended (it says so)
    assert data["recommendation"]["topology"] is None
    assert "only four_four_xtx_plus_one was planned" in data["recommendation"]["why"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--topology", "nine_plus_one"], ["unknown topology 'nine_plus_one'", "four_four_plus_one"]),
        (["--topology", "4+3"], ["pool size 3 is not a Ulysses degree"]),
        (["--spec", "uhd"], ["unknown spec 'uhd'"]),
        (["--spec", "sd", "--batch", "b.json"], ["--spec or --batch"]),
        (["--policy", "fastest"], ["unknown policy 'fastest'"]),
        (["--clips", "0"], ["at least 1"]),
        (["--gantt", "plan.svg"], ["name the file *.png"]),
        (["--threshold", "-0.1"], ["not a fraction"]),
        (["--time-limit", "-1"], ["--time-limit -1.0"]),
        (["--compare", "plan.jpg"], ["--compare plan.jpg", "name the file *.png"]),
    ],
)
def test_bad_options_are_one_line_errors(args: list[str], needles: list[str]) -> None:
    one_line_error(plan("--host-map", EXAMPLE, *args), *needles)


def test_an_unwritable_gantt_path_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    one_line_error(plan("--host-map", EXAMPLE, "--gantt", str(tmp_path / "file" / "plan.png")), "cannot write")


def test_no_hardware_says_what_to_pass(tmp_path: Path) -> None:
    one_line_error(plan(cwd=tmp_path), "--host-map", "--config local.json")


def _profile(tmp_path: Path, old: str, new: str) -> str:
    text = DEFAULT_PROFILE.read_text()
    assert old in text
    path = tmp_path / "profile.toml"
    path.write_text(text.replace(old, new))
    return str(path)


def test_a_profile_missing_an_entry_names_it(tmp_path: Path) -> None:
    profile = _profile(tmp_path, "[gpu.T10.sample.hd]\n", "[gpu.T10.sample.uhd]\n")
    assert plan("--host-map", EXAMPLE, "--profile", profile).exit_code == 0  # SD does not need it
    one_line_error(
        plan("--host-map", EXAMPLE, "--profile", profile, "--spec", "hd"), "no entry gpu.T10.sample.hd", "pool a"
    )


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("encode  = { sd = 13.06,", "encode  = { sd = -13.06,", "gpu.T10.encode.sd: Input should be greater than 0"),
        ("decode = { sd = 11.3,", "decode = { sd = 0,", "gpu.RTX 3080 Ti.decode.sd: Input should be greater than 0"),
        ("overhead_s = 0.69", "overhead_s = 0.0", "transfer.overhead_s: Input should be greater than 0"),
        ("version = 1\n", "version = 1\nversion = 2\n", "invalid TOML"),
    ],
)
def test_negative_zero_or_unparseable_profiles_are_one_line_errors(
    tmp_path: Path, old: str, new: str, needle: str
) -> None:
    one_line_error(plan("--host-map", EXAMPLE, "--profile", _profile(tmp_path, old, new)), needle)


def test_an_unparseable_batch_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "batch.json"
    bad.write_text('{"clips": [ {"id": "a", }')
    one_line_error(plan("--host-map", EXAMPLE, "--batch", str(bad)), "invalid JSON at line 1")
    bad.write_text('{"clips": [{"id": "a", "prompt": "p", "image": "x.png", "seconds": -5}]}')
    one_line_error(plan("--host-map", EXAMPLE, "--batch", str(bad)), "clips[0].seconds")


def test_it_runs_with_torch_unimportable_cuda_hidden_and_no_network(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "from h3flow.cli import app\n"
        f"app(['plan', '--host-map', {EXAMPLE!r}, '--spec', 'hd', '--json'])\n"
    )
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recommendation"]["topology"] == "four_four_xtx_plus_one"
