"""``submit_runs`` (store migration 0025): many submits in one transaction, as an app calls it.

Each item is checked as ``submit_run`` checks its arguments (the refusals of
``test_db_api.py``'s ``BAD_SUBMITS``, compared message for message), a refusal
names its item and writes nothing, and idempotency keys answer as ``submit_run``
answers them, inside one call too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from test_db_api import API, BAD_SUBMITS, TOKEN, call, counts

from support.runtime import SCHEMA, connect, eventually

ARGUMENTS = ("play", "input", "releaseId", "idempotencyKey", "runtimeApi", "maxAttempts")
GOOD = [{"play": "greet", "input": {"n": 0}, "releaseId": "rel-1"},
        {"play": "greet", "input": {"n": 1}, "releaseId": "rel-2"}]  # fmt: skip


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


def item_of(args: tuple[Any, ...]) -> dict[str, Any]:
    """submit_run's positional arguments as a submit_runs item."""
    return dict(zip(ARGUMENTS, args, strict=False))


async def run_row(conn: asyncpg.Connection[asyncpg.Record], run_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        f"select r.*, a.api from {SCHEMA}.runs r"
        f" left join {SCHEMA}.run_runtime_api a using (run_id) where r.run_id = $1",
        uuid.UUID(run_id),
    )
    assert row is not None
    return row


