"""One encoder-assignment rule: config-adapt writes it, the planner and the dispatcher read it.

Over random partitions of Host A's GPUs (and random VRAM, and an extra host that may or
may not encode), config-adapt accepts exactly the topologies the planner can plan, and
the planner's encoder pools are the ones local.json names (which the pipeline's stages
run: ``config.pool(pool).encoder_pool``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3flow.config.adapt import adapt
from h3flow.config.models import load_host_map
from h3flow.core.errors import ConfigError
from h3flow.planner import PlanClip, Planner, RoundRobin, load_profile, simulate, validate
from h3flow.planner.search import build

ROOT = Path(__file__).resolve().parent.parent
HOST_MAP = load_host_map(ROOT / "examples" / "host-map.example.json")
PROFILE = load_profile()


def host_map(vram: list[float], xtx_encodes: bool, need: float):  # type: ignore[no-untyped-def]
    hosts = []
    for h in HOST_MAP.hosts:
        if h.name == "host-a":
            h = h.model_copy(
                update={"gpus": [g.model_copy(update={"vram_gb": v}) for g, v in zip(h.gpus, vram, strict=True)]}
            )
        elif h.name == "xtx" and xtx_encodes:
            h = h.model_copy(update={"roles": ["encode", "sample"]})
        hosts.append(h)
    model = HOST_MAP.model.model_copy(update={"encoder_vram_gb": need})
    return HOST_MAP.model_copy(update={"hosts": hosts, "model": model})


partitions = st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=8).filter(lambda p: sum(p) <= 8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    partition=partitions,
    xtx=st.booleans(),
    xtx_encodes=st.booleans(),
    vram=st.lists(st.sampled_from([8.0, 12.0, 16.0, 24.0]), min_size=8, max_size=8),
    need=st.sampled_from([12.0, 20.0, 32.0, 40.0, 64.0]),
)
def test_config_adapt_accepts_exactly_what_the_planner_can_plan(partition, xtx, xtx_encodes, vram, need) -> None:
    hm = host_map(vram, xtx_encodes, need)
    topology = "+".join(str(n) for n in sorted(partition, reverse=True)) + ("+xtx" if xtx else "")
    try:
        config = adapt(hm, topology)
    except ConfigError as exc:
        refused = build(hm, topology, PROFILE)
        assert not refused.feasible and refused.reason == str(exc)
        return
    candidate = build(hm, topology, PROFILE)
    assert candidate.feasible, candidate.reason
    assert candidate.resources is not None
    roles = {h.name: h.roles for h in hm.hosts}
    encoders = {p.name: p.encoder for p in candidate.resources.samplers}
    assert encoders == {p.name: p.encoder_pool for p in config.samplers}  # the planner reads local.json's
    for pool in config.samplers:
        encoder = config.pool(encoders[pool.name])
        assert encoder.vram_gb >= need and "encode" in roles[encoder.host]  # it can hold the encoder
        if pool.vram_gb >= need and "encode" in roles[pool.host]:
            assert encoders[pool.name] == pool.name  # a pool that can encode does
    if xtx and xtx_encodes:
        return  # the profile has no encode time for the XTX (the design's XTX never encodes)
    clips = [PlanClip.make(f"c{i}", "sd") for i in range(5)]
    planner = Planner(PROFILE, candidate.resources)
    schedule = simulate(clips, planner, RoundRobin(planner))
    assert validate(schedule, planner, clips) == []


def test_two_gpu_pools_borrow_a_four_gpu_pools_encoder_in_local_json_too() -> None:
    config = adapt(HOST_MAP, "4+2+2")
    assert {p.name: p.encoder_pool for p in config.samplers} == {"a0": "a0", "a1": "a0", "a2": "a0"}
    planner = Planner(PROFILE, build(HOST_MAP, "4+2+2", PROFILE).resources)
    assert {p.name: p.encoder for p in planner.resources.samplers} == {"a0": "a0", "a1": "a0", "a2": "a0"}


def test_a_topology_no_pool_can_encode_for_is_refused_by_both() -> None:
    with pytest.raises(ConfigError, match=r"topology '2\+2\+2\+2': no pool can hold the text encoder \(40 GB"):
        adapt(HOST_MAP, "2+2+2+2")
    refused = build(HOST_MAP, "2+2+2+2", PROFILE)
    assert not refused.feasible and "no pool can hold the text encoder" in (refused.reason or "")
