"""Thread count for small tensor work.

With OpenMP, every small op pays a barrier across all threads; when the cores are shared
(the 2-core demo machine with a Prefect server and workers beside it) a descheduled
thread makes each barrier wait a time slice. Measured on the build machine under load:
sampling a tiny clip took 1.2 s with 2 threads and 0.1 s with 1, an SD clip 1.3 s
against 0.9 s. Small jobs therefore run single-threaded; large ones keep torch's setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# elements: a tiny or SD clip's sampler state (1e5, 1.06e6) and SD decode chunks (1.8e6)
# run on one thread; HD's (3.3e6, 5.6e6) use torch's setting.
SMALL_WORK = 1 << 21


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
