"""Values the store's SQL API refuses because a worker could not read them back (issue 29 §3).

Called as any language calls the API: JSON text in (``$n::text::jsonb``), so a
value Python itself could not encode still reaches the function. Each refusal
carries SQLSTATE 22023 and writes nothing; one table of limits, the SQL's
``value_limits()``, is held here to the Python client's constants.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect
from worker import jsonvalue, limits


def nested(depth: int, leaf: str = "1") -> str:
    """JSON text of ``leaf`` under ``depth`` levels of arrays (the leaf sits at ``depth``)."""
    return "[" * depth + leaf + "]" * depth


DEEP = nested(3000)  # 6 KB; JSON.stringify writes it happily
DIGITS = "1" * 5001  # Python refuses integers over 4,300 digits
HOSTILE = {
    "3000 levels": (DEEP, "nests deeper than 512 levels"),
    "513 levels": (nested(512), "nests deeper than 512 levels"),  # under {"v": ...}
    "an object 513 levels": ('{"a":' * 513 + "1" + "}" * 513, "nests deeper than 512 levels"),
    "5001 digits": (f'{{"n": {DIGITS}}}', "a number of 5001 digits"),
    "4301 digits, negative": (f'{{"n": -{"9" * 4301}}}', "a number of 4301 digits"),
    "1e5000": ('{"n": 1e5000}', "a number of 5001 digits"),
    "a fraction past a double": ('{"n": ' + "1" * 400 + ".5}", "a number of 401 digits"),
}
# Just within every limit: each reads back in Python exactly.
WITHIN = {
    "512 levels": nested(511),  # under {"v": ...}
    "4300 digits": f'{{"n": {"9" * 4300}}}',
    "a 400-digit integer": '{"n": ' + "1" * 400 + "}",
    "1e-400": '{"n": 1e-400}',
    "5000 digits in a string": '{"s": "' + "1" * 5000 + '"}',
}


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def counts(conn: asyncpg.Connection[asyncpg.Record]) -> tuple[int, ...]:
    """Rows in every table a refused request could have written."""
    tables = ("runs", "signals", "ledger", "run_runtime_api", "runner_attempts")
    store = [await conn.fetchval(f"select count(*) from {SCHEMA}.{t}") for t in tables]
    reported = await conn.fetchval(
        f"select count(*) from {SCHEMA}.runner_attempts where reported_at is not null"
    )
    return (*store, reported, await conn.fetchval("select count(*) from absurd.queues"))


async def submit_text(
    conn: asyncpg.Connection[asyncpg.Record], input_text: str, **more: Any
) -> Any:
    return await conn.fetchval(
        f"select {SCHEMA}.submit_run('greet', $1::text::jsonb, 'rel-1', $2, $3::text::jsonb)",
        input_text,
        more.get("key"),
        more.get("api"),
    )


async def refused(conn: asyncpg.Connection[asyncpg.Record], call: Any) -> str:
    """Await ``call``; return its 22023 message, having checked it wrote nothing."""
    before = await counts(conn)
    with pytest.raises(asyncpg.PostgresError) as caught:
        await call
    assert caught.value.sqlstate == "22023", caught.value
    assert await counts(conn) == before
    return str(caught.value)


async def test_one_table_of_limits_serves_python_and_sql(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """value_limits() holds the numbers worker/limits.py and worker/jsonvalue.py enforce."""
    row = await conn.fetchrow(f"select * from {SCHEMA}.value_limits()")
    assert row is not None
    assert dict(row) == {
        "max_depth": jsonvalue.MAX_DEPTH,
        "max_integer_digits": jsonvalue.MAX_INTEGER_DIGITS,
        "max_value_bytes": limits.MAX_INPUT_BYTES,
        "max_key_chars": limits.MAX_KEY_CHARS,
        "max_play_chars": limits.MAX_PLAY_CHARS,
    }


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_submit_refuses_an_input_no_worker_can_read(
    conn: asyncpg.Connection[asyncpg.Record], name: str
) -> None:
    """An input too deep or with a too-long number is refused with 22023, nothing written."""
    text, says = HOSTILE[name]
    value = text if text.startswith("{") else f'{{"v": {text}}}'
    message = await refused(conn, submit_text(conn, value))
    assert "the run's input" in message, message
    assert says in message, message


@pytest.mark.parametrize("name", sorted(WITHIN))
async def test_values_within_the_limits_are_stored_and_read_back(
    conn: asyncpg.Connection[asyncpg.Record], name: str
) -> None:
    """A value at each limit is accepted and reads back in Python as it was sent."""
    text = WITHIN[name]
    value = text if text.startswith("{") else f'{{"v": {text}}}'
    made = await submit_text(conn, value)
    stored = await conn.fetchval(
        f"select input from {SCHEMA}.runs where run_id = $1", uuid.UUID(made["runId"])
    )
    assert jsonvalue.json_problem(stored) is None


async def test_signal_refuses_a_payload_no_worker_can_read(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """signal_run refuses a 3,000-deep or 5,001-digit payload (22023), delivering nothing."""
    made = await submit_text(conn, "{}")
    run_id = uuid.UUID(made["runId"])
    for payload in (DEEP, DIGITS, '{"a": ' + DIGITS + "}"):
        call = conn.fetchval(
            f"select {SCHEMA}.signal_run($1, 'approved', $2::text::jsonb)", run_id, payload
        )
        message = await refused(conn, call)
        assert "the event's payload" in message
    # Refused, not consumed: the same key still delivers.
    said = await conn.fetchval(
        f"select {SCHEMA}.signal_run($1, 'approved', $2::text::jsonb)", run_id, '{"ok": 1}'
    )
    assert said["delivered"] is True


async def test_a_runner_can_report_again_after_a_refused_report(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A refused runner result records nothing, so the runner's corrected report is the first."""
    made = await submit_text(conn, "{}")
    run_id = uuid.UUID(made["runId"])
    number = await conn.fetchval(f"select {SCHEMA}.begin_runner_attempt($1, 'build')", run_id)
    report = f"select {SCHEMA}.report_runner_result($1, $2, $3::text::jsonb)"
    for bad in (DEEP, DIGITS):
        message = await refused(conn, conn.fetchval(report, run_id, number, bad))
        assert "the runner's result" in message
    said = await conn.fetchval(report, run_id, number, '{"ok": true}')
    assert (said["recorded"], said["duplicate"], said["woke"]) == (True, False, True)
    stored = await conn.fetchval(
        f"select result from {SCHEMA}.runner_attempts where run_id = $1 and runner_attempt = $2",
        run_id,
        number,
    )
    assert stored == {"ok": True}


