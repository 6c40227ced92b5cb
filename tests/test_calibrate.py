"""calibrate: a run's pure stage work and the orchestration's gaps in, a profile `plan` reads out."""

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
from h3flow.pipeline.calibration import fit, measure
from h3flow.pipeline.manifest import Manifest, new_manifest
from h3flow.pipeline.results import StageResult
from h3flow.planner import Planner, Resources
from h3flow.planner.calibrate import to_toml
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile, parse_profile
from h3flow.planner.timing import PlanClip

ROOT = Path(__file__).resolve().parents[1]
CONFIG = adapt(load_host_map(ROOT / "examples" / "host-map.example.json"))  # a0, a1: 4 x T10; b: RTX 3080 Ti
IMAGE = ROOT / "examples" / "images" / "landscape.png"
SUBMITTED = 100.0


def stage(name: str, started: float, seconds: float, pool: str, cached: bool = False) -> StageResult:
    return StageResult(stage=name, started=started, seconds=seconds, pool=pool, cached=cached)


def run() -> Manifest:
    """Three clips, all submitted at once (pool a0 takes c0 then c1, a1 takes c2), one decoder.

    a0: c0 encodes 110-120, samples 121-181; c1 (waiting since 102) encodes at 183.5:
    the pool idled 2.5 s. Latents arrive on b at 182.5 (c0), 189.5 (c2), 258 (c1); b decodes
    c0 at 183 (0.5 s after), c2 at 200 (free at 193: 7 s after), c1 at 261 (3 s after).
    """
    clips = [Clip(id=f"c{i}", prompt="p", image=IMAGE, spec="sd", seed=i) for i in range(3)]
    manifest = new_manifest("r1", "b", clips, "local.json")
    manifest.submitted = SUBMITTED
    plan = {
        "c0": ("a0", 110.0, 60.0, 183.0, 10.0),
        "c1": ("a0", 183.5, 62.0, 261.0, 12.0),
        "c2": ("a1", 111.0, 66.0, 200.0, 11.0),
    }
    for cid, (pool, start, sample, decode_at, decode_s) in plan.items():
        rec = manifest.clips[cid]
        rec.pool, rec.decoder, rec.state = pool, "b", "delivered"
        sampled = start + 11.0 + sample
        rec.stages = {
            "encode": stage("encode", start, 10.0, pool),
            "offload": stage("offload", start + 10.0, 1.0, pool),
            "sample": stage("sample", start + 11.0, sample, pool),
            "transfer": stage("transfer", sampled + 0.5, 1.0, pool),
            "decode": stage("decode", decode_at, decode_s, "b"),
        }
        rec.timeline = {"sample_submitted": 102.0, "sampled": sampled + 2, "delivered": decode_at + decode_s + 0.4}
    manifest.dispatch_overhead_s = 0.3
    return manifest


def test_a_run_is_measured_as_pure_work_and_the_gaps_around_it() -> None:
    times = measure(run(), CONFIG)
    assert times.work[("a0", "sample", "sd")] == [60.0, 62.0] and times.work[("a1", "sample", "sd")] == [66.0]
    assert times.work[("b", "decode", "sd")] == [10.0, 12.0, 11.0]
    assert times.work[("host-a->host-b", "transfer", "sd")] == [1.0, 1.0, 1.0]
    assert times.pool_gaps == pytest.approx([2.5])  # a1 ran one clip: no gap to measure there
    assert sorted(times.decode_latencies) == pytest.approx([0.5, 3.0, 7.0])  # from max(arrived, decoder free)
    assert times.first_start == pytest.approx(10.0)  # submitted 100, first encode 110
    assert times.executed == pytest.approx(273.4 - SUBMITTED)  # c1 delivered at 261 + 12 + 0.4
    assert times.api_s_per_clip == pytest.approx(0.1)


