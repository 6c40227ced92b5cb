"""The memory-balanced layer partition (pure function): exact, contiguous, fitting."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h3flow.core.errors import H3FlowError
from h3flow_nodes.partition import MiB, partition_layers


def brute_force_best(sizes: list[int], caps: list[int]) -> float:
    """The lowest max fill over every contiguous split (GPUs may be empty)."""
    n, k = len(sizes), len(caps)
    best = float("inf")
    for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
        bounds = [0, *cuts, n]
        fills = []
        for g in range(k):
            load = sum(sizes[bounds[g] : bounds[g + 1]])
            fills.append(0.0 if load == 0 else (load / caps[g] if caps[g] else float("inf")))
        best = min(best, max(fills))
    return best


def test_equal_gpus_get_equal_shares() -> None:
    part = partition_layers([100] * 8, [1000] * 4)
    assert part.assignment == (0, 0, 1, 1, 2, 2, 3, 3)
    assert part.load == (200, 200, 200, 200)
    assert part.ranges() == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert part.boundaries() == [2, 4, 6]
    assert part.max_fill == pytest.approx(0.2)


def test_fuller_gpu_gets_fewer_layers() -> None:
    # GPU 1 has a display and a stray process: half the free memory of the others.
    part = partition_layers([1] * 10, [8, 4, 8])
    loads = dict(enumerate(part.load))
    assert loads[1] < loads[0] and loads[1] < loads[2]
    assert part.max_fill == pytest.approx(brute_force_best([1] * 10, [8, 4, 8]))
    assert sum(part.load) == 10


def test_qwen3vl_32b_over_four_t10s() -> None:
    """The design's A6 layout: vision tower + embeddings + 64 decoder layers + norm, 4 x 16 GB."""
    vision, embed, layer, norm = 1150 * MiB, 1300 * MiB, 400 * MiB, 1 * MiB  # int8 Qwen3-VL 32B (~28 GB)
    sizes = [vision, embed, *([layer] * 64), norm]
    free = [15_000 * MiB, 15_100 * MiB, 14_600 * MiB, 15_100 * MiB]
    part = partition_layers(sizes, free, reserve_bytes=1536 * MiB)
    assert part.assignment[0] == 0 and part.assignment[-1] == 3  # order kept: vision first, norm last
    assert list(part.assignment) == sorted(part.assignment)  # contiguous runs
    assert all(load <= cap for load, cap in zip(part.load, part.capacity, strict=False))
    assert part.max_fill == pytest.approx(brute_force_best_fast(sizes, list(part.capacity)), rel=1e-9)
    assert len(part.boundaries()) == 3  # activations cross a GPU boundary three times


def brute_force_best_fast(sizes: list[int], caps: list[int]) -> float:
    """Binary search on the fill ratio with a greedy check (an independent method)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        g, load = 0, 0
        ok = True
        for s in sizes:
            while g < len(caps) and load + s > mid * caps[g]:
                g, load = g + 1, 0
            if g == len(caps):
                ok = False
                break
            load += s
        lo, hi = (lo, mid) if ok else (mid, hi)
    return hi


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=7),
    caps=st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=4),
)
def test_matches_brute_force(sizes: list[int], caps: list[int]) -> None:
    fits = sum(sizes) <= sum(caps) and max(sizes) <= max(caps)
    if not fits:
        with pytest.raises(H3FlowError):
            partition_layers(sizes, caps)
        return
    best = brute_force_best(sizes, caps)
    if best > 1.0:  # fits in total, but no in-order split of whole layers does
        with pytest.raises(H3FlowError):
            partition_layers(sizes, caps)
        return
    part = partition_layers(sizes, caps)
    assert part.max_fill == pytest.approx(best)
    assert len(part.assignment) == len(sizes)
    assert list(part.assignment) == sorted(part.assignment)
    assert all(load <= cap for load, cap in zip(part.load, part.capacity, strict=False))


def test_too_big_is_one_clear_line() -> None:
    with pytest.raises(H3FlowError, match=r"needs 40 MiB but the 2 GPU\(s\) have 30 MiB usable"):
        partition_layers([20 * MiB, 20 * MiB], [20 * MiB, 20 * MiB], reserve_bytes=5 * MiB)
    with pytest.raises(H3FlowError, match=r"layer 1 needs 30 MiB, more than any GPU"):
        partition_layers([1 * MiB, 30 * MiB], [20 * MiB, 20 * MiB])
    with pytest.raises(H3FlowError, match="3 reserve values for 2 GPUs"):
        partition_layers([1], [10, 10], reserve_bytes=[0, 0, 0])
    with pytest.raises(H3FlowError, match="no layers"):
        partition_layers([], [10])
