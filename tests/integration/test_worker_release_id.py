"""``worker_release_id(suffix, deploy version)`` (store migration 0029) against worker/lanes.py.

The SQL function tells an app in any language the release id a worker started
with ``DEEPLINE_ABSURD_QUEUE_SUFFIX`` / ``DEEPLINE_RUNTIME_DEPLOY_VERSION`` serves.
Table-driven: every pair of inputs goes through the SQL function and through the
Python the worker runs (``launch_release_id``, ``queue_name_for_release`` and the
boot guard, ``topology.lane_of``); both must give the same release id and queue,
or both refuse.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, open_client
from worker import lanes
from worker.config.env import Problems
from worker.config.topology import lane_of
from worker.errors import InvalidRequestError

SUFFIXES: list[str | None] = [
    None,
    "",
    "   ",
    "pr-7",
    " PR 7 ",
    "Feature/Login-Page",
    "Ünïcödé-ß",
    "\u0130stanbul",  # İ lowers to i and a combining dot
    "\u212aelvin",  # KELVIN SIGN lowers to k
    "日本",
    "--",
    "a" * 40,
    "a" * 31 + "-b",  # cut at 32 just after the underscore
    "x_" * 20,
    "tab\there",
    "\u3000wide\u3000",
]
VERSIONS: list[str | None] = [
    None,
    "",
    " \n",
    "rel-a",
    "Rel-A",
    " rel-a\n",
    "0f3c9a1e2b7d4c6a8e5f",
    "release/2026.12.07+build.5",
    "dev",
    "DEV",
    "Dev-X",
    "dev-x",
    "dev-",
    "-dev-",
    "runs_x",
    "runs",
    "!!!",
    "été",
    "ü" * 50 + "x",
    "a" * 40,
    "a" * 41,
    "A" * 31 + "-" + "b" * 20,
    "x" * 200,
    "x" * 201,
    "🚀launch",
    "\u3000rel\u3000",  # ideographic spaces trim
    "rel\u00a0a",  # a no-break space inside: not printable
    "rel\u200ba",  # a zero-width space (format character)
    "rel\ta",
    "rel\u0085a",
    "rel\ue000a",  # private use
    "rel\u2028a",
    "rel a",
]


def python_says(suffix: str | None, version: str | None) -> dict[str, str] | None:
    """What a worker with this environment serves (None: it refuses to boot)."""
    env = {
        name: value
        for name, value in ((lanes.QUEUE_SUFFIX_ENV, suffix), (lanes.RELEASE_ID_ENV, version))
        if value is not None
    }
    problems = Problems()
    lane = lane_of(env, lanes.PROD_DEFAULT_SCHEMA, False, problems)
    if problems.errors:
        return None
    assert lane.queue is not None
    release_id = lanes.launch_release_id(env)
    # The id as deployed rides the queue the worker drains (the boot guard's point).
    assert lanes.queue_name_for_release(release_id) == lane.queue
    return {"releaseId": release_id, "queue": lane.queue}


async def sql_says(
    conn: asyncpg.Connection[asyncpg.Record], suffix: str | None, version: str | None
) -> dict[str, str] | None:
    try:
        said: dict[str, str] = await conn.fetchval(
            f"select {SCHEMA}.worker_release_id($1, $2)", suffix, version
        )
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != "22023":
            raise
        return None
    return said


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_sql_and_python_agree_on_every_input(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    cases = list(itertools.product(SUFFIXES, VERSIONS))
    differ: list[tuple[Any, ...]] = []
    for suffix, version in cases:
        want, got = python_says(suffix, version), await sql_says(conn, suffix, version)
        if want != got:
            differ.append((suffix, version, want, got))
    assert differ == []
    # The table reaches every branch: each kind of answer, and refusals of both inputs.
    answers = [python_says(s, v) for s, v in cases]
    assert sum(a is None for a in answers) >= 40
    ids = {a["releaseId"] for a in answers if a is not None}
    assert {"dev", "dev-pr_7", "Rel-A", "release/2026.12.07+build.5", "été"} <= ids
    assert sum(i.startswith("dev-") for i in ids) >= 8


async def test_examples_and_refusals(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """The shapes an app relies on, and one sentence naming what is wrong."""
    assert await sql_says(conn, None, None) == {"releaseId": "dev", "queue": "runs"}
    assert await sql_says(conn, "PR 7", "rel-a") == {"releaseId": "dev-pr_7", "queue": "runs_pr_7"}
    assert await sql_says(conn, " ", " Rel-A ") == {"releaseId": "Rel-A", "queue": "runs_rel_a"}
    call = f"select {SCHEMA}.worker_release_id($1, $2)"
    refusals = [
        (("--", None), "queue suffix '--' has no letter, digit or underscore"),
        ((None, "!!!"), "deploy version '!!!' has no letter, digit or underscore"),
        ((None, "rel\ta"), "a deploy version is printable text, and this one holds U+0009;"),
        ((None, "x" * 201), "a deploy version has at most 200 characters (this one has 201);"),
        ((None, "dev-x"), "deploy version 'dev-x' is spelled like a dev lane"),
    ]
    for args, says in refusals:
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.fetchval(call, *args)
        assert caught.value.sqlstate == "22023"
        assert caught.value.args[0].startswith(says)
        assert caught.value.args[0].endswith(
            "pass the release id as deployed (for example a git sha), or null for the dev lane."
        ) == (args[0] is None)
    # Named arguments, as an app may call it.
    named = await conn.fetchval(f"select {SCHEMA}.worker_release_id(p_deploy_version => 'r1')")
    assert named == {"releaseId": "r1", "queue": "runs_r1"}


async def test_the_python_client_asks_the_store(database_url: str) -> None:
    async with open_client(database_url) as client:
        made = await client.worker_release_id(deploy_version="Rel-A")
        assert (made.release_id, made.queue) == ("Rel-A", "runs_rel_a")
        made = await client.worker_release_id("pr-7", "Rel-A")
        assert (made.release_id, made.queue) == ("dev-pr_7", "runs_pr_7")
        made = await client.worker_release_id()
        assert (made.release_id, made.queue) == ("dev", "runs")
        with pytest.raises(InvalidRequestError, match="spelled like a dev lane"):
            await client.worker_release_id(deploy_version="DEV")
        with pytest.raises(InvalidRequestError, match="queue_suffix must be a string"):
            await client.worker_release_id(7)  # type: ignore[arg-type]
        # What it gives is what a submit on that lane is stamped with.
        run = await client.submit("greet", queue_suffix="pr-7")
        assert (run.release_id, run.queue) == ("dev-pr_7", "runs_pr_7")
