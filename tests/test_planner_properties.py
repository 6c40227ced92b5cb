"""Property tests: every schedule — simulated, improved by local search, or from CP-SAT — passes
the independent validator and is no shorter than the analytic bound or the proven bound; the
planner's best schedule never loses to either heuristic it starts from."""

from __future__ import annotations

import copy
import random
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3flow.config.models import load_host_map
from h3flow.planner import (
    EarliestFinish,
    PlanClip,
    Planner,
    RoundRobin,
    StageRun,
    lower_bound,
    parse_profile,
    simulate,
    validate,
)
from h3flow.planner.best import best_schedule
from h3flow.planner.improve import improve
from h3flow.planner.instance import Instance
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile
from h3flow.planner.search import build
from h3flow.planner.sequence import evaluate, from_schedule, to_schedule
from h3flow.planner.solver import solve_cp

ROOT = Path(__file__).resolve().parent.parent
HOST_MAP = load_host_map(ROOT / "examples" / "host-map.example.json")
PROFILE = load_profile()
TOPOLOGIES = [
    "four_plus_one",
    "four_xtx_plus_one",
    "eight_plus_one",
    "eight_xtx_plus_one",
    "four_four_plus_one",
    "four_four_xtx_plus_one",
    "4+2+2+xtx",
    "4+2",
]
PLANNERS = {t: Planner(PROFILE, build(HOST_MAP, t, PROFILE).resources) for t in TOPOLOGIES}

clip_kinds = st.tuples(st.sampled_from(["sd", "hd"]), st.sampled_from([1.0, 2.0, 5.0, 5.0, 8.0, 12.0]))
batches = st.lists(clip_kinds, min_size=1, max_size=12).map(
    lambda kinds: [PlanClip.make(f"c{i:02d}", spec, seconds) for i, (spec, seconds) in enumerate(kinds)]
)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOLVED = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # CP-SAT in each


def _schedules(planner, clips):
    """Schedules of every kind the planner makes: both heuristics, local search from each, CP-SAT."""
    inst = Instance.of(planner, clips)
    out = []
    for policy in (RoundRobin, EarliestFinish):
        simulated = simulate(clips, planner, policy(planner))
        improved, _ = improve(inst, from_schedule(inst, simulated), seconds=5, max_evals=150)
        out += [simulated, to_schedule(inst, improved, "local search")]
    cp = solve_cp(inst, seconds=1.0, max_deterministic=0.1)
    if cp.sequences is not None:
        out.append(to_schedule(inst, cp.sequences, "CP-SAT"))
    return out, cp.bound


@SOLVED
@given(clips=batches, topology=st.sampled_from(TOPOLOGIES))
def test_every_schedule_is_valid_and_no_shorter_than_the_bounds(clips, topology) -> None:
    planner = PLANNERS[topology]
    bound = lower_bound(planner, clips).seconds
    schedules, proven = _schedules(planner, clips)
    for schedule in schedules:
        assert validate(schedule, planner, clips) == [], schedule.policy
        assert schedule.makespan >= bound - 1e-6, schedule.policy
        assert schedule.makespan >= proven - 1e-6, schedule.policy


@SOLVED
@given(clips=batches, topology=st.sampled_from(TOPOLOGIES))
def test_the_best_schedule_is_never_worse_than_the_heuristics_it_starts_from(clips, topology) -> None:
    planner = PLANNERS[topology]
    best = best_schedule(planner, clips, time_limit=0.2)
    assert validate(best.schedule, planner, clips) == []
    for heuristic in best.heuristics.values():
        assert best.schedule.makespan <= heuristic.makespan + 1e-9
    assert best.proven <= best.schedule.makespan + 1e-6


@FAST
@given(clips=batches, topology=st.sampled_from(TOPOLOGIES), seed=st.integers(0, 10_000), slack=st.floats(-0.2, 0.2))
def test_a_cut_off_evaluation_drops_only_schedules_that_end_after_it(clips, topology, seed, slack) -> None:
    """The local search times its candidates with a cut-off (its acceptance threshold): a candidate it
    drops unseen ends after the cut-off, and one it times is timed exactly as without it."""
    planner = PLANNERS[topology]
    inst = Instance.of(planner, clips)
    seqs = from_schedule(inst, simulate(clips, planner, EarliestFinish(planner)))
    rng = random.Random(seed)
    for seq in seqs:  # another order on each pool (borrowed encodes may then deadlock: both sides see it)
        rng.shuffle(seq)
    full = evaluate(inst, seqs)
    if full is None:
        assert evaluate(inst, seqs, cutoff=1e9) is None
        return
    cutoff = full[1].makespan * (1 + slack)
    cut = evaluate(inst, seqs, cutoff=cutoff)
    if cut is None:
        assert full[1].makespan > cutoff
    else:
        assert cut == full


