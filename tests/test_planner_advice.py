"""The advice holds and says what it rests on: the pay-off size and the steady-state gain come from the best
schedules (held against the true optima of small batches) and from proven bounds; "optimal" only when proven;
modelled figures are flagged with what the other fit would recommend; one topology asked for is not
"recommended" without a comparison."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.cli.plan import run_plan
from h3flow.config.models import load_host_map
from h3flow.planner import PlanClip, Planner, RoundRobin, simulate
from h3flow.planner.best import Best, Search
from h3flow.planner.bounds import throughput
from h3flow.planner.instance import Instance
from h3flow.planner.payoff import resized
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile
from h3flow.planner.recommend import hosts, plan_all, recommend
from h3flow.planner.search import build, candidates
from tests.planner_reference import exhaustive

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "host-map.example.json"
HOST_MAP = load_host_map(EXAMPLE)
PROFILE = load_profile()


def mixed(n: int, seed: int) -> list[PlanClip]:
    rng = random.Random(seed)
    return [PlanClip.make(f"m{i}", rng.choice(["sd", "hd"]), rng.choice([2.0, 5.0, 8.0])) for i in range(n)]


def quiet_plan(**kwargs) -> dict:  # type: ignore[no-untyped-def]
    with contextlib.redirect_stdout(io.StringIO()):
        return run_plan(host_map=EXAMPLE, as_json=True, **kwargs)


# --------------------------------------------------------------------------- pay-off, against the true optima
def test_the_payoff_size_is_where_the_true_optima_cross_the_threshold() -> None:
    # a 6-clip mix whose XTX pays from a small size: exhaustive search gives the true optima up to 5 clips
    clips = mixed(6, 8)
    evals = plan_all(candidates(HOST_MAP, "all", PROFILE), clips, PROFILE, "best", seconds=0, threshold=0.15)
    rec = recommend(evals, 0.15, clips, seconds=0)
    (xtx,) = rec.payoffs
    with_, without = ([e for e in evals if e.schedule and hosts(e.candidate) == h] for h in ({"b", "xtx"}, {"b"}))
    scan = {g.clips: g for g in xtx.scan}  # from 48 clips down to the first size that does not pay
    true_gain = {}
    for size in sorted(s for s in scan if s <= 5):
        batch = resized(clips, size)
        best_with = min(exhaustive(e.planner, batch).makespan for e in with_)
        best_without = min(exhaustive(e.planner, batch).makespan for e in without)
        true_gain[size] = best_without / best_with - 1
        g = scan[size]
        assert g.low - 1e-9 <= true_gain[size] <= g.high + 1e-9, (size, g, true_gain[size])  # the proof holds
    assert all(g.low >= 0.15 for size, g in scan.items() if size > 5)  # above 5 clips the gain is proven
    lowest = min(true_gain)
    assert true_gain[lowest] < 0.15  # the scan went down to a size that does not pay ...
    crossing = min(n for n in true_gain if all(true_gain[m] >= 0.15 for m in true_gain if m >= n))
    assert xtx.pays_from == crossing == 3  # ... and the pay-off size is where the true optima cross 15%
    assert xtx.proven_from == 5 and xtx.proven_from >= xtx.pays_from
    assert ">= 15% from 3 clips on the best schedules found, proven from 5" in " ".join(rec.sentence.split())


def test_the_steady_state_gain_is_the_best_with_the_host_against_the_best_without() -> None:
    clips = mixed(50, 2525)
    evals = plan_all(candidates(HOST_MAP, "search", PROFILE), clips, PROFILE, "best", seconds=0, threshold=0.15)
    rec = recommend(evals, 0.15, clips, seconds=0)
    (xtx,) = rec.payoffs
    rate = {
        e.name: 3600 * throughput(Instance.of(Planner(PROFILE, e.candidate.resources), clips))
        for e in evals
        if e.schedule is not None
    }
    with_ = max(r for name, r in rate.items() if name.endswith("xtx") or "xtx_" in name)
    without = max(r for name, r in rate.items() if not (name.endswith("xtx") or "xtx_" in name))
    assert xtx.steady_gain == pytest.approx(with_ / without - 1, rel=1e-6)
    # not between the two that win at this size: that understated it (+22% quoted where this gives +36%)
    assert xtx.steady_gain > 0.30


def test_the_gain_at_the_batch_size_is_bracketed_by_proven_bounds() -> None:
    clips = mixed(20, 2526)
    evals = plan_all(candidates(HOST_MAP, "all", PROFILE), clips, PROFILE, "best", seconds=1.0, threshold=0.15)
    rec = recommend(evals, 0.15, clips, seconds=0.2)
    (xtx,) = rec.payoffs
    g = xtx.at_size
    assert g.low <= g.value <= g.high
    best_with = min(e.schedule.makespan for e in evals if e.schedule and "xtx" in e.name)
    best_without = min(e.schedule.makespan for e in evals if e.schedule and "xtx" not in e.name)
    assert g.value == pytest.approx(best_without / best_with - 1, rel=1e-9)
    assert "proven" in rec.sentence


# --------------------------------------------------------------------------- "optimal" only when proven
def test_optimal_is_said_only_at_a_proven_gap_of_zero() -> None:
    planner = Planner(PROFILE, build(HOST_MAP, "four_four_xtx_plus_one", PROFILE).resources)
    clips = mixed(12, 2527)
    best = Search(planner, clips).best
    assert best.optimal == (best.schedule.makespan <= best.proven * (1 + 1e-9))
    nearly = Best(best.schedule, "x", best.bound, best.schedule.makespan / (1 + 1e-6), "test", False)
    assert nearly.gap > 0  # a 0.0001% gap is a gap
    from h3flow.cli.plan_view import _gap
    from h3flow.planner.topologies import Evaluation

    ev = Evaluation(build(HOST_MAP, "four_four_xtx_plus_one", PROFILE))
    ev.fixed = nearly
    assert _gap(ev) == "<0.01%"
    nearly.optimal = True
    assert _gap(ev) == "optimal"


def test_a_long_batch_shows_its_real_gap_not_optimal() -> None:
    # 400 mixed clips on the heuristics alone: gaps are small but not zero, and the plan must not say "optimal"
    batch = {
        "name": "long",
        "clips": [
            {"id": c.id, "prompt": "p", "image": "x.png", "spec": c.spec, "seconds": s}
            for c, s in zip(mixed(400, 2528), random.Random(1).choices([2, 5, 8], k=400), strict=True)
        ],
    }
    path = Path(__file__).parent / "_long_batch.json"
    path.write_text(json.dumps(batch))
    try:
        data = quiet_plan(batch=path, time_limit=0)
    finally:
        path.unlink()
    gaps = []
    for row in (r for r in data["topologies"] if r["feasible"]):
        assert row["proven_optimal"] == (row["gap"] == 0), row["topology"]  # optimal exactly at gap 0
        if row["gap"] == 0:
            assert row["makespan_s"] <= row["proven_bound_s"] + 1e-3, row["topology"]
        gaps.append(row["gap"])
    assert any(g > 0 for g in gaps)  # the heuristics alone do not prove every topology optimal here


# --------------------------------------------------------------------------- modelled figures and other fits
def test_the_modelled_hd_decode_is_flagged_with_what_the_other_fit_recommends() -> None:
    data = quiet_plan(spec="hd", time_limit=0.5)
    assert "gpu.RTX 3080 Ti.decode.hd" in data["profile_modelled"]
    (fit,) = data["other_fits"]
    assert fit["fit"] == "slow-hd-decode" and fit["same"] is True
    assert fit["recommendation"] == data["recommendation"]["topology"] == "four_four_xtx_plus_one"
    assert fit["steady_state_gains"]["xtx"] == pytest.approx(0.570, abs=0.002)  # +41.9% under the shipped fit
    (xtx,) = data["recommendation"]["extra_hosts"]
    assert xtx["steady_state_gain"] == pytest.approx(0.419, abs=0.002)
    result = CliRunner().invoke(app, ["plan", "--host-map", str(EXAMPLE), "--spec", "hd", "--time-limit", "0.5"])
    text = " ".join(result.stdout.split())
    assert "modelled, not measured: " in text
    assert "gpu.RTX 3080 Ti.decode.hd = 34.77 s: the measured SD decode x 3.077, the pixel ratio" in text
    assert (
        "Under the other fit 'slow-hd-decode' (76 s HD decode + mux, 235.34 s T10 and 206.22 s XTX HD sampling "
        "meet the design's table as well): the recommendation holds (four_four_xtx_plus_one); the xtx host "
        "+57.0% in steady state (not +41.9%)."
    ) in text


def test_an_sd_batch_does_not_rest_on_the_hd_decode() -> None:
    data = quiet_plan(spec="sd", time_limit=0)
    assert data["profile_modelled"] == {} and data["other_fits"] == []


def test_the_other_fit_meets_the_designs_table_as_well() -> None:
    other = PROFILE.variant("slow-hd-decode")
    clips = [PlanClip.make(f"h{i}", "hd") for i in range(6)]
    spans = {}
    for topology in ("four_four_plus_one", "four_four_xtx_plus_one"):
        planner = Planner(other, build(HOST_MAP, topology, other).resources)
        spans[topology] = simulate(clips, planner, RoundRobin(planner)).makespan
    assert spans["four_four_xtx_plus_one"] == pytest.approx(677.5, rel=0.005)
    assert spans["four_four_plus_one"] / spans["four_four_xtx_plus_one"] - 1 == pytest.approx(0.332, abs=0.005)


def test_a_fit_that_changes_the_recommendation_says_which_it_would_be(tmp_path: Path) -> None:
    text = DEFAULT_PROFILE.read_text()
    text = text.replace(
        "[alternatives.power-law-scaling]",
        '[alternatives.slow-xtx]\nwhy = "an XTX three times slower at HD"\n'
        'set = { "gpu.RX 7900 XTX.sample.hd.1" = 940.0 }\n\n[alternatives.power-law-scaling]',
    )
    profile = tmp_path / "profile.toml"
    profile.write_text(text)
    data = quiet_plan(spec="hd", time_limit=0.3, profile=profile)
    fits = {f["fit"]: f for f in data["other_fits"]}
    assert data["recommendation"]["topology"] == "four_four_xtx_plus_one"
    assert fits["slow-xtx"]["same"] is False and fits["slow-xtx"]["recommendation"] == "four_four_plus_one"
    said = " ".join(data["other_fits_said"])
    assert "the recommendation would be four_four_plus_one instead of four_four_xtx_plus_one" in said


# --------------------------------------------------------------------------- one topology: nothing to compare
def test_one_topology_asked_for_is_not_recommended() -> None:
    result = CliRunner().invoke(
        app, ["plan", "--host-map", str(EXAMPLE), "--topology", "4+2+2+xtx", "--time-limit", "0.2"]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "recommended:" not in text and "★" not in result.stdout
    assert "only 4+2+2+xtx was planned: nothing to compare it with, so no recommendation" in text
