"""The app's SQL API (store migration 0008), called over a plain connection as any language would.

``submit_run``, ``signal_run``, ``cancel_run`` and ``run_status``: what each returns,
the SQLSTATE each refusal carries (and that a refusal writes nothing), the lane a
release id maps to (the reference vectors, replayed in SQL), and the wake-up NOTIFY.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect

VECTORS = json.loads(
    (Path(__file__).parent.parent / "unit" / "data" / "lane_vectors.json").read_text("utf-8")
)
TOKEN = "exec-token-7f3a"
API = {"baseUrl": "http://127.0.0.1:9/app", "executorToken": TOKEN}


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def call(conn: asyncpg.Connection[asyncpg.Record], fn: str, *args: Any) -> Any:
    """Call ``<store>.<fn>(args...)`` the way an app does: positional, text in, jsonb out."""
    params = ", ".join(f"${n}" for n in range(1, len(args) + 1))
    return await conn.fetchval(f"select {SCHEMA}.{fn}({params})", *args)


async def counts(conn: asyncpg.Connection[asyncpg.Record]) -> tuple[int, ...]:
    """Rows in every table a request could write (store and engine queues)."""
    store = [
        await conn.fetchval(f"select count(*) from {SCHEMA}.{t}")
        for t in ("runs", "signals", "ledger", "run_runtime_api")
    ]
    queues = await conn.fetchval("select count(*) from absurd.queues")
    return (*store, queues)


async def test_submit_returns_the_run_and_wakes_its_lane(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A submit writes the run and its engine task, and NOTIFYs the lane's channel at commit."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener("lane_worker_runs_rel_1", lambda *a: heard.put_nowait(a[3]))
    made = await call(conn, "submit_run", "greet", {"name": "ada"}, "rel-1")
    assert made == {
        "runId": made["runId"],
        "queue": "runs_rel_1",
        "releaseId": "rel-1",
        "created": True,
        # No worker serves rel-1 (migration 0029: test_lane_served.py).
        "served": False,
        "warning": made["warning"],
    }
    assert await asyncio.wait_for(heard.get(), 10) == made["runId"]
    row = await conn.fetchrow(
        f"select play, input, status, task_id, launch from {SCHEMA}.runs where run_id = $1",
        uuid.UUID(made["runId"]),
    )
    assert row is not None
    assert (row["play"], row["input"], row["status"]) == ("greet", {"name": "ada"}, "queued")
    assert row["launch"]["absurdReleaseId"] == "rel-1"
    task = await conn.fetchrow(
        "select task_name, params from absurd.t_runs_rel_1 where task_id = $1", row["task_id"]
    )
    assert task is not None
    assert (task["task_name"], task["params"]) == ("play-run", {"runId": made["runId"]})


async def test_an_idempotent_repeat_returns_the_first_run_and_a_different_request_is_refused(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The same key and request: created false, nothing written; another request: 23505."""
    first = await call(conn, "submit_run", "greet", {"n": 1}, "rel-1", "order-9")
    before = await counts(conn)
    again = await call(conn, "submit_run", "greet", {"n": 1.0}, "rel-1", "order-9")
    assert again == {**first, "created": False}
    assert await counts(conn) == before
    with pytest.raises(asyncpg.UniqueViolationError) as caught:
        await call(conn, "submit_run", "greet", {"n": 2}, "rel-2", "order-9")
    assert caught.value.constraint_name == "idempotency_key"
    assert caught.value.detail == first["runId"]
    assert "differs in its input and lane" in str(caught.value)
    assert await counts(conn) == before


