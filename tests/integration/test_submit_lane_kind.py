"""A submit never puts a run on a lane of the other kind (store migration 0045).

Release ``foo`` and a worktree with suffix ``foo`` (release id ``dev-foo``) name one
queue, ``runs_foo``. Boot refuses the second kind of worker there; a submit stamped
with the other kind is refused too (22023, nothing written), through the SQL API's
``submit_run`` and ``submit_runs`` and the Python client. A lane no worker registered,
or one older builds mixed, is left as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, env_of, open_client
from worker.db.store import Store
from worker.errors import InvalidRequestError

if TYPE_CHECKING:
    Conn = asyncpg.Connection[asyncpg.Record]

STORE = Store(SCHEMA)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[Conn]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def runs_on(conn: Conn, queue: str) -> int:
    count: int = await conn.fetchval(f"select count(*) from {SCHEMA}.runs where queue = $1", queue)
    return count


async def submit(conn: Conn, release_id: str) -> object:
    return await conn.fetchval(
        f"select {SCHEMA}.submit_run('greet', '{{}}'::jsonb, $1)", release_id
    )


@pytest.mark.parametrize(
    ("registered", "stamped", "queue", "says"),
    [
        ("foo", "dev-foo", "runs_foo",
         "is a worktree's (dev) lane, but its queue runs_foo is release 'foo''s lane"),
        ("dev-foo", "foo", "runs_foo", "names queue runs_foo, which is worktree lane 'dev-foo''s"),
        ("rel-d", "dev-rel_d", "runs_rel_d", "DEEPLINE_ABSURD_QUEUE_SUFFIX"),
    ],
)  # fmt: skip
async def test_a_submit_of_the_other_kind_is_refused_and_writes_nothing(
    conn: Conn, registered: str, stamped: str, queue: str, says: str
) -> None:
    assert await STORE.lanes.register(conn, queue=queue, release_id=registered) == "claiming"
    with pytest.raises(asyncpg.InvalidParameterValueError, match="its runs would run on"):
        await submit(conn, stamped)
    with pytest.raises(asyncpg.InvalidParameterValueError) as refused:
        await conn.fetchval(
            f"select {SCHEMA}.submit_runs($1::jsonb)",
            [{"play": "greet", "releaseId": registered}, {"play": "greet", "releaseId": stamped}],
        )  # fmt: skip
    assert str(refused.value).startswith("item 1: "), str(refused.value)
    assert says in str(refused.value)
    assert await runs_on(conn, queue) == 0  # all or none: the good item is not written
    made = await submit(conn, registered)  # its own kind goes on as before
    assert made is not None
    assert await runs_on(conn, queue) == 1


async def test_an_unregistered_or_mixed_lane_takes_either_kind(conn: Conn) -> None:
    """No worker registered `runs_bar` yet: a worktree's app may submit first. A lane
    older builds mixed is left as it was (0035 keeps it apart from adoption)."""
    assert await submit(conn, "dev-bar") is not None
    await conn.execute(
        f"insert into {SCHEMA}.releases (queue, status, release_ids)"
        " values ('runs_baz', 'claiming', array['baz', 'dev-baz'])"
    )
    assert await submit(conn, "baz") is not None
    assert await submit(conn, "dev-baz") is not None


async def test_the_python_client_says_it_in_one_sentence(database_url: str, conn: Conn) -> None:
    await STORE.lanes.register(conn, queue="runs_foo", release_id="foo")
    async with open_client(database_url, env_of("foo")) as client:
        with pytest.raises(InvalidRequestError, match="give the worktree another"):
            await client.submit("greet", {}, queue_suffix="foo")
    assert await runs_on(conn, "runs_foo") == 0