async def test_every_item_is_made_with_its_task_and_answered_in_order(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """One result per item in order (submit_run's shape); each run has its task and wake-up."""
    heard: list[str] = []
    await conn.add_listener("lane_worker_runs_rel_1", lambda *a: heard.append(a[3]))
    items = [
        {"play": "greet", "input": {"name": "ada"}, "releaseId": " rel-1 "},
        {"play": "bill", "releaseId": "Rel-2", "idempotencyKey": "order-1",
         "runtimeApi": API, "maxAttempts": 3},
        {"play": "greet", "input": None, "releaseId": "rel-1", "idempotencyKey": None},
    ]  # fmt: skip
    made = await call(conn, "submit_runs", items)
    assert [{k: m[k] for k in ("queue", "releaseId", "created")} for m in made] == [
        {"queue": "runs_rel_1", "releaseId": "rel-1", "created": True},
        {"queue": "runs_rel_2", "releaseId": "Rel-2", "created": True},
        {"queue": "runs_rel_1", "releaseId": "rel-1", "created": True},
    ]
    assert len({m["runId"] for m in made}) == 3
    for result, item in zip(made, items, strict=True):
        row = await run_row(conn, result["runId"])
        assert (row["play"], row["input"]) == (item["play"], item.get("input") or {})
        assert row["idempotency_key"] == item.get("idempotencyKey")
        assert row["max_attempts"] == item.get("maxAttempts", 5)
        assert row["api"] == item.get("runtimeApi")
        assert row["launch"] == {"absurdReleaseId": result["releaseId"], "play": item["play"],
                                 "runId": result["runId"]}  # fmt: skip
        task = await conn.fetchrow(
            f"select task_name, params, max_attempts from absurd.t_{result['queue']}"
            " where task_id = $1",
            row["task_id"],
        )
        assert task is not None
        assert dict(task) == {"task_name": "play-run", "params": {"runId": result["runId"]},
                              "max_attempts": row["max_attempts"]}  # fmt: skip
    await conn.execute("select 1")  # a round trip: the notifications have arrived
    assert sorted(heard) == sorted([made[0]["runId"], made[2]["runId"]])


async def test_an_empty_array_submits_nothing(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    before = await counts(conn)
    assert await call(conn, "submit_runs", []) == []
    assert await counts(conn) == before


@pytest.mark.parametrize(
    ("args", "says"), [c[1:] for c in BAD_SUBMITS], ids=[c[0] for c in BAD_SUBMITS]
)
async def test_each_bad_item_is_refused_as_submit_run_refuses_it_naming_its_index(
    conn: asyncpg.Connection[asyncpg.Record], args: tuple[Any, ...], says: str
) -> None:
    """The same SQLSTATE and message as submit_run's, after ``item 2: ``; nothing written."""
    with pytest.raises(asyncpg.PostgresError) as alone:
        await call(conn, "submit_run", *args)
    before = await counts(conn)
    with pytest.raises(asyncpg.PostgresError) as caught:
        await call(conn, "submit_runs", [*GOOD, item_of(args), GOOD[0]])
    assert caught.value.sqlstate == alone.value.sqlstate == "22023"
    assert str(caught.value) == f"item 2: {alone.value}"
    assert says in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert await counts(conn) == before


NOT_SUBMITS: list[tuple[str, Any, str]] = [
    ("null", None, "takes a JSON array of submits, not a JSON null"),
    ("object", {"play": "p"}, "takes a JSON array of submits, not a JSON object"),
    ("string", "[]", "takes a JSON array of submits, not a JSON string"),
    ("number-item", [*GOOD, 7], "item 2: a submit is a JSON object"),
    ("array-item", [[], *GOOD], "item 0: a submit is a JSON object (play, input, releaseId,"),
    ("null-item", [GOOD[0], None], "item 1: a submit is a JSON object"),
    ("unknown-field", [GOOD[0], {**GOOD[1], "release": "x"}], "item 1: a submit has no field"),
    ("play-number", [{**GOOD[0], "play": 7}], "item 0: a submit's play must be a JSON string"),
    ("release-list", [{**GOOD[0], "releaseId": ["r"]}], "item 0: a submit's releaseId must be"),
    ("key-number", [{**GOOD[0], "idempotencyKey": 1}], "item 0: a submit's idempotencyKey"),
    ("attempts-fraction", [{**GOOD[0], "maxAttempts": 1.5}], "maxAttempts must be a whole"),
    ("attempts-string", [{**GOOD[0], "maxAttempts": "3"}], "maxAttempts must be a whole"),
    ("attempts-huge", [{**GOOD[0], "maxAttempts": 10**20}], "between 1 and 1000"),
    ("attempts-over", [{**GOOD[0], "maxAttempts": 1001}], "item 0: max attempts must be"),
]


@pytest.mark.parametrize(
    ("items", "says"), [c[1:] for c in NOT_SUBMITS], ids=[c[0] for c in NOT_SUBMITS]
)
async def test_what_is_no_array_of_submits_is_refused_with_22023(
    conn: asyncpg.Connection[asyncpg.Record], items: Any, says: str
) -> None:
    before = await counts(conn)
    with pytest.raises(asyncpg.InvalidParameterValueError) as caught:
        await call(conn, "submit_runs", items)
    assert says in str(caught.value)
    assert await counts(conn) == before


async def test_a_key_that_names_a_run_answers_it_and_a_different_request_is_refused(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """As submit_run: same request, created false; another: 23505 naming the item and run."""
    first = await call(conn, "submit_run", "greet", {"n": 1}, "rel-1", "order-9")
    before = await counts(conn)
    again = await call(conn, "submit_runs", [
        {"play": "greet", "input": {"n": 1.0}, "releaseId": "rel-1", "idempotencyKey": "order-9"},
    ])  # fmt: skip
    assert again == [{**first, "created": False}]
    assert await counts(conn) == before
    with pytest.raises(asyncpg.UniqueViolationError) as caught:
        await call(conn, "submit_runs", [
            *GOOD,
            {"play": "greet", "input": {"n": 2}, "releaseId": "rel-3",
             "idempotencyKey": "order-9"},
        ])  # fmt: skip
    assert caught.value.constraint_name == "idempotency_key"
    assert caught.value.detail == first["runId"]
    assert str(caught.value).startswith(f"item 2: idempotency key 'order-9' already names run "
                                        f"{first['runId']}")  # fmt: skip
    assert "differs in its input and lane" in str(caught.value)
    assert await counts(conn) == before


async def test_a_key_repeated_in_one_call_answers_the_first_items_run(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The second item with a key gets the first's run, created false: one run is made."""
    item = {"play": "greet", "input": {"n": 1}, "releaseId": "rel-1", "idempotencyKey": "k"}
    before = await counts(conn)
    made = await call(conn, "submit_runs", [item, GOOD[0], {**item, "input": {"n": 1.0}}])
    assert made[2] == {**made[0], "created": False}
    assert made[0]["created"]
    assert made[1]["created"]
    assert await counts(conn) == (before[0] + 2, *before[1:4], before[4] + 1)
    # A later call answers it as submit_run would.
    assert await call(conn, "submit_run", "greet", {"n": 1}, "rel-1", "k") == made[2]


async def test_a_key_repeated_in_one_call_for_another_request_is_refused(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    item = {"play": "greet", "input": {"n": 1}, "releaseId": "rel-1", "idempotencyKey": "k"}
    before = await counts(conn)
    with pytest.raises(asyncpg.UniqueViolationError) as caught:
        await call(conn, "submit_runs", [GOOD[0], item, {**item, "play": "bill"}])
    assert caught.value.constraint_name == "idempotency_key"
    assert str(caught.value).startswith("item 2: idempotency key 'k' already names run ")
    assert "differs in its play" in str(caught.value)
    assert await counts(conn) == before


async def waits_for_a_lock(url: str, call: asyncio.Future[Any]) -> bool:
    """Tell whether a submit_runs call of another session waits for a lock (or ended).

    Asked on a fresh connection: a session inside a transaction keeps its first
    view of pg_stat_activity until that transaction ends, so the session holding
    the key would never see the call start to wait.
    """
    if call.done():
        return True
    watcher = await connect(url)
    try:
        waiting = await watcher.fetchval(
            "select count(*) from pg_stat_activity where datname = current_database()"
            " and wait_event_type = 'Lock' and query like '%submit_runs%'"
        )
    finally:
        await watcher.close()
    return bool(waiting)


async def test_a_key_committed_meanwhile_by_another_call_is_answered_with_its_run(
    database_url: str, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    """Another transaction's uncommitted run with the key: this call waits, then answers it."""
    item = {"play": "greet", "input": {"n": 1}, "releaseId": "rel-1", "idempotencyKey": "k"}
    other = await connect(database_url)
    try:
        tx = other.transaction()
        await tx.start()
        theirs = await call(other, "submit_runs", [item])
        mine = asyncio.ensure_future(call(conn, "submit_runs", [GOOD[0], item, item]))
        await eventually(lambda: waits_for_a_lock(database_url, mine), what="the call to wait")
        assert not mine.done()
        await tx.commit()
        made = await asyncio.wait_for(mine, 30)
    finally:
        await other.close()
    assert made[1] == made[2] == {**theirs[0], "created": False}
    assert made[0]["created"]
    assert await conn.fetchval(f"select count(*) from {SCHEMA}.runs") == 2
    assert await conn.fetchval("select count(*) from absurd.t_runs_rel_1") == 2


async def test_a_key_committed_meanwhile_for_another_request_refuses_the_call(
    database_url: str, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    item = {"play": "greet", "input": {"n": 1}, "releaseId": "rel-1", "idempotencyKey": "k"}
    other = await connect(database_url)
    try:
        async with other.transaction():
            await call(other, "submit_runs", [{**item, "play": "bill"}])
            mine = asyncio.ensure_future(call(conn, "submit_runs", [GOOD[0], item]))
            await eventually(lambda: waits_for_a_lock(database_url, mine), what="the call to wait")
        with pytest.raises(asyncpg.UniqueViolationError) as caught:
            await asyncio.wait_for(mine, 30)
    finally:
        await other.close()
    assert str(caught.value).startswith("item 1: idempotency key 'k' already names run ")
    assert await conn.fetchval(f"select count(*) from {SCHEMA}.runs") == 1


async def test_submit_run_still_answers_as_before(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Redefined by 0025 to call checked_submit: the same result and stored run."""
    made = await call(conn, "submit_run", "greet", None, " rel-1 ", None, API, 7)
    assert made == {"runId": made["runId"], "queue": "runs_rel_1", "releaseId": "rel-1",
                    "created": True, "served": False,  # 0029: no worker serves rel-1
                    "warning": made["warning"]}  # fmt: skip
    row = await run_row(conn, made["runId"])
    assert (row["input"], row["max_attempts"], row["api"]) == ({}, 7, API)
    assert row["task_id"] is not None
