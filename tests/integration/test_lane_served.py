"""A submit says whether anything serves its lane (store migration 0029, issue 31 §1).

``submit_run`` and ``submit_runs`` accept a release nobody serves (a worker may
boot later) and add ``served`` to each result, with a ``warning`` naming the
lane's queue and what would serve it when it is false. Served: the lane's row
claims, a worker of its queue is live, or it is the registry's current release.
The same fields reach ``LaneClient.submit`` / ``submit_many`` (``SubmittedRun``).
The lookup is indexed: a submit never scans a table for it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, open_client
from worker.client import SubmitRequest

if TYPE_CHECKING:
    Conn = asyncpg.Connection[asyncpg.Record]

HINT = "(worker_release_id(suffix, deploy version) gives the release id a worker serves)."


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[Conn]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def submit(conn: Conn, release_id: str, key: str | None = None) -> dict[str, Any]:
    made: dict[str, Any] = await conn.fetchval(
        f"select {SCHEMA}.submit_run('greet', '{{}}', $1, $2)", release_id, key
    )
    return made


async def lane(conn: Conn, queue: str, status: str) -> None:
    await conn.execute(
        f"insert into {SCHEMA}.releases (queue, status, release_ids) values ($1, $2, '{{}}')"
        " on conflict (queue) do update set status = excluded.status",
        queue,
        status,
    )


async def worker(conn: Conn, queue: str, *, age_s: int = 0, stopped: bool = False) -> None:
    """A worker row of ``queue`` whose last beat was ``age_s`` ago (the database's clock)."""
    await conn.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid, concurrency,"
        " heartbeat_at, stopped_at) values ($1, $2, $2, 'h', 1, 1,"
        " now() - make_interval(secs => $3), case when $4 then now() end)",
        str(uuid.uuid4()),
        queue,
        age_s,
        stopped,
    )


UNSERVED = [
    ("dev", "runs", "a worker with neither DEEPLINE_ABSURD_QUEUE_SUFFIX nor "
     "DEEPLINE_RUNTIME_DEPLOY_VERSION set starts"),
    ("runs_x", "runs_runs_x", "a worker deployed with DEEPLINE_RUNTIME_DEPLOY_VERSION=runs_x"),
    ("Dev-X", "runs_dev_x", "a worker deployed with DEEPLINE_RUNTIME_DEPLOY_VERSION=Dev-X"),
    ("dev-Pr 7", "runs_pr_7", "a worker with DEEPLINE_ABSURD_QUEUE_SUFFIX=pr_7 starts"),
]  # fmt: skip


@pytest.mark.parametrize(("release", "queue", "serves"), UNSERVED, ids=[u[0] for u in UNSERVED])
async def test_a_lane_nobody_serves_is_accepted_with_a_warning(
    conn: Conn, release: str, queue: str, serves: str
) -> None:
    made = await submit(conn, release)
    assert {k: made[k] for k in ("queue", "releaseId", "created", "served")} == {
        "queue": queue, "releaseId": release, "created": True, "served": False,
    }  # fmt: skip
    assert made["warning"].startswith(
        f"no worker serves lane {queue} (release '{release}'): none registered it, none is "
        "live, and it is not the current deploy; the run waits there until "
    )
    assert serves in made["warning"]
    assert made["warning"].endswith(HINT)
    # Accepted: the run is there, queued on its lane's queue.
    status = await conn.fetchval(
        f"select status from {SCHEMA}.runs where run_id = $1", uuid.UUID(made["runId"])
    )
    assert status == "queued"
    # A repeat of its key says the same.
    keyed = await submit(conn, release, "k")
    again = await submit(conn, release, "k")
    assert again == {**keyed, "created": False}
    assert again["served"] is False


async def test_a_release_no_worker_can_boot_with_says_so(conn: Conn) -> None:
    made = await submit(conn, "DEV")
    assert made["served"] is False
    assert made["warning"].startswith(
        "no worker serves lane runs_dev (release 'DEV'), and none can be deployed with that "
        "release id (deploy version 'DEV' is spelled like a dev lane"
    )


