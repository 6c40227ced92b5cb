"""The load relaxation solved in a thread beside the search: it proves what a plain solve proves, a stopped one
keeps a sound bound and its best counts, and no slice leaves it running."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from h3flow.config.models import load_host_map
from h3flow.planner import PlanClip, Planner
from h3flow.planner.best import Search
from h3flow.planner.instance import Instance
from h3flow.planner.profile import load_profile
from h3flow.planner.relax import Proof, relaxed_makespan, solve_relaxation
from h3flow.planner.search import build

ROOT = Path(__file__).resolve().parent.parent
PROFILE = load_profile()
PLANNER = Planner(
    PROFILE, build(load_host_map(ROOT / "examples" / "host-map.example.json"), "4+2+2+xtx", PROFILE).resources
)


def mixed(n: int, seed: int) -> list[PlanClip]:
    rng = random.Random(seed)
    return [PlanClip.make(f"m{i:02d}", rng.choice(["sd", "hd"]), rng.choice([2.0, 5.0, 8.0])) for i in range(n)]


def test_a_proof_run_to_its_end_proves_what_a_plain_solve_proves() -> None:
    inst = Instance.of(PLANNER, mixed(20, 3101))
    plain = solve_relaxation(inst, 60.0)
    assert plain.optimal
    proof = Proof(inst, 60.0)
    assert proof.wait(60.0)
    ended = proof.result()
    assert ended.optimal
    assert abs(ended.bound - plain.bound) < 1e-6
    assert ended.counts is not None and abs(relaxed_makespan(inst, ended.counts) - plain.value) < 1.0


def test_a_stopped_proof_keeps_a_sound_bound_and_the_counts_it_found() -> None:
    inst = Instance.of(PLANNER, mixed(40, 3102))
    optimum = solve_relaxation(inst, 0.5).value  # a solution of the relaxation: no bound is above it
    proof = Proof(inst, 60.0)
    assert proof.found.wait(30.0)
    seen = proof.counts
    assert seen is not None and [sum(col) for col in zip(*seen, strict=True)] == [
        inst.kind.count(k) for k in range(max(inst.kind) + 1)
    ]
    stopped = proof.result()  # long before its 60 s
    assert not stopped.optimal
    assert stopped.bound <= optimum + 1e-6
    assert stopped.counts is not None


def test_no_slice_leaves_its_relaxation_running() -> None:
    search = Search(PLANNER, mixed(40, 3103))
    for seconds in (0.3, 0.2):
        search.step(seconds)
        assert not [t for t in threading.enumerate() if t.name == "h3flow-relaxation"]
    assert search.best.proven <= search.best.schedule.makespan + 1e-6


def test_a_failure_in_the_thread_is_raised_in_the_caller() -> None:
    inst = Instance.of(PLANNER, mixed(8, 3104))
    proof = Proof(inst, 5.0, hint=[[1]])  # a hint of the wrong shape: the model cannot be built
    assert proof.found.wait(5.0)
    with pytest.raises(IndexError):
        proof.result()


def test_a_large_batch_relaxation_fully_linearized_stays_sound() -> None:
    """From FULL_LP_FROM clips CP-SAT linearizes every constraint: its bound is still below an independent
    schedule (the reference local search, none of the planner's code) and below its own solution's value."""
    from h3flow.planner.relax import FULL_LP_FROM
    from tests.planner_reference import plain_local_search

    clips = mixed(FULL_LP_FROM + 3, 3104)
    inst = Instance.of(PLANNER, clips)
    relaxed = solve_relaxation(inst, 2.0)
    assert relaxed.counts is not None
    assert relaxed.bound <= relaxed_makespan(inst, relaxed.counts) + 1e-6
    assert relaxed.bound <= plain_local_search(PLANNER, clips, seconds=1.0, seed=0).makespan + 1e-6


def test_a_proof_that_turns_to_raising_its_bound_stays_sound_and_keeps_its_counts() -> None:
    """Past TURN's size a proof not proven early goes on with CP-SAT's bound search: stopped there (or run to
    its end), its bound is still below an independent schedule and its own counts' value, and the counts it had
    are kept."""
    from h3flow.planner.relax import TURN
    from tests.planner_reference import plain_local_search

    clips = mixed(TURN[0] + 9, 3105)
    inst = Instance.of(PLANNER, clips)
    reference = plain_local_search(PLANNER, clips, seconds=1.0, seed=0).makespan
    for ends in (False, True):
        proof = Proof(inst, 2.0)
        proof.wait(2.0 if ends else 1.0)  # stopped in the bound search (1 s > 0.2 x 2 s) or run to its end
        relaxed = proof.result()
        assert not [t for t in threading.enumerate() if t.name == "h3flow-relaxation"]
        assert relaxed.counts is not None and proof.counts is not None
        assert [sum(col) for col in zip(*relaxed.counts, strict=True)] == [
            inst.kind.count(k) for k in range(max(inst.kind) + 1)
        ]
        assert relaxed.bound <= relaxed_makespan(inst, relaxed.counts) + 1e-6
        assert relaxed.bound <= reference + 1e-6


def relaxations() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "h3flow-relaxation"]


def test_a_relaxation_kept_across_slices_goes_on_until_settled() -> None:
    """``step(prove_until=...)``: the slice's relaxation is not restarted by the next slice (one proof goes on
    across both) and runs until ``settle()``, which keeps its bound."""
    search = Search(PLANNER, mixed(40, 3106))
    until = time.perf_counter() + 60.0
    search.step(0.3, prove_until=until)
    proof = search._proof
    assert proof is not None and not proof.done and relaxations()
    search.step(0.2, prove_until=until)
    assert search._proof is proof  # the same solve, not a new one
    before = search.best.proven
    search.settle()
    assert search._proof is None and proof.done and not relaxations()
    assert before <= search.best.proven <= search.best.schedule.makespan + 1e-6


def test_planning_every_topology_leaves_only_the_leading_relaxation_running() -> None:
    from h3flow.planner.topologies import leading, plan_all

    hm = load_host_map(ROOT / "examples" / "host-map.example.json")
    cands = [build(hm, name, PROFILE) for name in ("4+2+2", "4+2+2+xtx")]
    clips = mixed(36, 3107)
    plan_all(cands, clips, PROFILE, "best", seconds=0.6, threshold=0.15)
    assert not relaxations()
    evals = plan_all(cands, clips, PROFILE, "best", seconds=0.6, threshold=0.15, prove_until=time.perf_counter() + 60)
    lead = leading(evals, 0.15)
    assert lead is not None and lead.search is not None
    running = [e.name for e in evals if e.search is not None and e.search._proof is not None]
    assert running in ([], [lead.name])  # [] only if its relaxation was proven within the 0.6 s
    lead.settle()
    assert not relaxations()


def test_a_slice_goes_on_to_the_feeding_relaxation_once_the_plain_one_is_proven() -> None:
    # the plain relaxation proves its optimum early in the slice; the second core then solves the one with the
    # feeding constraints (higher here) in the same slice, rather than idling until the next
    clips = mixed(16, 77001)
    inst = Instance.of(PLANNER, clips)
    plain, fed = solve_relaxation(inst, 30.0), solve_relaxation(inst, 30.0, feeding=True)
    assert plain.optimal and fed.optimal and fed.bound > plain.bound + 1.0
    search = Search(PLANNER, clips)
    best = search.step(3.0)
    assert best.proven >= fed.bound - 1e-6
    assert not relaxations()  # and the slice left nothing running


def test_the_local_search_starts_from_the_relaxations_counts_though_they_time_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the sequencers cannot see how an encoder pool's own clips and the encodes it lends fit together, so the
    # relaxation's counts (its best solution, near its bound) often time longer than the best start; yet the local
    # search from them ends shorter (development batches of 16-50 clips: 0.1-0.2% on average), so it starts there
    from h3flow.planner import improve as improve_module
    from h3flow.planner.best import counts_of
    from h3flow.planner.sequence import makespan

    real = improve_module.improve
    starts: list[tuple[list[list[int]], float, float]] = []  # counts, their makespan, the best's at the time

    def spy(inst: Instance, seqs: list[list[int]], **kwargs: object) -> tuple[list[list[int]], float]:
        starts.append((counts_of(inst, seqs), makespan(inst, seqs), search.best.schedule.makespan))
        return real(inst, seqs, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(improve_module, "improve", spy)
    search = Search(PLANNER, mixed(24, 3111))
    search.starts()  # the cheap starts: the best so far
    relaxed = solve_relaxation(search.inst, 60.0)  # proven in ~0.3 s: the same counts every time
    assert relaxed.optimal and relaxed.counts is not None
    search._relaxation_start(relaxed.counts)  # as a slice does with its relaxation's counts
    search._search(time.perf_counter() + 0.5)
    assert starts, "no local search ran"
    counts, start, best = starts[0]
    assert counts == relaxed.counts  # it started from the relaxation's counts
    assert start > best + 1.0  # ... though they timed longer than the best start
    assert search.best.schedule.makespan <= best  # and the result is never worse for it
