"""calibrate: measured occupancy in, a profile `plan` reads out."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.config.adapt import adapt
from h3flow.config.models import load_host_map
from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError
from h3flow.pipeline.calibration import fit, occupancy
from h3flow.pipeline.manifest import new_manifest
from h3flow.pipeline.results import StageResult
from h3flow.planner.calibrate import to_toml
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile, parse_profile

ROOT = Path(__file__).resolve().parents[1]
CONFIG = adapt(load_host_map(ROOT / "examples" / "host-map.example.json"))
IMAGE = ROOT / "examples" / "images" / "landscape.png"


def run(pool_starts: dict[str, list[float]], sample_s: float, decode_gap: float, timeline: bool = True):
    """A delivered run: each pool starts a clip at the given times and holds it ``sample_s``."""
    clips = [
        Clip(id=f"c{i}", prompt="p", image=IMAGE, spec="sd", seed=i) for i in range(sum(map(len, pool_starts.values())))
    ]
    manifest = new_manifest("r1", "b", clips, "local.json")
    recs = iter(manifest.clips.values())
    t_decode = 1000.0
    for pool, starts in pool_starts.items():
        for start in starts:
            rec = next(recs)
            rec.pool, rec.decoder, rec.state = pool, "b", "delivered"
            rec.stages["encode"] = StageResult(stage="encode", started=start, seconds=13.06)
            rec.stages["sample"] = StageResult(stage="sample", started=start + 14.0, seconds=sample_s - 14.0)
            rec.stages["decode"] = StageResult(stage="decode", started=t_decode, seconds=decode_gap - 0.5)
            if timeline:
                rec.timeline = {
                    "sample_submitted": 0.0,
                    "sampled": start + sample_s,
                    "decode_submitted": t_decode - decode_gap / 2,
                    "delivered": t_decode + decode_gap,
                }
            t_decode += decode_gap
    return manifest


def test_a_pools_cost_per_clip_is_its_measured_throughput() -> None:
    # a0 takes 3 clips queued at t=0 and finishes them at 80, 160, 240 s: 80 s a clip,
    # whatever the stage seconds say (start-up and API time included)
    manifest = run({"a0": [0.0, 80.0, 160.0], "a1": [1.0, 81.0]}, sample_s=80.0, decode_gap=12.0)
    held = occupancy([manifest], "sample")
    assert held[("a0", "sd")] == pytest.approx([80.0] * 3)
    assert held[("a1", "sd")] == pytest.approx([(81.0 + 80.0) / 2] * 2)
    raw, notes = fit(CONFIG, [manifest])
    profile = parse_profile(raw)
    # the median 80 s minus the profile's encode (13.06) + offload (1.0) + SD handoff (0.2)
    assert profile.sample("T10", 4, "sd", "t").seconds == pytest.approx(80.0 - 13.06 - 1.0 - 0.2, abs=1e-3)
    # decoder: 5 clips from the first submission (994) to the last delivery (1060): 13.2 s each, minus mux 0.5
    assert profile.decode("RTX 3080 Ti", "sd", "t") == pytest.approx(66.0 / 5 - 0.5, abs=1e-3)
    assert any("median of 5 clips" in n for n in notes)
    # measured now: no longer listed as fitted to the design's table; the rest still are
    assert "gpu.T10.sample.sd.4" not in profile.data.fitted and "gpu.T10.sample.hd.4" in profile.data.fitted


def test_runs_without_a_timeline_use_the_stage_seconds() -> None:
    manifest = run({"a0": [0.0, 80.0]}, sample_s=70.0, decode_gap=10.0, timeline=False)
    assert occupancy([manifest], "sample")[("a0", "sd")] == pytest.approx([70.0, 70.0])
    assert occupancy([manifest], "decode")[("b", "sd")] == pytest.approx([9.5, 9.5])


def test_the_written_profile_round_trips_through_toml() -> None:
    manifest = run({"a0": [0.0, 70.0]}, sample_s=70.0, decode_gap=10.0)
    raw, _ = fit(CONFIG, [manifest])
    assert raw["gpu"]["T10"]["sample"]["sd"]["4"] == pytest.approx(70.0 - 13.06 - 1.0 - 0.2, abs=1e-3)
    text = to_toml(raw, "calibrated\nfrom r1")
    again = tomllib.loads(text)
    assert again == raw
    assert (
        parse_profile(again).sample("T10", 8, "sd", "t").seconds == load_profile().sample("T10", 8, "sd", "t").seconds
    )


def test_runs_with_nothing_executed_are_refused() -> None:
    manifest = run({}, sample_s=1.0, decode_gap=1.0)
    with pytest.raises(ConfigError, match="nothing to calibrate"):
        fit(CONFIG, [manifest], DEFAULT_PROFILE)


def test_unknown_run_is_a_one_line_error(tmp_path: Path) -> None:
    local = tmp_path / "local.json"
    assert (
        CliRunner()
        .invoke(app, ["config-adapt", str(ROOT / "examples" / "host-map.example.json"), "-o", str(local)])
        .exit_code
        == 0
    )
    res = CliRunner().invoke(app, ["calibrate", "nope", "--config", str(local), "-o", str(tmp_path / "p.toml")])
    assert res.exit_code == 2 and "unknown run id 'nope'" in res.output
    assert not (tmp_path / "p.toml").exists()
