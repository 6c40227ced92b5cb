"""Memory-balanced layer partition: which GPU holds which layer of a pipelined model.

The A6 text encoder (Qwen3-VL 32B, ~64 GB in bf16) does not fit one 16 GB T10, so
its vision tower, embeddings and decoder layers are spread over N GPUs in order,
activations crossing a device boundary between consecutive layers. The GPUs do
not have the same free memory (the driver, a display, another process), so an even
layer count per GPU overflows the fullest one. This module picks, for layers in
model order and GPUs in order, the contiguous split that minimises the highest
*fill ratio* (bytes placed / bytes usable) over the GPUs: every GPU ends up about
equally full, relative to what it has free.

Pure and exact (a small dynamic programme, O(layers² x GPUs)); no torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import H3FlowError

MiB = 1 << 20


@dataclass(frozen=True)
class Partition:
    """The result: the GPU (position in ``free``) of every layer, and each GPU's load."""

    assignment: tuple[int, ...]
    load: tuple[int, ...]
    capacity: tuple[int, ...]

    @property
    def max_fill(self) -> float:
        """The highest load / capacity over the GPUs (what the split minimises)."""
        return max(
            (load / cap if cap else (0.0 if load == 0 else float("inf")))
            for load, cap in zip(self.load, self.capacity, strict=True)
        )

    def ranges(self) -> list[tuple[int, int]]:
        """Per GPU, the half-open range of layer indices it holds ((i, i) when none)."""
        out: list[tuple[int, int]] = []
        for device in range(len(self.load)):
            idx = [i for i, d in enumerate(self.assignment) if d == device]
            out.append((idx[0], idx[-1] + 1) if idx else (0, 0))
        return out

    def boundaries(self) -> list[int]:
        """Indices of layers whose input arrives from another GPU (activations move there)."""
        return [i for i in range(1, len(self.assignment)) if self.assignment[i] != self.assignment[i - 1]]


def partition_layers(
    layer_bytes: Sequence[int],
    free_bytes: Sequence[int],
    *,
    reserve_bytes: int | Sequence[int] = 0,
) -> Partition:
    """Split layers (in order) into contiguous runs, one per GPU (in order), balancing fill.

    ``free_bytes[g]`` is GPU g's free memory; ``reserve_bytes`` (one value or one per
    GPU) is kept back on each for activations and the CUDA context. A GPU may get no
    layer. Raises :class:`H3FlowError` when the layers cannot fit at all.
    """
    sizes = [int(s) for s in layer_bytes]
    if not sizes:
        raise H3FlowError("nothing to partition: the model has no layers")
    if not free_bytes:
        raise H3FlowError("nothing to partition onto: no GPU given")
    if any(s < 0 for s in sizes):
        raise H3FlowError("layer sizes must be >= 0")
    reserves = (
        [int(reserve_bytes)] * len(free_bytes) if isinstance(reserve_bytes, int) else [int(r) for r in reserve_bytes]
    )
    if len(reserves) != len(free_bytes):
        raise H3FlowError(f"{len(reserves)} reserve values for {len(free_bytes)} GPUs")
    capacity = [max(0, int(f) - r) for f, r in zip(free_bytes, reserves, strict=False)]
    total = sum(sizes)
    if total > sum(capacity):
        raise H3FlowError(
            f"the model needs {total / MiB:.0f} MiB but the {len(capacity)} GPU(s) have "
            f"{sum(capacity) / MiB:.0f} MiB usable (free minus reserve)"
        )
    biggest = max(range(len(sizes)), key=sizes.__getitem__)
    if sizes[biggest] > max(capacity):
        raise H3FlowError(
            f"layer {biggest} needs {sizes[biggest] / MiB:.0f} MiB, more than any GPU has usable "
            f"({max(capacity) / MiB:.0f} MiB)"
        )

    n, k = len(sizes), len(capacity)
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)

    def fill(g: int, i: int, j: int) -> float:
        load = prefix[j] - prefix[i]
        if load == 0:
            return 0.0
        return load / capacity[g] if capacity[g] else float("inf")

    inf = float("inf")
    # best[g][j]: the lowest max-fill placing layers [0, j) on GPUs [0, g].
    best = [[inf] * (n + 1) for _ in range(k)]
    cut = [[0] * (n + 1) for _ in range(k)]
    for j in range(n + 1):
        best[0][j] = fill(0, 0, j)
    for g in range(1, k):
        for j in range(n + 1):
            for i in range(j + 1):  # GPU g holds [i, j)
                value = max(best[g - 1][i], fill(g, i, j))
                # Ties keep the first (smallest) i found, so the result is deterministic.
                if value < best[g][j] - 1e-12:
                    best[g][j], cut[g][j] = value, i
    if best[k - 1][n] > 1.0:  # it fits in total, but not as runs of whole layers in order
        raise H3FlowError(f"the {n} layers cannot be split in order over these {k} GPUs without overfilling one")

    assignment = [0] * n
    j = n
    for g in range(k - 1, 0, -1):
        i = cut[g][j]
        for layer in range(i, j):
            assignment[layer] = g
        j = i
    load = [0] * k
    for layer, g in enumerate(assignment):
        load[g] += sizes[layer]
    return Partition(tuple(assignment), tuple(load), tuple(capacity))
