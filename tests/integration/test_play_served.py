"""A submit says when none of its lane's live workers registers the play (store
migration 0038, issue 31 §2).

The lane is served (0029's ``served`` stays true) and at least one of its workers is
live, but none registers the play: the run is still accepted (a worker whose app
registers it may start later) and the result adds ``playServed: false`` and a
``warning`` naming the plays they do register. No live worker: nothing is said of
the play. The same fields reach ``LaneClient.submit`` / ``submit_many``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, open_client
from worker.client import SubmitRequest

if TYPE_CHECKING:
    Conn = asyncpg.Connection[asyncpg.Record]

QUEUE = "runs_rel_play"
RELEASE = "rel-play"


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[Conn]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def claiming(conn: Conn) -> None:
    await conn.execute(
        f"insert into {SCHEMA}.releases (queue, status, release_ids) values ($1, 'claiming',"
        " array[$2]) on conflict (queue) do nothing",
        QUEUE,
        RELEASE,
    )


async def worker(conn: Conn, plays: list[str], *, stopped: bool = False) -> None:
    await conn.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid, concurrency,"
        " plays, stopped_at) values ($1, $2, $3, 'h', 1, 1, $4, case when $5 then now() end)",
        str(uuid.uuid4()), RELEASE, QUEUE, plays, stopped,
    )  # fmt: skip


async def submit(conn: Conn, play: str, key: str | None = None) -> dict[str, Any]:
    made: dict[str, Any] = await conn.fetchval(
        f"select {SCHEMA}.submit_run($1, '{{}}', $2, $3)", play, RELEASE, key
    )
    return made


async def test_a_play_no_live_worker_registers_is_accepted_with_a_warning(conn: Conn) -> None:
    await claiming(conn)
    # No live worker: nothing is said of the play (its workers are not there to ask).
    await worker(conn, ["old_play"], stopped=True)
    quiet = await submit(conn, "greet")
    assert (quiet["served"], "warning" in quiet, "playServed" in quiet) == (True, False, False)
    await worker(conn, ["shout", "greet_v2"])
    await worker(conn, ["shout", "plain"])
    made = await submit(conn, "greet")
    assert (made["served"], made["playServed"], made["created"]) == (True, False, True)
    assert made["warning"] == (
        f"no live worker of lane {QUEUE} registers play 'greet' (they register greet_v2, "
        "plain, shout): a worker of the lane puts the run back (no attempt spent) until one "
        "that registers the play starts; if no worker of the lane ever registered it, the run "
        "fails for good as an unknown play after LANE_WORKER_UNKNOWN_PLAY_GRACE (10 minutes "
        "by default); check the play's name and the app the lane's workers load."
    )
    status = await conn.fetchval(
        f"select status from {SCHEMA}.runs where run_id = $1", uuid.UUID(made["runId"])
    )
    assert status == "queued"  # accepted all the same
    # A play one of them registers: nothing said.
    fine = await submit(conn, "plain")
    assert (fine["served"], "warning" in fine, "playServed" in fine) == (True, False, False)
    # A repeat of a key says it again, of the stored run's play.
    keyed = await submit(conn, "greet", "k-play")
    again = await submit(conn, "greet", "k-play")
    assert again == {**keyed, "created": False}
    assert again["playServed"] is False


async def test_submit_runs_says_it_for_each_item(conn: Conn) -> None:
    await claiming(conn)
    await worker(conn, ["plain"])
    items = [
        {"play": "plain", "releaseId": RELEASE},
        {"play": "nope", "releaseId": RELEASE},
        {"play": "plain", "releaseId": "dev-nobody"},
    ]
    results = await conn.fetchval(f"select {SCHEMA}.submit_runs($1)", items)
    assert [(r["served"], r.get("playServed", True)) for r in results] == [
        (True, True), (True, False), (False, True),
    ]  # fmt: skip
    assert "warning" not in results[0]
    assert "registers play 'nope' (they register plain)" in results[1]["warning"]
    assert results[2]["warning"].startswith("no worker serves lane runs_nobody")


async def test_a_worker_of_many_plays_is_named_in_short(conn: Conn) -> None:
    await claiming(conn)
    await worker(conn, [f"p{n:02}" for n in range(25)])
    made = await submit(conn, "zzz")
    assert "(they register p00, p01," in made["warning"]
    assert "p19 and 5 more)" in made["warning"]


async def test_the_play_lookup_is_indexed(conn: Conn) -> None:
    """The play's check reads the lane's live workers by workers_queue_live_idx."""
    plans: list[str] = []
    conn.add_log_listener(lambda _c, message: plans.append(message.message))
    for setting in (
        "load 'auto_explain'",
        "set auto_explain.log_min_duration = 0",
        "set auto_explain.log_nested_statements = on",
        "set auto_explain.log_format = 'text'",
        "set client_min_messages = log",
        "set enable_seqscan = off",
    ):
        await conn.execute(setting)
    await conn.fetchval(f"select {SCHEMA}.lane_live_plays('runs_none')")
    await conn.execute("set client_min_messages = notice")
    looked = [p for p in plans if "workers" in p]
    assert looked, plans
    assert not [p for p in looked if "Seq Scan" in p], looked
    assert "using workers_queue_live_idx" in looked[0]


async def test_the_python_client_returns_the_warning(database_url: str, conn: Conn) -> None:
    await claiming(conn)
    await worker(conn, ["plain"])
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}) as client:
        run = await client.submit("greet")
        assert (run.queue, run.served, run.play_served) == (QUEUE, True, False)
        assert run.warning is not None
        assert "registers play 'greet' (they register plain)" in run.warning
        assert run.as_json()["playServed"] is False
        assert run.as_json()["warning"] == run.warning
        run = await client.submit("plain")
        assert (run.served, run.play_served, run.warning) == (True, True, None)
        assert "playServed" not in run.as_json()
        many = await client.submit_many([SubmitRequest("plain"), SubmitRequest("greet")])
        assert [r.play_served for r in many] == [True, False]
        assert many[1].warning is not None