def _random_profile(rng: random.Random) -> object:
    """The shipped profile with every time scaled by its own random factor (0.05x .. 20x)."""
    raw = tomllib.loads(DEFAULT_PROFILE.read_text())

    def scale(node: object) -> object:
        if isinstance(node, dict):
            return {k: scale(v) for k, v in node.items()}
        if isinstance(node, float) and not isinstance(node, bool):
            return node * rng.uniform(0.05, 20)
        return node

    out = copy.deepcopy(raw)
    out["gpu"] = scale(raw["gpu"])
    for gpu in out["gpu"].values():  # keep each GPU's sampling cost plausible: HD 1.1x .. 9x SD (tokens: 3.08x)
        sample = gpu.get("sample", {})
        if "sd" in sample and "hd" in sample:
            for degree in sample["hd"]:
                base = sample["sd"].get(degree, next(iter(sample["sd"].values())))
                sample["hd"][degree] = base * rng.uniform(1.1, 9.0)
    out["handoff"] = scale(raw["handoff"])
    out["transfer"] = scale(raw["transfer"])
    return out


@SOLVED
@given(seed=st.integers(0, 10_000), clips=batches, topology=st.sampled_from(TOPOLOGIES))
def test_schedules_stay_valid_and_bounded_under_random_profiles(seed, clips, topology) -> None:
    profile = parse_profile(_random_profile(random.Random(seed)))
    planner = Planner(profile, build(HOST_MAP, topology, profile).resources)
    bound = lower_bound(planner, clips).seconds
    schedules, proven = _schedules(planner, clips)
    for schedule in schedules:
        assert validate(schedule, planner, clips) == [], schedule.policy
        assert schedule.makespan >= max(bound, proven) - 1e-6, schedule.policy


def test_earliest_finish_beats_round_robin_on_a_mixed_batch() -> None:
    planner = PLANNERS["four_four_xtx_plus_one"]
    kinds = [("hd", 5.0), ("sd", 5.0), ("sd", 2.0), ("hd", 8.0), ("sd", 5.0), ("hd", 2.0), ("sd", 8.0), ("hd", 5.0)]
    clips = [PlanClip.make(f"m{i}", spec, s) for i, (spec, s) in enumerate(kinds)]
    design = simulate(clips, planner, RoundRobin(planner)).makespan
    better = simulate(clips, planner, EarliestFinish(planner)).makespan
    assert better < design * 0.9  # more than 10% sooner (docs/planner.md has the figures)


def test_on_seeded_random_mixed_batches_the_planner_beats_earliest_finish_often() -> None:
    rng = random.Random(7)
    wins = 0
    for _ in range(12):
        clips = [
            PlanClip.make(f"r{i}", rng.choice(["sd", "hd"]), rng.choice([2.0, 5.0, 8.0]))
            for i in range(rng.randint(4, 16))
        ]
        planner = PLANNERS[rng.choice(["four_four_xtx_plus_one", "eight_xtx_plus_one", "4+2+2+xtx"])]
        best = best_schedule(planner, clips, time_limit=0.3)
        wins += best.schedule.makespan < best.heuristics["earliest-finish"].makespan - 1e-6
    assert wins >= 8


# --------------------------------------------------------------------------- the validator can fail
@pytest.fixture(scope="module")
def good():
    planner = PLANNERS["four_four_xtx_plus_one"]
    clips = [PlanClip.make(f"v{i}", "sd") for i in range(5)]
    schedule = simulate(clips, planner, RoundRobin(planner))
    assert validate(schedule, planner, clips) == []
    return planner, clips, schedule


def _with(schedule, index: int, run: StageRun):
    runs = list(schedule.runs)
    runs[index] = run
    return replace(schedule, runs=runs)


def test_the_validator_catches_a_stage_shorter_than_its_profile_time(good) -> None:
    planner, clips, schedule = good
    i = next(i for i, r in enumerate(schedule.runs) if r.stage == "sample")
    r = schedule.runs[i]
    problems = validate(_with(schedule, i, replace(r, end=r.end - 5)), planner, clips)
    assert any("sample took" in p and "less than its profile time" in p for p in problems)


def test_the_validator_catches_overlap_and_broken_precedence(good) -> None:
    planner, clips, schedule = good
    decodes = [i for i, r in enumerate(schedule.runs) if r.stage == "decode"]
    a, b = schedule.runs[decodes[0]], schedule.runs[decodes[1]]
    moved = replace(b, start=a.start, end=a.start + (b.end - b.start))  # two decodes at once
    problems = validate(_with(schedule, decodes[1], moved), planner, clips)
    assert any("overlaps" in p for p in problems)
    assert any("decode starts" in p or "mux starts" in p for p in problems)


def test_the_validator_catches_a_stage_on_the_wrong_resource_and_a_missing_clip(good) -> None:
    planner, clips, schedule = good
    i = next(i for i, r in enumerate(schedule.runs) if r.stage == "encode" and schedule.pool_of[r.clip] == "xtx")
    wrong = replace(schedule.runs[i], resource="a1")
    assert any("encode on 'a1', want 'a0'" in p for p in validate(_with(schedule, i, wrong), planner, clips))
    assert any("clips scheduled" in p for p in validate(schedule, planner, [*clips, PlanClip.make("ghost")]))