BAD_SUBMITS: list[tuple[str, tuple[Any, ...], str]] = [
    ("no-play", (None, {}, "rel-1"), "needs a play name"),
    ("blank-play", ("  ", {}, "rel-1"), "needs a play name"),
    ("long-play", ("p" * 201, {}, "rel-1"), "at most 200 characters"),
    ("list-input", ("p", [1], "rel-1"), "must be a JSON object, not a JSON array"),
    ("string-input", ("p", "x", "rel-1"), "must be a JSON object, not a JSON string"),
    ("big-input", ("p", {"k": "x" * 1_048_576}, "rel-1"), "more than the 1048576 bytes"),
    ("no-release", ("p", {}, None), "needs a non-empty release id"),
    ("blank-release", ("p", {}, " \t"), "needs a non-empty release id"),
    ("no-lane", ("p", {}, "---"), "names no queue"),
    ("blank-key", ("p", {}, "rel-1", " "), "an idempotency key must be a non-blank string"),
    ("long-key", ("p", {}, "rel-1", "k" * 256), "at most 255 characters"),
    ("api-not-object", ("p", {}, "rel-1", None, ["x"]), "must be a JSON object"),
    ("api-no-url", ("p", {}, "rel-1", None, {"executorToken": TOKEN}), "baseUrl must be"),
    ("api-ftp", ("p", {}, "rel-1", None, {**API, "baseUrl": "ftp://h"}), "baseUrl must be"),
    ("api-no-token", ("p", {}, "rel-1", None, {"baseUrl": "https://h"}), "needs an executorToken"),
    ("api-unknown", ("p", {}, "rel-1", None, {**API, "token": TOKEN}), "unknown field 'token'"),
    ("api-number", ("p", {}, "rel-1", None, {**API, "integrationMode": 1}), "must be a string"),
    ("attempts", ("p", {}, "rel-1", None, None, 0), "between 1 and 1000"),
    ("long-release", ("p", {}, "r" * 201), "over 200 characters"),
    ("api-userinfo", ("p", {}, "rel-1", None, {**API, "baseUrl": "http://u:pw@h/app"}), "no user"),
    ("api-empty-label", ("p", {}, "rel-1", None, {**API, "baseUrl": "http://a..b/app"}), "baseUrl"),
    ("api-port", ("p", {}, "rel-1", None, {**API, "baseUrl": "http://h:99999/"}), "1..65535"),
    ("api-query", ("p", {}, "rel-1", None, {**API, "baseUrl": "https://h/a?x=1"}), "no user"),
    ("api-newline", ("p", {}, "rel-1", None, {**API, "executorToken": "a\nb"}), "control"),
    (
        "api-del",
        ("p", {}, "rel-1", None, {**API, "vercelProtectionBypassToken": "a\x7f"}),
        "control",
    ),
]


@pytest.mark.parametrize(
    ("args", "says"), [c[1:] for c in BAD_SUBMITS], ids=[c[0] for c in BAD_SUBMITS]
)
async def test_a_bad_submit_is_refused_with_22023_and_writes_nothing(
    conn: asyncpg.Connection[asyncpg.Record], args: tuple[Any, ...], says: str
) -> None:
    """Each unusable argument: SQLSTATE 22023, a sentence naming it, no row, no queue, no token."""
    before = await counts(conn)
    with pytest.raises(asyncpg.InvalidParameterValueError) as caught:
        await call(conn, "submit_run", *args)
    assert says in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert await counts(conn) == before


@pytest.mark.parametrize(
    "vector",
    # Postgres text holds no NUL: no app can send such a release id.
    [v for v in VECTORS["queue_name_for_release"] if "\x00" not in v["args"]["release_id"]],
    ids=lambda v: json.dumps(v["args"])[:60],
)
async def test_the_lane_of_a_release_id_is_the_reference_s(
    conn: asyncpg.Connection[asyncpg.Record], vector: dict[str, Any]
) -> None:
    """queue_for_release gives the reference module's queue (DESIGN's rule where they differ)."""
    release_id = vector["args"]["release_id"]
    expected = vector.get("design_rule", vector)
    if expected.get("error"):
        with pytest.raises(asyncpg.InvalidParameterValueError):
            await call(conn, "queue_for_release", release_id)
    else:
        assert await call(conn, "queue_for_release", release_id) == expected["result"]


