"""The LISTEN connection against real Postgres: it reconnects through outages, and only those."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest

from support.runtime import connect, eventually
from worker.daemon.listener import KEEPALIVE_S, Listener, Wakeups


async def test_a_cut_listen_connection_reconnects(database_url: str) -> None:
    """A connection the server terminates is an outage: the listener connects again."""
    wakeups = Wakeups()
    listener = Listener(database_url, wakeups, lambda: {"runs_rel_a"})
    task = asyncio.create_task(listener.run())
    conn = await connect(database_url)
    try:

        async def connected() -> bool:
            return listener.connected

        await eventually(connected, what="the listener to connect")
        killed = await conn.fetchval(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity"
            " where datname = current_database() and application_name = 'lane-worker-listen'"
        )
        assert killed == 1

        async def everyone_woken() -> bool:
            # Anything notified while it was away is found by polling.
            return wakeups.lanes_changed.is_set() and wakeups.for_queue("runs_rel_a").is_set()

        await eventually(everyone_woken, what="the loops to be woken")
        await eventually(connected, what="the listener to reconnect")
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.close()


async def test_an_error_reconnecting_cannot_fix_comes_out_of_the_listener(
    database_url: str,
) -> None:
    """A database that does not exist is no outage: run() raises instead of retrying forever."""
    missing = urlunsplit(urlsplit(database_url)._replace(path="/no_such_database"))
    listener = Listener(missing, Wakeups(), lambda: {"runs_rel_a"})
    with anyio.fail_after(10), pytest.raises(asyncpg.InvalidCatalogNameError):
        await listener.run()
    assert not listener.connected


async def test_a_killed_listen_connection_is_noticed_at_once(database_url: str) -> None:
    """The loops fall back to polling at once, not at the next keepalive (15 s later).

    And once it is back, the listener says so only after LISTEN is up again, and
    wakes every loop then: a NOTIFY sent while it was away is found by a claim.
    """
    wakeups = Wakeups()
    listener = Listener(database_url, wakeups, lambda: {"runs_rel_a"})
    task = asyncio.create_task(listener.run())
    conn = await connect(database_url)
    queue_event = wakeups.for_queue("runs_rel_a")
    try:

        async def connected() -> bool:
            return listener.connected

        async def lost() -> bool:
            return not listener.connected and queue_event.is_set()

        await eventually(connected, what="the listener to connect")
        queue_event.clear()
        await conn.execute("select pg_notify('lane_worker_runs_rel_a', '')")
        await eventually(holds(queue_event.is_set), timeout_s=5, what="the NOTIFY")
        queue_event.clear()
        await conn.fetchval(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = current_database() and application_name = 'lane-worker-listen'"
        )
        # Well inside KEEPALIVE_S: noticed from the connection's own end.
        assert KEEPALIVE_S >= 15
        await eventually(lost, timeout_s=3, what="the lost connection noticed")
        queue_event.clear()
        await eventually(connected, timeout_s=10, what="the listener to reconnect")
        assert queue_event.is_set()  # woken once LISTEN was up again
        queue_event.clear()
        await conn.execute("select pg_notify('lane_worker_runs_rel_a', '')")
        await eventually(holds(queue_event.is_set), timeout_s=5, what="a NOTIFY after it")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.close()


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check
