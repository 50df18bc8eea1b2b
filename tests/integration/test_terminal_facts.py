"""A run's terminal fact is built by the store alone (``terminal_fact``, migration 0032).

Its shape is the TypeScript app's: the lane vectors of ``terminal_ledger_event``
(made from the app's module) hold for the SQL builder, every settle path writes
it (a worker, the reconciler, an operator, the client's cancel), a completion
sends its output once, and a fact an older build still sends is kept as sent.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support.db import fetch
from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    work_once,
)
from worker import App, TaskContext
from worker.db.store import Store
from worker.db.store.attempts import CompletionWrite
from worker.errors import FatalRunError

VECTORS = Path(__file__).parent.parent / "unit" / "data" / "lane_vectors.json"
R = "rel-facts"


@pytest.fixture
async def conn(database_url: str) -> Any:
    connection = await connect(database_url)
    await Store(SCHEMA).migrate(connection)
    yield connection
    await connection.close()


async def built(
    conn: asyncpg.Connection[asyncpg.Record],
    status: str,
    run_id: uuid.UUID,
    *,
    output: Any = None,
    error: Any = None,
    source: str = "worker",
    reason: str | None = None,
) -> dict[str, Any]:
    fact = await conn.fetchval(
        f"select {SCHEMA}.terminal_fact($1, $2, $3::text::jsonb, $4::text::jsonb, $5, $6)::text",
        status, run_id,
        None if output is None else json.dumps(output),
        None if error is None else json.dumps(error),
        source, reason,
    )  # fmt: skip
    decoded: dict[str, Any] = json.loads(fact)
    return decoded


async def test_the_store_builds_the_apps_shape_for_every_lane_vector(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """terminal_ledger_event's vectors (the app's module) hold for the SQL builder, but
    for occurredAt, the database's clock now."""
    vectors = json.loads(VECTORS.read_text())["terminal_ledger_event"]
    seen = 0
    for vector in vectors:
        result, expected = vector["args"]["result"], vector["result"]
        if expected is None or not isinstance(result.get("runId"), str):
            continue  # not terminal: the store never builds those (see the next test)
        run_id = uuid.uuid4()
        fact = await built(
            conn, result["status"], run_id, output=result.get("output"), error=result.get("error")
        )
        assert isinstance(fact.pop("occurredAt"), int)
        assert fact == {
            **{k: v for k, v in expected.items() if k != "occurredAt"},
            "runId": str(run_id),
        }
        seen += 1
    assert seen >= 6


async def test_sources_reasons_and_tracebacks(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Who settled, a cancel's reason, and no traceback in the app's error."""
    run_id = uuid.uuid4()
    error = {"name": "KeyError", "message": "'x'", "traceback": "Traceback ...", "fatal": True}
    failed = await built(conn, "failed", run_id, error=error, source="operator")
    assert failed["source"] == "operator"
    assert failed["error"] == {"name": "KeyError", "message": "'x'", "fatal": True}
    cancelled = await built(conn, "cancelled", run_id, source="client", reason="asked")
    assert set(cancelled) == {"type", "runId", "occurredAt", "source", "reason"}
    assert (cancelled["type"], cancelled["source"], cancelled["reason"]) == (
        "run.cancelled", "client", "asked",
    )  # fmt: skip
    reconciled = await built(conn, "cancelled", run_id, source="reconciler")
    assert set(reconciled) == {"type", "runId", "occurredAt", "source"}
    with pytest.raises(asyncpg.InvalidParameterValueError, match="not a terminal status"):
        await built(conn, "running", run_id)


def facts_app() -> App:
    app = App()

    @app.play("ok")
    async def ok(ctx: TaskContext, params: Any) -> Any:
        return await ctx.step("one", lambda: {"n": params["n"], "text": "é\u2028"})

    @app.play("boom")
    async def boom(ctx: TaskContext, params: Any) -> Any:
        raise FatalRunError("no good")

    return app


async def test_a_workers_facts_are_the_stores_and_hold_the_output_once(
    database_url: str,
) -> None:
    """A completed and a failed run through a real worker: each fact as the app reads it."""
    async with (
        open_client(database_url, env_of(R)) as client,
        open_runtime(database_url, facts_app(), R) as runtime,
    ):
        ok = (await client.submit("ok", {"n": 7})).run_id
        boom = (await client.submit("boom", {})).run_id

        async def ended() -> bool:
            await work_once(runtime)
            return all([(await client.status(i)).finished for i in (ok, boom)])

        await eventually(ended, what="both runs ended")
    rows = await fetch(
        database_url,
        f"select run_id::text, fact::text from {SCHEMA}.ledger "
        "where type in ('run.completed', 'run.failed')",
    )
    by_run = {r["run_id"]: json.loads(r["fact"]) for r in rows}
    completed, failed = by_run[ok], by_run[boom]
    assert isinstance(completed.pop("occurredAt"), int)
    assert completed == {"type": "run.completed", "runId": ok, "source": "worker",
                         "result": {"n": 7, "text": "é\u2028"}}  # fmt: skip
    assert isinstance(failed.pop("occurredAt"), int)
    error = {"name": "FatalRunError", "message": "no good", "fatal": True}
    assert failed == {"type": "run.failed", "runId": boom, "source": "worker", "error": error}
    # The completion's write carries no fact of its own: the output goes once.
    assert "fact" not in {f.name for f in CompletionWrite.__dataclass_fields__.values()}


async def test_a_fact_an_older_build_sends_is_kept_as_sent(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """settle_run's callers from before 0032 pass their fact: it is written unchanged."""
    run_id = uuid.uuid4()
    store = Store(SCHEMA)
    await store.runs.insert(
        conn, run_id=run_id, play="p", input={}, launch={"absurdReleaseId": R}, release_id=R,
        queue="runs_rel_facts", idempotency_key=None, max_attempts=3,
    )  # fmt: skip
    theirs = {"type": "run.completed", "runId": str(run_id), "occurredAt": 1, "source": "worker",
              "result": {"older": True}}  # fmt: skip
    settled = await conn.fetchval(
        f"select {SCHEMA}.settle_run($1, null, 'completed', $2::text::jsonb, null, "
        "'run.completed', $3::text::jsonb, null)",
        run_id, json.dumps({"older": True}), json.dumps(theirs),
    )  # fmt: skip
    assert settled == run_id
    fact = await conn.fetchval(f"select fact::text from {SCHEMA}.ledger where run_id = $1", run_id)
    assert json.loads(fact) == theirs