async def test_signal_delivers_once_and_says_when_the_run_ended(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """First delivery wins; a repeat is a duplicate; a cancelled run keeps it for a retry."""
    run = (await call(conn, "submit_run", "greet", {}, "rel-1"))["runId"]
    said = await call(conn, "signal_run", uuid.UUID(run), "approved", {"by": "ops"})
    assert said == {
        "runId": run, "eventKey": "approved", "delivered": True, "duplicate": False,
        "runEnded": None, "deliveredTo": run, "keptForRetry": False,
    }  # fmt: skip
    again = await call(conn, "signal_run", uuid.UUID(run), "approved", {"by": "someone else"})
    assert (again["delivered"], again["duplicate"]) == (False, True)
    payload = await conn.fetchval(
        f"select payload from {SCHEMA}.signals where run_id = $1", uuid.UUID(run)
    )
    assert payload == {"by": "ops"}
    event = await conn.fetchval(
        "select event_name from absurd.e_runs_rel_1 where event_name = $1", f"evt:{run}:approved"
    )
    assert event == f"evt:{run}:approved"

    assert await call(conn, "cancel_run", uuid.UUID(run), "not needed") == {
        "runId": run, "cancelled": True, "status": "cancelled",
    }  # fmt: skip
    kept = await call(conn, "signal_run", uuid.UUID(run), "later", None)
    assert (kept["delivered"], kept["runEnded"], kept["keptForRetry"]) == (False, "cancelled", True)
    with pytest.raises(asyncpg.NoDataFoundError):
        await call(conn, "signal_run", uuid.uuid4(), "approved", None)
    with pytest.raises(asyncpg.InvalidParameterValueError, match="an event key must be"):
        await call(conn, "signal_run", uuid.UUID(run), "", None)


async def test_cancel_settles_once_with_its_fact_and_status_shows_it_without_secrets(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """cancel_run: the engine task cancelled, one run.cancelled fact; run_status hides the API."""
    run = (await call(conn, "submit_run", "greet", {}, "rel-1", None, API))["runId"]
    assert await conn.fetchval(f"select api from {SCHEMA}.run_runtime_api") == API
    said = await call(conn, "cancel_run", uuid.UUID(run), "operator asked")
    assert said["cancelled"] is True
    assert (await call(conn, "cancel_run", uuid.UUID(run)))["cancelled"] is False
    state = await conn.fetchval("select state from absurd.t_runs_rel_1")
    assert state == "cancelled"
    fact = await conn.fetchval(
        f"select fact from {SCHEMA}.ledger where run_id = $1", uuid.UUID(run)
    )
    assert {k: fact[k] for k in ("type", "runId", "source", "reason")} == {
        "type": "run.cancelled", "runId": run, "source": "client", "reason": "operator asked",
    }  # fmt: skip
    status = await call(conn, "run_status", uuid.UUID(run))
    assert (status["runId"], status["status"], status["queue"]) == (run, "cancelled", "runs_rel_1")
    # An operator's cancel (the CLI, the page: cancel_run_by) names the operator.
    other = (await call(conn, "submit_run", "greet", {}, "rel-1", None, None))["runId"]
    said = await conn.fetchval(
        f"select {SCHEMA}.cancel_run_by($1, 'incident', 'operator')", uuid.UUID(other)
    )
    assert said["cancelled"] is True
    fact = await conn.fetchval(
        f"select fact from {SCHEMA}.ledger where run_id = $1", uuid.UUID(other)
    )
    assert (fact["source"], fact["reason"]) == ("operator", "incident")
    with pytest.raises(asyncpg.InvalidParameterValueError, match="client or operator"):
        await conn.fetchval(f"select {SCHEMA}.cancel_run_by($1, null, 'app')", uuid.UUID(other))
    assert [f["type"] for f in status["facts"]] == ["run.cancelled"]
    assert set(status) == {
        "runId", "play", "status", "releaseId", "adoptedReleaseId", "queue", "attempts",
        "attemptCount", "maxAttempts", "claims",  # 0036: attempts spent, and the claims
        "output", "error", "retryOf", "steps", "facts",
    }  # fmt: skip
    assert (status["attemptCount"], status["claims"], status["attempts"]) == (0, [], [])
    assert TOKEN not in json.dumps(status)
    with pytest.raises(asyncpg.NoDataFoundError, match="no run"):
        await call(conn, "run_status", uuid.uuid4())
    for fn in ("run_status", "cancel_run", "signal_run"):
        args = (None, "k", None) if fn == "signal_run" else (None,)
        with pytest.raises(asyncpg.InvalidParameterValueError, match="a run id is required"):
            await call(conn, fn, *args)
