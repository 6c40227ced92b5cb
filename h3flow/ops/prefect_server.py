"""The Prefect server ``h3flow start`` runs: Prefect's own ``prefect server start``, with SQLite's
write transactions begun IMMEDIATE, and the pools' GPU slots settled before it serves.

Why: Prefect's server opens its write transactions on SQLite as ``BEGIN DEFERRED`` (a read lock
first, the write lock at the first write). Under WAL, a transaction that read before another
connection wrote cannot upgrade: SQLite answers ``database is locked`` at once, without waiting
out its busy timeout; the server turns that into a 503 and Prefect's client waits 2 s, then 4 s,
8 s before it asks again. With a batch's writers (worker polls, flow-run states, GPU-slot
leases, logs) that is where small batches lost their seconds: 22 such answers in one 6-clip
demo batch, 8 of them on GPU-slot acquires (bench/orchestration.py, ``api_retryable_answers``).
``BEGIN IMMEDIATE`` takes the write lock up front, so a second writer waits its turn (SQLite's
busy timeout: 60 s on Prefect's server) instead of failing: SQLite's documented remedy, and
the mode Prefect itself already uses for its migrations and for the writes it knows to race
(``with_for_update``). Reads outside write transactions are untouched.

Settling the GPU slots (:func:`settle_gpu_slots`): Prefect's server takes a slot with a lease in
two steps — it commits the limit's ``active_slots + 1`` to its database, then writes the lease to
its lease storage (and gives one back the other way round: the count down, then the lease
gone). A server killed between the two leaves a slot taken that no lease holds: no holder
gives it back and no lease expires to free it, so every later clip of that pool waits for it
for good (``bench/slot_restart.py``: a server SIGKILLed 15 times under clients taking and giving
back a slot left one stuck 5 times as Prefect ships it, once with only the IMMEDIATE writes, never
with the settling; one hung a lab batch whose API host restarted). Before the restarted server
serves — nothing can take or give back a slot then — each of h3flow's GPU limits is set to
what the leases in the storage hold: a lease still held keeps its slot (its holder renews it
or gives it back), one whose holder died keeps it until Prefect's repossessor revokes it.

Everything else is Prefect's: the same CLI, arguments and settings; on PostgreSQL only the
settling. If a Prefect release no longer has the hook, the server runs as Prefect ships it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from h3flow.core.contracts import gpu_limit

log = logging.getLogger(__name__)


def immediate_sqlite_writes() -> bool:
    """Make Prefect's SQLite write transactions ``BEGIN IMMEDIATE``; False when the hook is gone."""
    try:
        from prefect.server.database.configurations import AioSqliteConfiguration
    except ImportError:
        return False
    original = getattr(AioSqliteConfiguration, "begin_transaction", None)
    if original is None or getattr(original, "h3flow_immediate", False):
        return original is not None

    @asynccontextmanager
    async def begin_transaction(self: Any, session: Any, with_for_update: bool = False) -> AsyncIterator[Any]:
        async with original(self, session, with_for_update=True) as transaction:
            yield transaction

    begin_transaction.h3flow_immediate = True  # type: ignore[attr-defined]
    AioSqliteConfiguration.begin_transaction = begin_transaction  # type: ignore[method-assign]
    return True


async def settle_gpu_slots() -> dict[str, tuple[int, int]]:
    """Set each h3flow GPU limit's taken slots to what the lease storage's leases hold; returns
    ``{limit: (before, after)}`` for those it changed. Only while no server serves this database."""
    import sqlalchemy as sa
    from prefect.server.concurrency.lease_storage import get_concurrency_lease_storage
    from prefect.server.database import provide_database_interface

    storage = get_concurrency_lease_storage()
    held: Counter[Any] = Counter()
    lease_ids = {*await storage.read_active_lease_ids(limit=100_000), *await storage.read_expired_lease_ids(100_000)}
    for lease_id in lease_ids:
        lease = await storage.read_lease(lease_id)
        if lease is not None and lease.metadata is not None:
            for limit_id in lease.resource_ids:
                held[limit_id] += lease.metadata.slots
    db = provide_database_interface()
    table = db.ConcurrencyLimitV2
    changed: dict[str, tuple[int, int]] = {}
    async with db.session_context(begin_transaction=True) as session:
        if not await session.run_sync(lambda sync: sa.inspect(sync.connection()).has_table(table.__tablename__)):
            return changed  # a first start: Prefect creates its tables after this
        ours = table.name.startswith(gpu_limit(""), autoescape=True)
        for limit in (await session.execute(sa.select(table).where(ours))).scalars():
            if limit.active_slots != held[limit.id]:
                changed[limit.name] = (limit.active_slots, held[limit.id])
                await session.execute(sa.update(table).where(table.id == limit.id).values(active_slots=held[limit.id]))
    return changed


def settle_gpu_slots_or_say_why() -> None:
    """:func:`settle_gpu_slots`, its changes logged; the server starts even when it fails."""
    try:
        changed = asyncio.run(settle_gpu_slots())
    except Exception as exc:  # noqa: BLE001 - the server starts anyway; it says why in its log
        log.warning("GPU slots not settled: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return
    for name, (before, after) in changed.items():
        log.warning(
            "%s: %d slot(s) taken, %d held by leases: set to %d (see h3flow.ops.prefect_server)",
            name,
            before,
            after,
            after,
        )


def main(argv: list[str]) -> int:
    """``python -m h3flow.ops.prefect_server server start ...``: Prefect's CLI, write transactions
    IMMEDIATE, the GPU slots settled before the server serves."""
    if not immediate_sqlite_writes():
        log.warning("this Prefect has no SQLite transaction hook: its server runs as shipped")
    if argv[:2] == ["server", "start"]:
        settle_gpu_slots_or_say_why()
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()  # exits with the CLI's own status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
