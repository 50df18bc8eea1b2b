"""The reconcile rotation counts only lanes with open runs (issue 35).

A week of deploys leaves hundreds of drained lanes; the reconcile takes 200 lanes
a pass, so if drained lanes (nothing to settle) took their turns, a run the engine
ended on a busy lane would wait ``ceil(lanes / 200)`` passes to be settled.
"""

from __future__ import annotations

import pytest

from support.db import sql
from support.runtime import SCHEMA, open_client
from worker.daemon import maintenance
from worker.daemon.maintenance import Rotation, maintain

ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-a"}
QUEUE = "runs_rel_a"


async def test_lanes_without_open_runs_take_no_turn_in_the_reconcile(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three lanes a pass; 6 drained lanes sort first; the busy lane settles in one pass."""
    async with open_client(database_url, ENV) as client:
        drained = [f"runs_a_{i}" for i in range(6)]  # sort before runs_rel_a
        for queue in drained:
            await client.db.run(lambda c, q=queue: c.execute("select absurd.create_queue($1)", q))
            await sql(
                database_url,
                f"insert into {SCHEMA}.releases (queue, status, release_ids, retired_at) "
                "values ($1, 'retired', array[$1], now())",
                queue,
            )
        await client.db.run(
            lambda c: client.store.lanes.register(c, queue=QUEUE, release_id="rel-a")
        )
        run = await client.submit("wait")
        await sql(
            database_url,
            f"select absurd.cancel_task(queue, task_id) from {SCHEMA}.runs where run_id = $1::uuid",
            run.run_id,
        )
        listed = await client.db.run(client.store.lanes.for_maintenance)
        assert [lane.queue for lane in listed] == [QUEUE]

        monkeypatch.setattr(maintenance, "RECONCILE_PER_PASS", 3)
        assert await maintain(client.db, client.store, worker_id="t", rotation=Rotation())
        assert (await client.status(run.run_id)).status == "cancelled"
