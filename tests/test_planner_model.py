"""The planner's parts: profile lookups and scaling, resources, the policy API, bounds, live plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from h3flow.config.adapt import adapt
from h3flow.config.models import load_host_map
from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError
from h3flow.pipeline import plan as live
from h3flow.pipeline.manifest import new_manifest
from h3flow.planner import (
    EarliestFinish,
    PlanClip,
    Planner,
    Resources,
    RoundRobin,
    State,
    load_profile,
    lower_bound,
    make_policy,
    simulate,
)
from h3flow.planner.search import build, candidates, partitions, topology_names

ROOT = Path(__file__).resolve().parent.parent
HOST_MAP = load_host_map(ROOT / "examples" / "host-map.example.json")
PROFILE = load_profile()


def planner_for(topology: str) -> Planner:
    return Planner(PROFILE, Resources.from_config(adapt(HOST_MAP, topology)))


# --------------------------------------------------------------------------- profile
def test_amdahl_fills_in_degrees_the_profile_does_not_list() -> None:
    f, how = PROFILE.serial_fraction("T10")
    assert f == pytest.approx(0.1948, abs=5e-4) and "degrees 4 and 8" in how
    listed = PROFILE.sample("T10", 4, "sd", "test")
    assert listed.seconds == 76.61 and listed.modelled is None
    two = PROFILE.sample("T10", 2, "sd", "test")
    # S(d) = S1 (f + (1-f)/d): from S(4) = 76.61 -> S1 = 76.61 / (f + (1-f)/4)
    s1 = 76.61 / (f + (1 - f) / 4)
    assert two.seconds == pytest.approx(s1 * (f + (1 - f) / 2), rel=1e-9) and "Amdahl" in two.modelled
    assert 76.61 < two.seconds < 2 * 76.61  # sub-linear: two cards lose less than half the speed
    eight_hd = PROFILE.sample("T10", 8, "hd", "test")
    assert eight_hd.seconds < 235.34 and eight_hd.modelled


def test_longer_clips_and_slower_links_take_longer() -> None:
    planner = planner_for("four_four_plus_one")
    a0 = planner.resources.pool("a0")
    five, ten = PlanClip.make("x", "sd", 5), PlanClip.make("y", "sd", 10)
    t5, t10 = planner.sampler_times(five, a0), planner.sampler_times(ten, a0)
    assert t10.encode == t5.encode  # one prompt, one image: encoding does not scale
    # sampling grows faster than the latent frames (72 for 10 s, 37 for 5 s): attention is quadratic in tokens
    curve = PROFILE.curve("T10")
    assert curve.fixed == 0 and curve.quadratic > 0
    n5, n10 = 37 * 26 * 46, 72 * 26 * 46
    assert t10.sample / t5.sample == pytest.approx(curve(n10) / curve(n5))
    assert 72 / 37 < t10.sample / t5.sample < (72 / 37) ** 2
    assert t10.handoff / t5.handoff == pytest.approx(PROFILE.latent_bytes("sd", ten.frames) / 4_301_184)
    link = planner.resources.links[0]
    slow = type(link)(link.name, link.source, link.target, gbit_s=0.1)
    sd_bytes = 4 * (24 * 37 * 26 * 46 + 32 * 2 * 207)  # H3's SD latent: video + audio, fp32 = 4.30 MB
    assert PROFILE.latent_bytes("sd", five.frames) == sd_bytes == 4_301_184
    assert planner.transfer_time(five, link) == pytest.approx(0.69 + sd_bytes * 8 / 10e9)
    assert planner.transfer_time(five, slow) == pytest.approx(0.69 + sd_bytes * 8 / 0.1e9)


# --------------------------------------------------------------------------- resources
def test_pools_that_cannot_hold_the_encoder_borrow_one_that_can() -> None:
    xtx = planner_for("four_four_xtx_plus_one").resources
    assert {p.name: p.encoder for p in xtx.samplers} == {"a0": "a0", "a1": "a1", "xtx": "a0"}
    mixed = planner_for("4+2+2").resources
    assert {p.name: (p.degree, p.encoder) for p in mixed.samplers} == {
        "a0": (4, "a0"),
        "a1": (2, "a0"),
        "a2": (2, "a0"),
    }
    with pytest.raises(ConfigError, match="no pool can hold the text encoder"):
        planner_for("2+2")


def test_search_enumerates_partitions_and_rejects_unknown_names() -> None:
    assert (4, 2, 2) in partitions(8) and (8,) in partitions(8) and all(sum(p) <= 8 for p in partitions(8))
    assert len(partitions(8)) == 35
    names = topology_names(HOST_MAP, "search")
    assert "4+2+2+xtx" in names and "8" in names and len(names) == 70
    assert build(HOST_MAP, "4+4", PROFILE).name == "four_four_plus_one"
    with pytest.raises(ConfigError, match="unknown topology"):
        topology_names(HOST_MAP, "four_by_four")


def test_search_tries_every_set_of_decoder_hosts() -> None:
    second = HOST_MAP.hosts[2].model_copy(update={"name": "host-c", "address": "10.10.0.4"})
    hm = HOST_MAP.model_copy(update={"hosts": [*HOST_MAP.hosts, second]})
    found = {c.name: c.decoders for c in candidates(hm, "search", PROFILE) if c.canonical == "4+4" and c.feasible}
    assert found == {
        "four_four_plus_one@host-b": {"b"},
        "four_four_plus_one@host-c": {"c"},
        "four_four_plus_one": {"b", "c"},
    }


def test_a_gpu_model_the_profile_does_not_know_is_named() -> None:
    hm = HOST_MAP
    odd = hm.model_copy(
        update={
            "hosts": [
                h.model_copy(update={"gpus": [g.model_copy(update={"model": "T4"}) for g in h.gpus]})
                if h.name == "host-a"
                else h
                for h in hm.hosts
            ]
        }
    )
    planner = Planner(PROFILE, Resources.from_config(adapt(odd, "four_four_plus_one")))
    with pytest.raises(ConfigError, match=r"no entry gpu\.T4 \(needed for pool a0"):
        planner.check([PlanClip.make("c")])


def test_the_embedded_default_has_a_cpu_profile() -> None:
    from h3flow.config.adapt import local_host_map

    config = adapt(local_host_map(Path("/tmp/h3flow-planner-test"), base_port=23400), "one_one_plus_one")
    planner = Planner(PROFILE, Resources.from_config(config))
    planner.check([PlanClip.make("c", "tiny")])


# --------------------------------------------------------------------------- the policy API
def test_earliest_finish_uses_the_live_state() -> None:
    planner = planner_for("four_four_xtx_plus_one")
    policy = make_policy("earliest-finish", planner)
    clip = PlanClip.make("c", "hd")
    assert policy.choose_pool(clip, State()) == "a0"  # one HD clip alone is sampled soonest on a 4 x T10 pool
    assert policy.choose_pool(clip, State(gone={"a0"})) == "a1"
    assert policy.choose_pool(clip, State(busy_until={"a0": 100.0, "a1": 100.0}, encode_free={"a0": 0.0})) == "xtx"
    busy = {"a0": 300.0, "a1": 0.0, "xtx": 400.0}
    assert policy.choose_pool(clip, State(busy_until=busy)) == "a1"
    assert policy.choose_pool(clip, State(busy_until=busy, full={"a1"})) is None  # wait: a1 is still best
    slow = {("a1", "sample", "hd"): 2000.0}  # a1 was measured far slower than its profile
    assert policy.choose_pool(clip, State(busy_until=busy, measured=slow)) == "a0"
    with pytest.raises(ConfigError, match="every sampler pool is gone"):
        policy.choose_pool(clip, State(gone={"a0", "a1", "xtx"}))


def test_round_robin_takes_turns_skips_gone_pools_and_waits_for_a_full_one() -> None:
    policy = RoundRobin(planner_for("four_four_xtx_plus_one"))
    clip = PlanClip.make("c")
    assert [policy.choose_pool(clip, State()) for _ in range(4)] == ["a0", "a1", "xtx", "a0"]
    assert policy.choose_pool(clip, State(full={"a1"})) is None
    assert policy.choose_pool(clip, State(gone={"a1"})) == "xtx"


def test_a_simulation_accepts_a_batch_of_real_clips() -> None:
    planner = planner_for("four_four_plus_one")
    clips = [Clip(id=f"k{i}", prompt="p", image=Path("x.png"), spec="sd") for i in range(4)]
    schedule = simulate(clips, planner, EarliestFinish(planner))
    assert sorted(schedule.pool_of.values()) == ["a0", "a0", "a1", "a1"]
    with pytest.raises(ConfigError, match="unique"):
        simulate(clips + clips[:1], planner, EarliestFinish(planner))


# --------------------------------------------------------------------------- bounds
def test_the_lower_bound_is_the_split_point_formula_for_identical_clips() -> None:
    planner = planner_for("four_four_plus_one")
    clips = [PlanClip.make(f"c{i}", "sd") for i in range(6)]
    t = planner.sampler_times(clips[0], planner.resources.pool("a0"))
    s, transfer = t.total, planner.transfer_time(clips[0], planner.resources.links[0])
    d = sum(planner.decoder_times(clips[0], planner.resources.decoders[0]))
    # t*(k): the k-th latent of two pools of period s is written at ceil(k / 2) * s; after it the
    # n - k + 1 latents still to come are decoded one after another
    want = max(-(-k // 2) * s + transfer + (6 - k + 1) * d for k in range(1, 7))
    bound = lower_bound(planner, clips)
    assert want == pytest.approx(3 * s + transfer + 2 * d)  # the design's 296.9 s: the last two arrive together
    assert bound.seconds == pytest.approx(want) and bound.binding == "split point"
    assert bound.clips_per_hour == pytest.approx(3600 * min(2 / s, 1 / d))
    many = [PlanClip.make(f"c{i}", "sd") for i in range(400)]
    assert lower_bound(planner, many).seconds >= 200 * s


# --------------------------------------------------------------------------- live runs
def test_a_live_run_gets_its_planned_stage_times_and_makespan() -> None:
    config = adapt(HOST_MAP, "four_four_plus_one")
    clips = [Clip(id=f"k{i}", prompt="p", image=Path("x.png"), spec="sd") for i in range(6)]
    manifest = new_manifest("run-1", "demo", clips, "local.json")
    plan = live.plan_for_manifest(manifest, config)
    assert plan is not None
    schedule = plan.schedule
    assert manifest.planned_makespan == pytest.approx(296.9, rel=0.005)
    rec = manifest.clips["k0"]
    assert set(rec.planned) == {"encode", "offload", "sample", "transfer", "decode"}
    assert rec.planned["encode"] == pytest.approx(13.06) and rec.planned["decode"] == pytest.approx(11.8)
    assert schedule is not None and schedule.makespan == pytest.approx(manifest.planned_makespan, abs=1e-3)
    tiny = new_manifest("run-2", "demo", [clips[0].model_copy(update={"spec": "tiny"})], "local.json")
    assert live.plan_for_manifest(tiny, config) is None and tiny.planned_makespan is None


# --------------------------------------------------------------------------- following the plan, live
def test_following_the_plan_reproduces_its_assignment_and_adapts_to_a_dead_pool() -> None:
    from h3flow.planner import FollowPlan, best_schedule, validate

    planner = planner_for("four_four_xtx_plus_one")
    clips = [PlanClip.make(f"m{i}", s, t) for i, (s, t) in enumerate([("hd", 5), ("sd", 5), ("sd", 2), ("hd", 8)] * 2)]
    plan = best_schedule(planner, clips, time_limit=0.5).schedule
    followed = simulate(clips, planner, FollowPlan.of(planner, plan))
    assert validate(followed, planner, clips) == []
    assert followed.pool_of == plan.pool_of  # the profile's times: nothing to adapt to
    assert followed.makespan <= plan.makespan * 1.05
    follow = FollowPlan.of(planner, plan)
    xtx_clip = next(c for c in clips if plan.pool_of[c.id] == "xtx")
    assert follow.choose_pool(xtx_clip, State(full={"xtx"})) is None  # waits for its planned pool
    assert follow.choose_pool(xtx_clip, State(gone={"xtx"})) in {"a0", "a1"}  # gone: earliest-finish decides
    a0_clip = next(c for c in clips if plan.pool_of[c.id] == "a0")
    t = {p: planner.sampler_times(a0_clip, planner.resources.pool(p)).total for p in ("a0", "a1")}
    uniform = {("a0", "sample", a0_clip.spec): t["a0"] * 1.5, ("a1", "sample", a0_clip.spec): t["a1"] * 1.5}
    assert (
        FollowPlan.of(planner, plan).choose_pool(a0_clip, State(measured=uniform)) == "a0"
    )  # all alike: the plan holds
    slow = {**uniform, ("a0", "sample", a0_clip.spec): t["a0"] * 5}  # a0 far slower than the others, against the plan
    assert FollowPlan.of(planner, plan).choose_pool(a0_clip, State(measured=slow)) != "a0"


def test_the_dispatchers_chooser_starts_from_the_plan() -> None:
    from h3flow.pipeline.dispatcher import LiveState, planner_chooser
    from h3flow.planner import best_schedule

    config = adapt(HOST_MAP, "four_four_xtx_plus_one")
    planner = Planner(PROFILE, Resources.from_config(config))
    clips = [
        Clip(id=f"k{i}", prompt="p", image=Path("x.png"), spec=s)
        for i, s in enumerate(["hd", "sd", "hd", "sd", "sd", "hd"])
    ]
    plan = best_schedule(planner, clips, time_limit=0.5).schedule
    choose = planner_chooser(config, plan)
    live = LiveState()
    for clip in clips:
        pool = plan.pool_of[clip.id]
        others = [p for p in ("a0", "a1", "xtx") if p != pool]
        assert choose(clip, others, live, 0.0) is None  # its planned pool is full: it waits
        assert choose(clip, ["a0", "a1", "xtx"], live, 0.0) == pool
    live.gone.add("xtx")
    on_xtx = next(c for c in clips if plan.pool_of[c.id] == "xtx")
    again = planner_chooser(config, plan)
    assert again(on_xtx, ["a0", "a1"], live, 0.0) in {"a0", "a1"}  # its planned pool is gone
