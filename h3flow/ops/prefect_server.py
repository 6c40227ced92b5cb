"""The Prefect server ``h3flow start`` runs: Prefect's own ``prefect server start``, with SQLite's
write transactions begun IMMEDIATE.

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

Everything else is Prefect's: the same CLI, arguments and settings; on PostgreSQL nothing
changes. If a Prefect release no longer has the hook, the server runs as Prefect ships it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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


def main(argv: list[str]) -> int:
    """``python -m h3flow.ops.prefect_server server start ...``: Prefect's CLI, write transactions IMMEDIATE."""
    if not immediate_sqlite_writes():
        log.warning("this Prefect has no SQLite transaction hook: its server runs as shipped")
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()  # exits with the CLI's own status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
