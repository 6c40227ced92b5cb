"""A pool's GPU slot: one clip at a time on the pool's devices, across every process.

The slot is a global concurrency limit of Prefect (``h3flow-gpu-<pool>``, limit 1, on its
Concurrency page), so a second worker on the same pool waits for it too. Taking and
giving back that slot are writes on the Prefect server; on SQLite under a batch's load
one such write takes seconds (measured in a tiny batch: the acquire was 80 % of a clip
flow run's time, ~3 s per clip, against 0.07 s on an idle server). A pool's clips all
run in its worker's process, so the process takes Prefect's slot once, when its first
clip asks, and keeps it while any clip of the pool is waiting or running here; the clips
hand the GPUs on through a lock in the process, with no call. The slot goes back to
Prefect when the last of them is done; a process that died frees it when its lease,
renewed while held, runs out (``GPU_LEASE_S``). A clip that waits longer than
``SLOT_PATIENCE_S`` says so in its run's log, with the command that frees a slot left taken
(a holder that is gone frees it well before: its lease runs out).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from h3flow.core.contracts import gpu_limit
from h3flow.core.runlog import run_logger

log = logging.getLogger(__name__)

GPU_LEASE_S = 60.0  # Prefect's shortest lease: a holder that died frees the slot within about this long
SLOT_PATIENCE_S = 2 * GPU_LEASE_S  # a wait this long is said in the run's log, and again after as long


@dataclass
class Holding:
    """One stretch of holding Prefect's slot: from the first clip that asked to the last one done."""

    held: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class PoolSlot:
    pool: str
    users: int = 0  # the pool's clips in this process, waiting or running
    turn: threading.Lock = field(default_factory=threading.Lock)  # the GPUs, one clip at a time
    holding: Holding = field(default_factory=Holding)
    holder: threading.Thread | None = None

    def begin(self) -> None:
        """Start a thread that takes Prefect's slot (once the previous holder let go) and keeps it."""
        previous, self.holding = self.holder, Holding()
        context = contextvars.copy_context()  # the asking clip's Prefect settings (API URL, credential)
        self.holder = threading.Thread(
            target=context.run,
            args=(self.hold, previous, self.holding),
            name=f"h3flow-gpu-{self.pool}",
            daemon=True,
        )
        self.holder.start()

    def hold(self, previous: threading.Thread | None, holding: Holding) -> None:
        from prefect.concurrency.sync import concurrency

        if previous is not None:
            previous.join()  # its release first: an acquire while it holds is refused and waits a Retry-After
        try:
            with concurrency(
                gpu_limit(self.pool),
                occupy=1,
                strict=True,
                lease_duration=GPU_LEASE_S,
                raise_on_lease_renewal_failure=False,
            ):
                holding.held.set()
                holding.done.wait()
        except Exception as exc:  # noqa: BLE001 - told to the clips waiting for it (API away, limit gone)
            holding.error = exc
        finally:
            if not holding.held.is_set():
                holding.error = holding.error or RuntimeError(f"the GPU slot of pool {self.pool} was not taken")
                holding.held.set()


_slots: dict[str, PoolSlot] = {}
_guard = threading.Lock()


@contextlib.contextmanager
def gpu_slot(pool: str, patience: float = SLOT_PATIENCE_S) -> Iterator[None]:
    """Hold ``pool``'s GPUs for one clip's GPU stages; a wait for Prefect's slot past ``patience`` is logged."""
    with _guard:
        slot = _slots.setdefault(pool, PoolSlot(pool))
        slot.users += 1
        if slot.users == 1:
            slot.begin()
        holding = slot.holding
    try:
        waited = 0.0
        while not holding.held.wait(patience):
            waited += patience
            run_logger(log).warning(
                "waiting %.0f s for pool %s's GPU slot: Prefect's limit %s is taken by another holder. If no clip of "
                "pool %s runs anywhere, free it: `prefect gcl update %s --active-slots 0` (or the UI's Concurrency page)",
                waited,
                pool,
                gpu_limit(pool),
                pool,
                gpu_limit(pool),
            )
        if holding.error is not None:
            raise holding.error
        with slot.turn:
            yield
    finally:
        with _guard:
            slot.users -= 1
            if slot.users == 0:
                holding.done.set()
