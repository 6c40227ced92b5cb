"""The Prefect server h3flow runs: SQLite write transactions begun IMMEDIATE (h3flow.ops.prefect_server).

Real SQLite through Prefect's own database configuration, in a subprocess each (the hook
changes a class of Prefect's for the whole process).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import sqlalchemy as sa
    from sqlalchemy import event
    from prefect.server.database.configurations import AioSqliteConfiguration

    if sys.argv[2] == "h3flow":
        from h3flow.ops.prefect_server import immediate_sqlite_writes
        assert immediate_sqlite_writes() and immediate_sqlite_writes()  # idempotent
    db = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{sys.argv[1]}")
    begins = []

    async def transaction(session, steps):
        async with db.begin_transaction(session):
            for step in steps:
                await step(session)

    async def main():
        engine = await db.engine()
        event.listen(engine.sync_engine, "before_cursor_execute",
                     lambda conn, cur, sql, *a: begins.append(sql) if sql.startswith("BEGIN") else None)
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE t (n INTEGER)"))
            await conn.execute(sa.text("INSERT INTO t VALUES (0)"))
        read, other_began = asyncio.Event(), asyncio.Event()

        async def first(session):  # reads, then writes after another connection wrote (as shipped) or asked to
            await session.execute(sa.text("SELECT n FROM t"))
            read.set()
            await other_began.wait()
            if sys.argv[2] == "shipped":
                await other
            await session.execute(sa.text("UPDATE t SET n = n + 1"))

        async def second():
            await read.wait()
            other_began.set()
            async with await db.session(engine) as session:
                await transaction(session, [lambda s: s.execute(sa.text("UPDATE t SET n = n + 10"))])

        other = asyncio.ensure_future(second())
        try:
            async with await db.session(engine) as session:
                await transaction(session, [first])
            await other
        except sa.exc.OperationalError as exc:
            print("error:", exc.orig)
        async with engine.connect() as conn:
            print("n =", (await conn.execute(sa.text("SELECT n FROM t"))).scalar())
        print("begins:", sorted(set(begins)))
        await engine.dispose()

    asyncio.run(main())
    """
)


def run(tmp_path: Path, mode: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / f"{mode}.db"), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_prefects_deferred_write_fails_at_once_when_another_connection_wrote_after_its_read(tmp_path: Path) -> None:
    """The failure the hook removes, on this Prefect as shipped: no busy wait, 'database is locked'."""
    out = run(tmp_path, "shipped")
    assert "error: database is locked" in out
    assert "n = 10" in out  # the other connection's write stands; the first transaction's is lost
    assert "begins: ['BEGIN DEFERRED']" in out


def test_h3flows_server_begins_write_transactions_immediate_and_both_writes_land(tmp_path: Path) -> None:
    out = run(tmp_path, "h3flow")
    assert "error" not in out
    assert "n = 11" in out  # the second writer waited for the first one's commit, then wrote
    assert "begins: ['BEGIN IMMEDIATE']" in out
