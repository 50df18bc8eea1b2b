"""A SIGKILLed worker's attempt is closed (lease_lost), with real daemons and the real CLI.

By the attempt that takes the run over, or, after a cancel, by a live daemon's
maintenance pass once the dead worker's heartbeat is old.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support import step_logged
from support.cli import lane_worker_json
from support.daemon import Daemon, Daemons
from support.db import age_worker, fetch
from support.runtime import SCHEMA, eventually, open_client


async def attempts_of(database_url: str, run_id: str) -> list[asyncpg.Record]:
    """Return the store's attempt rows of a run, oldest first."""
    return await fetch(
        database_url,
        f"select attempt_id, worker_id, release_id, disposition, outcome, error, finished_at"
        f" from {SCHEMA}.attempts where run_id = $1 order by attempt_id",
        run_id,
    )


KILLED = "rs3-kill"


SHORT_LEASE = {"LANE_WORKER_CLAIM_TIMEOUT": "5"}


async def start_mid_step(pool: Daemons, database_url: str, tmp_path: Path) -> tuple[Daemon, str]:
    """Start K (5 s lease) and a run whose step `two` holds 60 s there; return both mid-step."""
    k = pool.start(KILLED, name="K", **SHORT_LEASE)
    await k.ready()
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": KILLED}) as client:
        # apps:slow: step `two` sleeps 60 s on its first execution, 0 s on a re-run.
        run_id = (
            await client.submit("slow", {"dir": str(tmp_path), "seconds": 60, "rerun_seconds": 0})
        ).run_id
    await k.wait_for("run.started", run_id=run_id)

    async def in_step_two() -> bool:
        # Its line written, not only the file created: `record` opens the file, then
        # writes, and a kill between the two left the re-run taking itself for the
        # first execution (60 s, past the test's wait; CI, 2026-12-07).
        return step_logged(tmp_path / "two.log")

    await eventually(in_step_two, what="K executing step two")
    return k, run_id


async def open_attempts(database_url: str, run_id: str) -> list[dict[str, Any]]:
    """Return a run's attempts that recorded no end."""
    return [
        dict(a)
        for a in await attempts_of(database_url, run_id)
        if a["outcome"] is None or a["finished_at"] is None
    ]


@pytest.mark.timeout(120)
async def test_a_sigkilled_workers_attempt_is_closed_when_the_run_is_taken_over(
    database_url: str, tmp_path: Path
) -> None:
    """K dies mid-step; K2 takes the run over after the lease: K's attempt ends lease_lost.

    Before the fix K's attempt stayed open (no outcome, no finished_at) for good.
    """
    async with Daemons(database_url) as pool:
        k, run_id = await start_mid_step(pool, database_url, tmp_path)
        k.kill()
        assert await k.wait_exit(timeout_s=15) == -9
        k2 = pool.start(KILLED, name="K2", **SHORT_LEASE)
        await k2.ready()
        await k2.wait_for("run.completed", run_id=run_id, timeout_s=45)

        assert await open_attempts(database_url, run_id) == []
        rows = await attempts_of(database_url, run_id)
        by_k = [r for r in rows if r["worker_id"].startswith(k.worker_id)]
        assert [(r["disposition"], r["outcome"]) for r in by_k] == [("own", "lease_lost")], [
            dict(r) for r in rows
        ]
        assert rows[-1]["worker_id"].startswith(k2.worker_id)
        assert (rows[-1]["disposition"], rows[-1]["outcome"]) == ("own", "completed")
        status = await lane_worker_json(database_url, "status", run_id)
        assert status["status"] == "completed"
        assert [a for a in status["claims"] if a["outcome"] is None] == [], status["claims"]
        assert (tmp_path / "two.log").read_text().count("\n") == 2  # K's, then K2's re-run


@pytest.mark.timeout(120)
async def test_a_sigkilled_workers_attempt_is_closed_by_maintenance_after_a_cancel(
    database_url: str, tmp_path: Path
) -> None:
    """K dies mid-step and the run is cancelled; once K's heartbeat is old, maintenance closes it.

    The cancel leaves K's attempt open while K's heartbeat is younger than 60 s (K
    might still be executing the step); the maintenance pass of a daemon booted
    after that closes it as lease_lost. Before the fix it stayed open for good.
    """
    async with Daemons(database_url) as pool:
        k, run_id = await start_mid_step(pool, database_url, tmp_path)
        k.kill()
        assert await k.wait_exit(timeout_s=15) == -9
        cancelled = await lane_worker_json(database_url, "cancel", run_id)
        assert cancelled["cancelled"] is True, cancelled
        # K's heartbeat is young: it could still be executing the step, so it stays open.
        assert [a["worker_id"] for a in await open_attempts(database_url, run_id)] == [k.worker_id]

        aged = await age_worker(database_url, k.worker_id)
        assert aged == "UPDATE 1", aged
        k3 = pool.start(KILLED, name="K3", **SHORT_LEASE)
        await k3.ready()  # its first maintenance pass starts as it serves

        async def closed() -> bool:
            return not await open_attempts(database_url, run_id)

        await eventually(closed, timeout_s=20, what="K's attempt to be closed by maintenance")
        rows = await attempts_of(database_url, run_id)
        assert [(r["worker_id"], r["disposition"], r["outcome"]) for r in rows] == [
            (k.worker_id, "own", "lease_lost")
        ], [dict(r) for r in rows]
        status = await lane_worker_json(database_url, "status", run_id)
        assert status["status"] == "cancelled"
        assert [a["outcome"] for a in status["claims"]] == ["lease_lost"]
