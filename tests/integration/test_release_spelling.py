"""One spelling of a release (issue 31 §1): the store's readers name a release as deployed.

Builds before store migration 0030 wrote their own release as the lane's sanitized
segment (``rel_a`` for ``rel-a``) into the lane registry, attempts and adoptions, and
keep doing so beside this build. Each test writes rows as such a build writes them
(plain SQL, the statements of their named queries) and reads them through this
build's readers: ``run_status`` (the SQL API), ``list_runs``, the drain report, the
retry's stamp. A segment is shown as the release id the store knows as deployed
(the release registry's, else the one a current worker registered), anything else
as stored; the queue stays the queue.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, open_client
from worker.db.store import Store

A, B = "rel-a", "rel-b"
QA, QB = "runs_rel_a", "runs_rel_b"


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def register_as_older_build(
    conn: asyncpg.Connection[asyncpg.Record], queue: str, spelling: str
) -> None:
    """Register a lane as a build before 0030 does (its register_release statement)."""
    await conn.execute(
        f"insert into {SCHEMA}.releases as l (queue, status, release_ids)"
        " values ($1, 'claiming', array[$2::text]) on conflict (queue) do update"
        " set release_ids = case when $2 = any(l.release_ids) then l.release_ids"
        " else l.release_ids || $2 end",
        queue,
        spelling,
    )


async def adopted_run_of_older_builds(conn: asyncpg.Connection[asyncpg.Record]) -> str:
    """A run the app stamped ``rel-a``, run by A then adopted by B, both older builds."""
    made = await conn.fetchval(f"select {SCHEMA}.submit_run('nap', '{{}}'::jsonb, $1)", A)
    run_id = uuid.UUID(made["runId"])
    for attempt, release, disposition in ((1, "rel_a", "own"), (1, "rel_b", "adopt")):
        await conn.execute(
            f"insert into {SCHEMA}.attempts (run_id, engine_run_id, attempt, worker_id,"
            " release_id, disposition, outcome) values ($1, $2, $3, $4, $5, $6, 'parked')",
            run_id,
            uuid.uuid4(),
            attempt,
            f"{release}@host:1:abc",
            release,
            disposition,
        )
    await conn.execute(
        f"update {SCHEMA}.runs set adopted_release_id = 'rel_b', adopted_queue = $2"
        " where run_id = $1",
        run_id,
        QB,
    )
    return str(run_id)


async def run_status(conn: asyncpg.Connection[asyncpg.Record], run_id: str) -> dict[str, Any]:
    status: dict[str, Any] = await conn.fetchval(
        f"select {SCHEMA}.run_status($1)", uuid.UUID(run_id)
    )
    return status


async def test_run_status_shows_the_registry_s_deployed_id_for_an_older_build_s_segment(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Rows an older build wrote (``rel_a``, ``rel_b``) read as deployed once the registry
    knows the lanes' releases; the app's own stamp and the queue stay as they are."""
    await register_as_older_build(conn, QA, "rel_a")
    await register_as_older_build(conn, QB, "rel_b")
    run_id = await adopted_run_of_older_builds(conn)

    # Only older builds registered these lanes, and no registry entry: their spelling.
    before = await run_status(conn, run_id)
    assert (before["releaseId"], before["adoptedReleaseId"]) == (A, "rel_b")
    assert [a["releaseId"] for a in before["attempts"]] == ["rel_a", "rel_b"]

    for release in (A, B):
        await conn.execute(
            f"select {SCHEMA}.deploy_release($1, 'img', 0, 'test', 'deployed')", release
        )
    status = await run_status(conn, run_id)
    assert (status["releaseId"], status["adoptedReleaseId"], status["queue"]) == (A, B, QA)
    assert [a["releaseId"] for a in status["attempts"]] == [A, B]
    # The rows keep what the older builds wrote: only the readers changed.
    stored = await conn.fetch(
        f"select release_id from {SCHEMA}.attempts where run_id = $1 order by attempt_id",
        uuid.UUID(run_id),
    )
    assert [r["release_id"] for r in stored] == ["rel_a", "rel_b"]


async def test_a_lane_a_current_worker_registered_names_its_release_as_deployed(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """No registry entry: the deployed id a current worker registered is the lane's, even
    when an older machine of the lane registered the segment first."""
    await register_as_older_build(conn, QB, "rel_b")  # an older machine of B, first
    store = Store(SCHEMA)
    await store.lanes.register(conn, queue=QB, release_id=B)  # a current one
    await register_as_older_build(conn, QA, "rel_a")
    await store.lanes.register(conn, queue=QA, release_id=A)
    run_id = await adopted_run_of_older_builds(conn)
    status = await run_status(conn, run_id)
    assert (status["releaseId"], status["adoptedReleaseId"]) == (A, B)
    assert [a["releaseId"] for a in status["attempts"]] == [A, B]
    row = await store.lanes.row(conn, queue=QB)
    assert row is not None
    assert (row.release_id, row.release_ids) == (B, ["rel_b", B])


async def test_a_spelling_that_is_no_segment_is_shown_as_stored(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The app's stamp ``Rel-A`` (same lane) and ids of no lane the store knows stay as they are."""
    store = Store(SCHEMA)
    await store.lanes.register(conn, queue=QA, release_id=A)
    shown = {
        spelling: await conn.fetchval(f"select {SCHEMA}.release_as_deployed($1)", spelling)
        for spelling in ("Rel-A", "rel_a", "rel_z", "dev", "dev-wt", "_rel_a", "", None)
    }
    assert shown == {
        "Rel-A": "Rel-A",
        "rel_a": A,  # the segment of a lane the store knows: as deployed
        "rel_z": "rel_z",  # no lane knows it
        "dev": "dev",
        "dev-wt": "dev-wt",
        "_rel_a": "_rel_a",  # not the segment of runs_rel_a (a segment has no edge '_')
        "": "",
        None: None,
    }


async def test_the_report_list_and_retry_name_the_lane_s_release_as_deployed(
    database_url: str, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    """``lanes``, ``runs`` and a retry's stamp: the deployed id, whoever wrote the rows."""
    await register_as_older_build(conn, QA, "rel_a")
    await register_as_older_build(conn, QB, "rel_b")
    run_id = await adopted_run_of_older_builds(conn)
    await conn.execute(f"select {SCHEMA}.deploy_release($1, 'img', 0, 'test', 'deployed')", A)
    # B's live worker, of a current build: it registered B as deployed.
    await Store(SCHEMA).lanes.register(conn, queue=QB, release_id=B)
    await conn.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid,"
        " concurrency, plays) values ('b@host:1:abc', $1, $2, 'test', 1, 8, '{nap}')",
        B,
        QB,
    )
    async with open_client(database_url) as client:
        by_queue = {v.queue: v for v in await client.lanes()}
        assert (by_queue[QA].release_id, by_queue[QB].release_id) == (A, B)
        listed = {r.run_id: r for r in await client.runs()}
        assert (listed[run_id].release_id, listed[run_id].adopted_release_id) == (A, B)
        await client.ensure_queue(QB)  # as B's worker made it at boot
        await client.fail_run(run_id, "to retry it")
        retried = await client.retry_run(run_id)
        assert (retried.release_id, retried.queue) == (B, QB)
        assert (await client.status(retried.run_id)).release_id == B
    stamp = await conn.fetchval(
        f"select release_id from {SCHEMA}.runs where run_id = $1", uuid.UUID(retried.run_id)
    )
    assert stamp == B
