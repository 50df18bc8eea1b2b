"""The health port's drain report reader on real Postgres: its own connection, its bounds.

One pool of one connection, opened on the first read and named
``lane-worker-report <release>``; concurrent callers share one read; a report
stuck behind a lock is cancelled by its ``statement_timeout`` (and the next read
tries again); closing the reader closes its connection.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, eventually, open_client, queue_of
from worker.daemon import report_cache
from worker.daemon.report_cache import ReportReader, application_name
from worker.db.pool import PoolOptions
from worker.db.store import Store
from worker.errors import ReportClosedError

RELEASE = "rel-r"
NAME = application_name("lane-worker-report", RELEASE)


def reader(database_url: str, **options: float) -> ReportReader:
    """A reader as the supervisor makes it (1 connection, a 5 s retry budget)."""
    pool = PoolOptions(url=database_url, max_size=1, application_name=NAME, retry_for_s=5)
    return ReportReader(pool, Store(SCHEMA), **options)


async def named_connections(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    """Return how many connections to this database carry the reader's application name."""
    return int(
        await conn.fetchval(
            "select count(*) from pg_stat_activity"
            " where datname = current_database() and application_name = $1",
            NAME,
        )
    )


async def test_one_lazy_connection_serves_every_caller(database_url: str) -> None:
    """No connection until the first read; then one, and one read for 30 callers at once."""
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}) as client:
        await client.submit("plain", {})
    conn = await connect(database_url)
    report = reader(database_url)
    try:
        assert await named_connections(conn) == 0
        views = await asyncio.gather(*(report.report() for _ in range(30)))
        assert report.reads == 1
        assert all(v == views[0] for v in views)
        assert [(v.queue, v.counts["fresh"]) for v in views[0]] == [(queue_of(RELEASE), 1)]
        assert await named_connections(conn) == 1
        await report.report()
        assert report.reads == 1  # reused while fresh
    finally:
        await report.close()
    try:

        async def closed() -> bool:
            return await named_connections(conn) == 0

        await eventually(closed, timeout_s=5, what="the report connection to close")
        with pytest.raises(ReportClosedError):
            await report.report()
    finally:
        await conn.close()


async def test_a_report_stuck_behind_a_lock_is_cancelled_by_its_statement_timeout(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's runs table locked: the read fails at its statement_timeout, then recovers."""
    # The default timeout (10 s) made an hour: a reader that used it instead of
    # its argument would show as an hour, not as a few seconds a busy machine adds.
    monkeypatch.setattr(report_cache, "REPORT_STATEMENT_TIMEOUT_S", 3600.0)
    kwdefaults = ReportReader.__init__.__kwdefaults__
    assert kwdefaults is not None
    monkeypatch.setitem(kwdefaults, "statement_timeout_s", 3600.0)
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}) as client:
        await client.submit("plain", {})
    locker = await connect(database_url)
    report = reader(database_url, statement_timeout_s=0.3, fresh_s=0)
    try:
        locked = locker.transaction()
        await locked.start()
        await locker.execute(f"lock table {SCHEMA}.runs in access exclusive mode")
        started = time.monotonic()
        with pytest.raises(asyncpg.QueryCanceledError):
            await report.report()
        took = time.monotonic() - started
        # Not before its 0.3 s; and far under what a defect would take, however busy the
        # machine: no timeout never ends (the lock is held), seconds read as milliseconds
        # take 300 s, the default instead of the argument an hour (above).
        assert 0.3 <= took < 60, took
        await locked.rollback()
        views = await report.report()  # the failure is not reused
        assert [v.queue for v in views] == [queue_of(RELEASE)]
        assert report.reads == 2
        # `set local`: nothing of the timeout stays on the pooled connection.
        assert report._db is not None
        show = "select current_setting('statement_timeout')"
        assert await report._db.fetchval(show) == await locker.fetchval(show)
    finally:
        await report.close()
        await locker.close()
