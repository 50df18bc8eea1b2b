"""``LaneClient.submit_many``: typed requests, one ``submit_runs`` call, all or none."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, open_client
from worker.client import LaneClient, SubmitRequest, SubmittedRun
from worker.errors import IdempotencyConflict, InvalidRequestError

ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-a", "LANE_WORKER_MAX_ATTEMPTS": "4"}
API = {"baseUrl": "https://app.example/api", "executorToken": "tok-3b1"}


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[LaneClient]:
    async with open_client(database_url, ENV) as made:
        yield made


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def stored(conn: asyncpg.Connection[asyncpg.Record]) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        f"select run_id, play, input, release_id, queue, idempotency_key, max_attempts,"
        f" task_id is not null as spawned from {SCHEMA}.runs order by created_at, run_id"
    )
    return [tuple(r) for r in rows]


async def test_each_request_is_made_on_its_lane_and_answered_in_order(
    client: LaneClient, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    made = await client.submit_many([
        SubmitRequest("greet", {"n": 1}),
        SubmitRequest("greet", idempotency_key="k-1", queue_suffix="pr-7", runtime_api=API),
    ])  # fmt: skip
    assert [type(m) for m in made] == [SubmittedRun, SubmittedRun]
    assert [(m.release_id, m.queue, m.created) for m in made] == [
        ("rel-a", "runs_rel_a", True),
        ("dev-pr_7", "runs_pr_7", True),
    ]
    rows = {str(r[0]): r for r in await stored(conn)}
    assert rows[made[0].run_id][1:] == ("greet", {"n": 1}, "rel-a", "runs_rel_a", None, 4, True)
    assert rows[made[1].run_id][1:] == ("greet", {}, "dev-pr_7", "runs_pr_7", "k-1", 4, True)
    api = await conn.fetchval(
        f"select api from {SCHEMA}.run_runtime_api where run_id = $1", uuid.UUID(made[1].run_id)
    )
    assert api == API
    # A repeat of a key answers its run; a later request with an earlier one's key, too.
    again = await client.submit_many([
        SubmitRequest("greet", {"n": 2}, idempotency_key="k-2"),
        SubmitRequest("greet", idempotency_key="k-1", queue_suffix="pr-7"),
        SubmitRequest("greet", {"n": 2}, idempotency_key="k-2"),
    ])  # fmt: skip
    # No worker serves these lanes (migration 0029: test_lane_served.py).
    unserved = {"served": False, "warning": again[1].warning}
    assert again[1] == SubmittedRun(
        made[1].run_id, "dev-pr_7", "runs_pr_7", created=False, **unserved
    )
    unserved = {"served": False, "warning": again[2].warning}
    assert again[2] == SubmittedRun(
        again[0].run_id, "rel-a", "runs_rel_a", created=False, **unserved
    )
    assert again[0].created
    assert len(await stored(conn)) == 3


async def test_no_requests_submit_nothing(
    client: LaneClient, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    assert await client.submit_many([]) == []
    assert await client.submit_many(iter(())) == []
    assert await stored(conn) == []


BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("list-input", SubmitRequest("p", [1]), InvalidRequestError, "item 1: a run's input must"),
    ("blank-play", SubmitRequest(" "), InvalidRequestError, "item 1: submit needs a play name"),
    ("long-key", SubmitRequest("p", idempotency_key="k" * 256), InvalidRequestError,
     "item 1: an idempotency key 'kkk"),
    ("no-lane", SubmitRequest("p", queue_suffix="--"), InvalidRequestError,
     "item 1: queue_suffix='--' has no letter"),
    ("not-a-request", {"play": "p"}, InvalidRequestError,
     "item 1: submit_many takes SubmitRequest objects, not dict"),
    # Checked by the store (submit_runs), named by its index all the same.
    ("api-ftp", SubmitRequest("p", runtime_api={**API, "baseUrl": "ftp://h"}),
     InvalidRequestError, "item 1: the runtime API context's baseUrl must be"),
    ("key-conflict", SubmitRequest("other", idempotency_key="taken"), IdempotencyConflict,
     "item 1: idempotency key 'taken' already names run "),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_", "error", "says"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
async def test_a_bad_request_refuses_them_all_naming_its_index(
    client: LaneClient,
    conn: asyncpg.Connection[asyncpg.Record],
    request_: Any,
    error: type[Exception],
    says: str,
) -> None:
    taken = await client.submit("greet", idempotency_key="taken")
    before = await stored(conn)
    with pytest.raises(error) as caught:
        await client.submit_many([SubmitRequest("greet", {"n": 1}), request_])
    assert str(caught.value).startswith(says)
    if isinstance(caught.value, IdempotencyConflict):
        assert caught.value.run_id == taken.run_id
    assert await stored(conn) == before
