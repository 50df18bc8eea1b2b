"""A thousand engine queues (issue 35): a worker boots among them, stays up, cleans its own.

A week of a hundred deploys a day leaves ~700 engine queues until `lanes prune`
runs. The maintenance pass cleaned every queue inside one transaction, holding
~30 locks per queue until commit: at 700 queues PostgreSQL (default lock
settings) ran out of shared memory, the worker crashed 3 s after boot, and every
worker of every release crash-looped. Here 600 retired lanes with parked runs and
400 plain queues (another system's) face one worker of a new release. Maintenance
cleans the lanes and leaves the plain queues alone (issue 29).
"""

from __future__ import annotations

import math

import pytest

from support import many_lanes
from support.daemon import Daemons
from support.runtime import eventually, open_client
from worker.daemon.maintenance import CLEANUP_PER_PASS, Rotation, maintain

LANES = 600
PLAIN = 400
PARKED = 2
RELEASE = "rel-new"


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_worker_boots_among_a_thousand_queues_and_maintenance_cleans_its_own(
    database_url: str,
) -> None:
    """Boot, a continuation loop per retired lane, no crash; passes clean every lane."""
    built = await many_lanes.build(database_url, lanes_count=LANES, parked=PARKED, plain=PLAIN)
    async with Daemons(database_url) as pool, open_client(database_url) as client:
        d = pool.start(RELEASE)
        await d.ready(timeout_s=60)
        # The boot pass: it once crashed here, on the registry read after the cleanups.
        first = await d.wait_for("maintenance.passed", timeout_s=120)
        assert first["engine_queues"] == LANES + PLAIN + 1
        assert first["own_queues"] == LANES + 1
        assert first["cleaned"] == CLEANUP_PER_PASS

        def attached() -> bool:
            return len(d.events("loop.attached")) == LANES

        async def all_attached() -> bool:
            return attached()

        await eventually(all_attached, timeout_s=120, what="a loop on every retired lane")
        # The rest, pass after pass, as the fleet's other workers would (sharing the
        # cleanup lock with the daemon: a pass that finds it held does nothing).
        rotation = Rotation()
        passes = math.ceil((len(built.lanes) + 1) / CLEANUP_PER_PASS)

        async def cleaned_all() -> bool:
            await maintain(client.db, client.store, worker_id="test", rotation=rotation)
            return not await many_lanes.uncleaned(database_url, built.lanes)

        await eventually(cleaned_all, timeout_s=60 + 10 * passes, what="every lane cleaned")
        assert await many_lanes.uncleaned(database_url, built.plain) == list(built.plain)
        assert d.running
        assert not d.events("worker.side_loop_crashed")
        assert not d.events("maintenance.queue_failed")
        assert "out of shared memory" not in "".join(str(r) for r in d.records)
        d.terminate()
        assert await d.wait_exit() == 0