def test_a_clip_that_was_not_yet_waiting_leaves_no_pool_gap_and_cached_stages_measure_nothing() -> None:
    manifest = run()
    manifest.clips["c1"].timeline["sample_submitted"] = 183.0  # submitted after c0 had left the pool
    manifest.clips["c2"].stages["sample"] = manifest.clips["c2"].stages["sample"].model_copy(update={"cached": True})
    times = measure(manifest, CONFIG)
    assert times.pool_gaps == []
    assert times.work[("a1", "sample", "sd")] == [] and times.work[("a1", "encode", "sd")] == [10.0]


def test_the_first_start_is_the_first_stage_that_ran_when_encodes_were_cached() -> None:
    manifest = run()
    for rec in manifest.clips.values():  # the prompts were encoded by an earlier run
        rec.stages["encode"] = rec.stages["encode"].model_copy(update={"cached": True, "started": 20.0})
    assert measure(manifest, CONFIG).first_start == pytest.approx(20.0)  # c0's offload at 120, not the cache's 20


def test_the_fit_keeps_pure_work_and_orchestration_apart() -> None:
    raw, notes = fit(CONFIG, [run()])
    profile = parse_profile(raw)
    base = load_profile()
    # T10 x4 pools pool their data: median of 60, 62, 66 minus the SD handoff inside the sample stage
    assert profile.sample("T10", 4, "sd", "t").seconds == pytest.approx(62.0 - base.handoff("sd", "t"), abs=1e-3)
    assert profile.encode("T10", "sd", "t") == 10.0 and profile.offload("T10", "sd", "t") == 1.0
    assert profile.decode("RTX 3080 Ti", "sd", "t") == pytest.approx(11.0 - base.mux("RTX 3080 Ti", "sd", "t"))
    wire = base.latent_bytes("sd", base.reference_frames) * 8 / 10e9
    assert profile.data.transfer.overhead_s == pytest.approx(1.0 - wire, abs=1e-3)
    orchestration = profile.data.orchestration
    assert (orchestration.pool_gap_s, orchestration.decode_latency_s, orchestration.first_start_s) == (2.5, 3.0, 10.0)
    assert any("median of 3 clips" in n for n in notes) and any(n.startswith("orchestration:") for n in notes)
    # measured now: no longer listed as fitted to the design's table; the rest still are
    assert "gpu.T10.sample.sd.4" not in profile.data.fitted and "gpu.T10.sample.hd.4" in profile.data.fitted
    # the planner adds the orchestration to each clip's sampling and decode; without it, pure work
    pure = parse_profile(fit(CONFIG, [run()], overheads=False)[0])
    assert pure.data.orchestration.model_dump() == {"pool_gap_s": 0.0, "decode_latency_s": 0.0, "first_start_s": 0.0}
    res = Resources.from_config(CONFIG)
    clip = PlanClip.make("x", "sd")
    with_gaps, without = Planner(profile, res), Planner(pure, res)
    pool, decoder = res.samplers[0], res.decoders[0]
    assert with_gaps.sampler_times(clip, pool).sample - without.sampler_times(clip, pool).sample == pytest.approx(2.5)
    assert with_gaps.decoder_times(clip, decoder)[0] - without.decoder_times(clip, decoder)[0] == pytest.approx(3.0)
    assert (profile.start_up, pure.start_up) == (10.0, 0.0)


def test_the_written_profile_round_trips_through_toml() -> None:
    raw, _ = fit(CONFIG, [run()])
    again = tomllib.loads(to_toml(raw, "calibrated\nfrom r1"))
    assert again == raw
    for degree, spec in ((8, "sd"), (4, "hd")):  # not measured: as the base profile has them
        assert parse_profile(again).sample("T10", degree, spec, "t") == load_profile().sample("T10", degree, spec, "t")


def test_runs_with_nothing_executed_are_refused() -> None:
    manifest = run()
    for rec in manifest.clips.values():
        rec.stages = {name: r.model_copy(update={"cached": True}) for name, r in rec.stages.items()}
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