async def test_what_serves_a_lane(conn: Conn) -> None:
    """A claiming lane row, a live worker, or the current deploy; nothing else."""

    async def served(release: str) -> bool:
        made = await submit(conn, release)
        assert ("warning" in made) is not made["served"]
        return bool(made["served"])

    assert not await served("rel-a")
    await lane(conn, "runs_rel_a", "claiming")
    assert await served("rel-a")
    assert await served("Rel-A")  # any spelling of the lane
    # Retired, none of its workers live: the warning says how it would run.
    await lane(conn, "runs_rel_a", "retired")
    made = await submit(conn, "rel-a")
    assert made["served"] is False
    assert made["warning"] == (
        "lane runs_rel_a (release 'rel-a') is retired and none of its workers is live: the run "
        "waits there until one starts or `lane-worker lanes activate rel-a` makes the lane "
        "claim again; to run it on the current release, submit it with that release's id " + HINT
    )
    # Workers: a stopped one or one silent for over 60 s does not serve; a live one does
    # (a draining worker runs a fresh run of its lane).
    await worker(conn, "runs_rel_a", stopped=True)
    await worker(conn, "runs_rel_a", age_s=61)
    assert not await served("rel-a")
    await worker(conn, "runs_rel_a", age_s=5)
    assert await served("rel-a")
    # No lane row and no worker yet, but the registry's current release: its machines boot.
    assert not await served("rel-b")
    await conn.fetchval(f"select {SCHEMA}.deploy_release('rel-b', 'img:b', 1, 'test')")
    assert await served("rel-b")
    # Superseded by a newer deploy (its lane never registered): no longer served.
    await conn.fetchval(f"select {SCHEMA}.deploy_release('rel-c', 'img:c', 1, 'test')")
    assert not await served("rel-b")
    assert await served("rel-c")
    # Current, but deployed with no machine: nothing boots for it (migration 0034).
    await conn.fetchval(f"select {SCHEMA}.deploy_release('rel-z', 'img:z', 0, 'test')")
    assert not await served("rel-z")


async def test_submit_runs_says_it_for_every_item(conn: Conn) -> None:
    await lane(conn, "runs_rel_1", "claiming")
    items = [
        {"play": "a", "releaseId": "rel-1"},
        {"play": "b", "releaseId": "nobody"},
        {"play": "c", "releaseId": "Rel-1", "idempotencyKey": "k"},
        {"play": "c", "releaseId": "rel-1", "idempotencyKey": "k"},
    ]
    made = await conn.fetchval(f"select {SCHEMA}.submit_runs($1)", items)
    assert [(m["queue"], m["created"], m["served"], "warning" in m) for m in made] == [
        ("runs_rel_1", True, True, False),
        ("runs_nobody", True, False, True),
        ("runs_rel_1", True, True, False),
        ("runs_rel_1", False, True, False),
    ]
    assert made[1]["warning"].startswith("no worker serves lane runs_nobody (release 'nobody')")
    assert set(made[0]) == {"runId", "queue", "releaseId", "created", "served"}
    assert await conn.fetchval(f"select {SCHEMA}.submit_runs('[]')") == []


async def test_the_lookup_is_indexed(conn: Conn) -> None:
    """Every statement of the lookup has an index to use: no submit scans a table for it."""
    plans: list[str] = []
    conn.add_log_listener(lambda _c, message: plans.append(message.message))
    for setting in (
        "load 'auto_explain'",
        "set auto_explain.log_min_duration = 0",
        "set auto_explain.log_nested_statements = on",
        "set auto_explain.log_format = 'text'",
        "set client_min_messages = log",
        # With every table nearly empty a scan is cheapest; ask whether an index exists.
        "set enable_seqscan = off",
    ):
        await conn.execute(setting)
    await conn.fetchval(f"select {SCHEMA}.lane_served('runs_none', 'none')")
    await conn.execute("set client_min_messages = notice")
    looked = [p for p in plans if "releases" in p or "workers" in p or "deployments" in p]
    assert len(looked) == 2, plans
    assert not [p for p in looked if "Seq Scan" in p], looked
    assert "Index Scan using releases_pkey" in looked[0]
    assert "using workers_queue_live_idx" in looked[1]
    # Either index finds the one row: the queue's, or the partial one of the single
    # current release (chosen since 0050 widened the table).
    assert re.search(r"using deployments_(queue_key|one_current)", looked[1]), looked[1]


async def test_the_python_client_returns_the_flag(database_url: str, conn: Conn) -> None:
    env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-p"}
    async with open_client(database_url, env) as client:
        run = await client.submit("greet")
        assert (run.queue, run.created, run.served) == ("runs_rel_p", True, False)
        assert run.warning is not None
        assert "DEEPLINE_RUNTIME_DEPLOY_VERSION=rel-p" in run.warning
        assert run.as_json()["warning"] == run.warning
        await lane(conn, "runs_rel_p", "claiming")
        run = await client.submit("greet")
        assert (run.served, run.warning) == (True, None)
        assert "warning" not in run.as_json()
        many = await client.submit_many(
            [SubmitRequest("greet"), SubmitRequest("greet", queue_suffix="pr-9")]
        )
        assert [(r.queue, r.served) for r in many] == [("runs_rel_p", True), ("runs_pr_9", False)]
        assert many[1].warning is not None
        assert "DEEPLINE_ABSURD_QUEUE_SUFFIX=pr_9" in many[1].warning
