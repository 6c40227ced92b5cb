"""The planner's C core (``_fastseq.c``) against the Python code it speeds up.

Timing: for sequences the local search meets (its own random moves, from the heuristics'
schedules, on borrowing and plain topologies, one and two decoders) and cut-offs around the
current makespan, the C timing returns the same makespan and finish times to the last bit,
and cuts off exactly the same candidates. Search: the C late-acceptance search returns
valid sequences that are never longer than its start, and shorter ones on a batch where the
start is improvable. The build: ``AVAILABLE`` is true here (the test set-up has a compiler),
so a broken build fails here rather than silently falling back to Python.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from h3flow.config.models import load_host_map
from h3flow.planner import EarliestFinish, PlanClip, Planner, fastseq, simulate, validate
from h3flow.planner.improve import _clip_pools, _finish, _random_move, improve
from h3flow.planner.instance import Instance
from h3flow.planner.profile import load_profile
from h3flow.planner.search import build
from h3flow.planner.sequence import check, evaluate, from_schedule, makespan, to_schedule

ROOT = Path(__file__).resolve().parent.parent
HOST_MAP = load_host_map(ROOT / "examples" / "host-map.example.json")
PROFILE = load_profile()


def _two_decoders():  # type: ignore[no-untyped-def]
    second = HOST_MAP.hosts[2].model_copy(update={"name": "host-c", "address": "10.10.0.4"})
    return HOST_MAP.model_copy(update={"hosts": [*HOST_MAP.hosts, second]})


CASES = [
    (HOST_MAP, "4+2+2+xtx"),  # one encoder pool lends to three borrowers
    (HOST_MAP, "four_four_xtx_plus_one"),
    (HOST_MAP, "4+2+xtx"),
    (_two_decoders(), "four_four_plus_one"),  # latents go to the decoder that finishes them first
]


def _batch(n: int, seed: int) -> list[PlanClip]:
    rng = random.Random(seed)
    return [PlanClip.make(f"c{i:02d}", rng.choice(["sd", "hd"]), rng.choice([2.0, 5.0, 8.0])) for i in range(n)]


def _start(planner: Planner, clips: list[PlanClip]):  # type: ignore[no-untyped-def]
    inst = Instance.of(planner, clips)
    return inst, from_schedule(inst, simulate(clips, planner, EarliestFinish(planner)))


def test_the_c_core_was_built() -> None:
    assert fastseq.AVAILABLE, "h3flow/planner/_fastseq.c did not compile: `pip install -e .` needs gcc and Python.h"


@pytest.mark.parametrize(("host_map", "topology"), CASES, ids=[t for _, t in CASES])
def test_c_timing_equals_the_python_timing_to_the_last_bit(host_map, topology) -> None:  # type: ignore[no-untyped-def]
    planner = Planner(PROFILE, build(host_map, topology, PROFILE).resources)
    inst, current = _start(planner, _batch(24, 31))
    assert len(inst.decode[0]) == (2 if host_map is not HOST_MAP else 1)
    rng = random.Random(7)
    compared = cut = deadlocked = 0
    while compared < 1500:
        cand = _random_move(inst, current, _clip_pools(inst, current), _finish(inst, current), rng)
        if cand is None:
            continue
        compared += 1
        whole = makespan(inst, current)
        cutoff = rng.choice([float("inf"), whole * rng.uniform(0.98, 1.02)])
        py, c = evaluate(inst, cand, cutoff), fastseq.evaluate(inst, cand, cutoff)
        assert (py is None) == (c is None)
        if py is None:
            cut += cutoff < float("inf")
            deadlocked += evaluate(inst, cand) is None
            continue
        assert c is not None
        assert c[0] == py[1].makespan
        assert c[1] == py[1].finish
        if rng.random() < 0.3:
            current = cand
    assert cut > 50, "the comparison covered cut-off candidates"
    if inst.borrowers:
        assert deadlocked > 0, "... and deadlocked ones"


@pytest.mark.parametrize(("host_map", "topology"), CASES, ids=[t for _, t in CASES])
def test_c_search_returns_valid_sequences_never_longer_than_its_start(host_map, topology) -> None:  # type: ignore[no-untyped-def]
    planner = Planner(PROFILE, build(host_map, topology, PROFILE).resources)
    clips = _batch(30, 5)
    inst, start = _start(planner, clips)
    found, evaluations = fastseq.late_acceptance(inst, start, seconds=60, max_evals=20_000, seed=3, history=200)
    check(inst, found)
    assert evaluations > 10_000  # the evaluations bound it, not the time: reproducible
    assert makespan(inst, found) < makespan(inst, start)
    assert validate(to_schedule(inst, found, "local search"), planner, clips) == []
    again, _ = fastseq.late_acceptance(inst, start, seconds=60, max_evals=20_000, seed=3, history=200)
    assert again == found, "the same seed and budget give the same sequences"


def test_improve_uses_the_c_core_and_keeps_its_guarantees() -> None:
    planner = Planner(PROFILE, build(HOST_MAP, "4+2+2+xtx", PROFILE).resources)
    clips = _batch(40, 11)
    inst, start = _start(planner, clips)
    found, value = improve(inst, start, seconds=60, max_evals=40_000, seed=0)
    check(inst, found)
    assert value == pytest.approx(makespan(inst, found), abs=1e-6)
    assert makespan(inst, found) < makespan(inst, start)


def test_bad_sequences_are_refused_with_a_clear_error() -> None:
    planner = Planner(PROFILE, build(HOST_MAP, "4+2+2+xtx", PROFILE).resources)
    inst, start = _start(planner, _batch(6, 1))
    with pytest.raises(ValueError, match="one list per pool"):
        fastseq.evaluate(inst, start[:-1], float("inf"))
    with pytest.raises(ValueError, match="out of range"):
        fastseq.evaluate(inst, [[*start[0], 99], *start[1:]], float("inf"))
    with pytest.raises(ValueError, match="sampled once"):
        fastseq.evaluate(inst, [[], *start[1:]], float("inf"))


def test_without_the_c_core_improve_runs_its_python_search(monkeypatch: pytest.MonkeyPatch) -> None:
    # where no compiler was found at install time: the same guarantees from the Python code
    monkeypatch.setattr(fastseq, "AVAILABLE", False)
    monkeypatch.setattr(fastseq, "_fastseq", None)
    planner = Planner(PROFILE, build(HOST_MAP, "4+2+2+xtx", PROFILE).resources)
    inst, start = _start(planner, _batch(20, 11))
    found, value = improve(inst, start, seconds=60, max_evals=3_000, seed=0)
    check(inst, found)
    assert value == pytest.approx(makespan(inst, found), abs=1e-6)
    assert makespan(inst, found) < makespan(inst, start)
