"""Side loops of the real daemon: a broken loop stops the worker, a database outage does not."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from support.daemon import Daemons
from support.db import execute
from support.runtime import connect, eventually, open_client

RELEASE = "rel-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
SCHEMA = "runtime_scheduler"
DAEMON_APPS = ("lane-worker rel_a", "lane-worker-listen")  # application_name of its connections


async def readyz(port: int) -> tuple[int, dict[str, object]]:
    """GET /readyz; return its status and JSON body."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return response.status, await response.json()


def written(path: Path) -> bool:
    """Tell whether a step-execution file has a line."""
    return path.exists() and bool(path.read_text())


async def step_started(path: Path) -> None:
    """Wait until the step that records into ``path`` has started."""

    async def started() -> bool:
        return written(path)

    await eventually(started, what=f"{path.name} to be written")


async def terminate_daemon_connections(database_url: str) -> int:
    """Cut every connection of the daemon (pool and LISTEN) server-side; return how many."""
    conn = await connect(database_url)
    try:
        killed: int = await conn.fetchval(
            "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = current_database() and application_name = any($1::text[])) t",
            list(DAEMON_APPS),
        )
    finally:
        await conn.close()
    return killed


# Each breaks what one side loop reads, the way a bad migration or a hand edit would.
BREAKAGES = {
    "lane_refresh": [
        f"alter table {SCHEMA}.releases rename column release_ids to renamed",
        "notify lane_worker_lanes, 'runs_rel_a'",  # refresh now rather than within 5 s
    ],
    # Only the heartbeat writes pid (the lane refresh reads heartbeat_at and plays).
    "heartbeat": [f"alter table {SCHEMA}.workers rename column pid to renamed"],
}
# Undone before the run is read back: `status` reads the lane registry too (a release's
# spelling as deployed), so it would fail on the breakage, not on what the test checks.
REPAIRS = {
    "lane_refresh": [f"alter table {SCHEMA}.releases rename column renamed to release_ids"],
    "heartbeat": [f"alter table {SCHEMA}.workers rename column renamed to pid"],
}


@pytest.mark.parametrize("loop", sorted(BREAKAGES))
async def test_an_unexpected_error_in_a_side_loop_drains_and_exits_1(
    database_url: str, tmp_path: Path, loop: str
) -> None:
    """A side loop's non-transient error: one crash event, a SIGTERM-style drain, exit 1."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        daemon = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="2")
        await daemon.ready()
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 60})
        await step_started(tmp_path / "two.log")
        for statement in BREAKAGES[loop]:
            await execute(database_url, statement)
        broken = time.monotonic()

        # The heartbeat beats every 10 s; the refresh was woken at once.
        crashed = await daemon.wait_for("worker.side_loop_crashed", timeout_s=25)
        code = await daemon.wait_exit(timeout_s=20)
        took = time.monotonic() - broken
        print(f"{loop} broken: crash logged, drained, exit {code} after {took:.1f} s")
        assert code == 1, daemon.tail()
        assert crashed["loop"] == loop
        assert crashed["level"] == "error"
        assert "UndefinedColumn" in crashed["error"]
        assert len(daemon.events("worker.side_loop_crashed")) == 1
        # Drained as a SIGTERM drains: stop claiming, hand the run back, stop mark.
        order = [
            daemon.index_of(event, **filters)
            for event, filters in [
                ("worker.side_loop_crashed", {}),
                ("worker.stopping", {}),
                ("run.handed_back", {"run_id": run.run_id}),
                ("worker.stopped", {}),
            ]
        ]
        assert -1 not in order, daemon.tail()
        assert order == sorted(order), daemon.tail()
        for statement in REPAIRS[loop]:
            await execute(database_url, statement)
        status = await client.status(run.run_id)
        assert status.status == "queued"
        assert [a.outcome for a in status.attempts] == ["handed_back"]
        assert daemon.malformed_lines() == []


async def test_cut_database_connections_do_not_stop_the_daemon(database_url: str) -> None:
    """Connections killed server-side are a transient outage: the daemon rides it out."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        daemon = pool.start(RELEASE)
        await daemon.ready()

        async def listening() -> bool:
            status, body = await readyz(daemon.health_port)
            return status == 200 and bool(body["listening"])

        await eventually(listening, what="the daemon to be ready and listening")
        conn = await connect(database_url)
        try:
            beat_before = await conn.fetchval(f"select max(heartbeat_at) from {SCHEMA}.workers")
            assert await terminate_daemon_connections(database_url) >= 1
            await daemon.wait_for("listener.reconnecting", timeout_s=15)

            async def beat_after_the_cut() -> bool:
                beat = await conn.fetchval(f"select max(heartbeat_at) from {SCHEMA}.workers")
                return bool(beat > beat_before)

            # Every side loop has had a pass on fresh connections: the heartbeat (10 s)
            # and the lane refresh (5 s), with the listener reconnected in between.
            await eventually(beat_after_the_cut, timeout_s=20, what="a heartbeat after the cut")
        finally:
            await conn.close()
        await terminate_daemon_connections(database_url)
        run = await client.submit("plain", {"after": "cut"})
        await daemon.wait_for("run.completed", run_id=run.run_id, timeout_s=20)
        await eventually(listening, what="the daemon to be ready and listening again")
        assert daemon.running
        assert not daemon.events("worker.side_loop_crashed")
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=15) == 0
