"""A retired release without LISTEN never takes what its retirement gave away (issue 34 item 5).

In PgBouncer mode a worker learns of its lane's retirement only at its next lane
refresh (every 5 s). Its claims, though, are served by the claim functions, which
read the claimer's lane in the database: a retired lane's worker is served as a
draining one whatever it believes, so the parked runs that wake right after the
retirement (and after `lanes wait` said drained) go to the newer release, never
back to the retired one whose machines the runbook then stops.
"""

from __future__ import annotations

from support.cli import lane_worker
from support.daemon import Daemons
from support.db import all_ended, attempt_rows, sql, statuses
from support.runtime import SCHEMA, eventually, open_client

A, B = "lw-retired-a", "lw-newer-b"
# How the workers name their release: as deployed (issue 31 §1), not rel_a.
A_ID = A
B_ID = B
# No LISTEN, and A polls often: without the claim's own check it takes a woken run
# within a poll, long before its 5 s lane refresh tells it of the retirement.
NO_LISTEN = {"LANE_WORKER_PGBOUNCER": "1", "LANE_WORKER_POLL_INTERVAL": "0.2"}
WAITERS = 4


async def test_a_retired_lane_without_listen_leaves_its_woken_parked_runs_to_the_newer(
    database_url: str,
) -> None:
    """Woken right after `lanes retire A`, A's parked runs are adopted by B, never run by A."""
    async with Daemons(database_url) as pool:
        a = pool.start(A, name="A", **NO_LISTEN)
        await a.ready()
        b = pool.start(B, name="B", **NO_LISTEN)
        await b.ready()
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A}) as client:
            waiters = [(await client.submit("waiter", {})).run_id for _ in range(WAITERS)]

        async def all_parked() -> bool:
            found = await statuses(database_url, waiters)
            return list(found.values()) == ["waiting"] * WAITERS

        await eventually(all_parked, what="A's waiters to park")
        retired = await lane_worker(database_url, "lanes", "retire", A)
        assert retired.returncode == 0, retired.stderr
        # Woken at once, through the app's SQL API: A has not refreshed its lanes yet.
        for run_id in waiters:
            await sql(
                database_url,
                f"select {SCHEMA}.signal_run($1::uuid, 'go', '{{\"by\": \"app\"}}'::jsonb)",
                run_id,
            )
        waited = await lane_worker(database_url, "lanes", "wait", A, "--timeout", "30")
        assert waited.returncode == 0, waited.stderr
        await all_ended(database_url, waiters)

        for run_id in waiters:
            rows = await attempt_rows(database_url, run_id)
            assert [(r["release_id"], r["disposition"], r["outcome"]) for r in rows] == [
                (A_ID, "own", "parked"),
                (B_ID, "adopt", "completed"),
            ], run_id
            assert len(a.events("run.started", run_id=run_id)) == 1  # its first start only
        assert not a.events("loop.claim_failed")
        assert not b.events("loop.claim_failed")