async def test_a_runtime_api_context_holds_only_short_strings(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A deep or numeric runtime API context is refused (22023) by its shape check."""
    base = '"baseUrl": "http://127.0.0.1:9/app", "executorToken": "t0k"'
    for api in (
        "{" + base + ', "integrationMode": ' + nested(3000, '"x"') + "}",
        "{" + base + ', "integrationMode": ' + DIGITS + "}",
    ):
        message = await refused(conn, submit_text(conn, "{}", api=api))
        assert "must be a string" in message
        assert "t0k" not in message


async def test_nul_and_lone_surrogates_never_reach_a_function(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """jsonb itself refuses \\u0000 and an unpaired surrogate, before any function runs."""
    before = await counts(conn)
    for text in ('{"a": "x\\u0000y"}', '{"a\\u0000": 1}', '{"a": "\\ud800"}'):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await submit_text(conn, text)
        assert caught.value.sqlstate in {"22P05", "22P02"}, caught.value
    assert await counts(conn) == before


async def test_an_over_long_key_is_refused_by_the_shared_limit(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """checked_key reads max_key_chars: 255 characters pass, 256 are refused (22023)."""
    await submit_text(conn, "{}", key="k" * limits.MAX_KEY_CHARS)
    message = await refused(conn, submit_text(conn, "{}", key="k" * (limits.MAX_KEY_CHARS + 1)))
    assert f"at most {limits.MAX_KEY_CHARS} characters" in message
