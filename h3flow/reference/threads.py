"""Thread count for small tensor work.

With OpenMP, every small op pays a barrier across all threads; when the cores are shared
(the 2-core demo machine with a Prefect server and workers beside it) a descheduled
thread makes each barrier wait a time slice. Measured on the build machine under load:
sampling a tiny clip took 1.2 s with 2 threads and 0.1 s with 1. Small jobs therefore
run single-threaded; large ones keep torch's setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

SMALL_WORK = 1 << 20  # elements: a tiny clip's sampler state (1e5) is small, an SD clip's (1.06e6) is not


@contextlib.contextmanager
def threads_for(elements: int) -> Iterator[None]:
    """Run the body with one thread if ``elements`` is small, restoring the setting after."""
    before = torch.get_num_threads()
    if elements < SMALL_WORK and before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
