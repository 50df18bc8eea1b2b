"""Dev lanes stand apart from the release order (store migration 0035), in both directions.

``tests/e2e/test_dev_lanes_apart.py`` drives the worktree-adopts-a-release case with
daemons, and the claim-rule table's ``dev-adopt`` seat claims with it; here the
store's answers for every pair: the adoption order (``lane_older``), the lane
registry a worker attaches its continuation loops from, and the drain verdict.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import asyncpg
import pytest

from support.runtime import SCHEMA, connect
from worker.db.store import Store

if TYPE_CHECKING:
    Conn = asyncpg.Connection[asyncpg.Record]

# Registered in this order; every lane but the last release is retired.
LANES = (
    ("rel-1", "runs_rel_1"),
    ("dev-wt", "runs_wt"),
    ("dev", "runs"),
    ("rel-2", "runs_rel_2"),
)
RELEASES = {"runs_rel_1", "runs_rel_2"}


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[Conn]:
    connection = await connect(database_url)
    store = Store(SCHEMA)
    try:
        for release_id, queue in LANES:
            await store.lanes.register(connection, queue=queue, release_id=release_id)
        for release_id, queue in LANES[:-1]:
            await store.lanes.set_status(
                connection, queue=queue, status="retired", release_id=release_id
            )
        await store.lanes.set_status(
            connection, queue="runs_wt", status="claiming", release_id="dev-wt"
        )
        yield connection
    finally:
        await connection.close()


async def test_only_a_release_adopts_from_an_older_release(conn: Conn) -> None:
    """lane_older holds for rel-1 then rel-2 only: never from or to a dev lane."""
    older = {
        (a, b)
        for _, a in LANES
        for _, b in LANES
        if await conn.fetchval(f"select {SCHEMA}.lane_older($1, $2)", a, b)
    }
    assert older == {("runs_rel_1", "runs_rel_2")}


async def test_the_registry_offers_a_worktree_no_release_to_adopt_from(conn: Conn) -> None:
    """What a worker reads to attach continuation loops: dev lanes see no older lane."""
    store = Store(SCHEMA)
    for _, queue in LANES:
        offered = {
            lane.queue
            for lane in await store.lanes.registry(conn, own_queue=queue)
            if lane.older_than_mine
        }
        assert offered == ({"runs_rel_1"} if queue == "runs_rel_2" else set()), queue


async def test_a_dev_worker_s_plays_count_for_no_release_s_drain_verdict(conn: Conn) -> None:
    """A live worktree worker registering a play: no retired release reads it as adoptable."""
    store = Store(SCHEMA)
    await store.lanes.heartbeat(
        conn, worker_id="wt-1", release_id="dev-wt", queue="runs_wt", hostname="test",
        pid=1, concurrency=8, plays=["p_wt"],
    )  # fmt: skip
    await store.lanes.heartbeat(
        conn, worker_id="rel-2-1", release_id="rel-2", queue="runs_rel_2", hostname="test",
        pid=2, concurrency=8, plays=["p_rel"],
    )  # fmt: skip
    plays = {
        queue: await conn.fetchval(f"select {SCHEMA}.adoptable_plays($1)", queue)
        for _, queue in LANES
    }
    assert plays == {"runs_rel_1": ["p_rel"], "runs_wt": [], "runs": [], "runs_rel_2": []}
