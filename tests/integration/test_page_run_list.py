"""The operator page's run list on a store of a million runs: the plan guard.

Every statement the list and its bulk actions run (a page, a later page by
keyset, a bulk count, a bulk action's ids), for every filter alone and the
usual combinations, reaches ``runs`` through an index, never by reading the
whole table; and the pages read back what the store holds.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from support.runtime import open_client
from worker import lanes
from worker.ops import run_list
from worker.ops.run_list import Cursor, RunFilter

A, B = "scale-a", "scale-b"
RUNS = 1_000_000
FILTERS: list[dict[str, str]] = [
    {},
    {"status": "failed"},
    {"status": "open"},
    {"status": "running"},
    {"play": "rare"},
    {"release": B},
    {"release": A},
    {"newer": "1h"},
    {"older": "2d"},
    {"error": "boom"},
    {"status": "failed", "release": B},
    {"status": "failed", "error": "boom", "newer": "3d"},
    {"status": "waiting", "play": "rare", "release": A},
    {"run": str(uuid.UUID(int=7)), "status": "failed"},
]


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield every node of an EXPLAIN (FORMAT JSON) plan."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


def scans_of_runs(explained: Any) -> list[dict[str, Any]]:
    """The nodes of a plan that read the runs table whole."""
    return [
        node
        for node in plan_nodes(explained["Plan"])
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "runs"
    ]


@pytest.mark.timeout(300)
async def test_the_run_list_never_reads_a_million_runs_whole(database_url: str) -> None:
    """1,000,000 runs: no statement of the list scans runs; pages read what was inserted."""
    token = uuid.uuid4().hex[:8]
    schema = f"page_scale_{token}"
    env = {
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": schema,
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": f"pscale_{token}",
    }
    qa, qb = lanes.queue_name_for_release(A), lanes.queue_name_for_release(B)
    conn = await asyncpg.connect(database_url)
    try:
        async with open_client(database_url, env) as client:  # migrates the fresh schema
            await conn.execute(
                f"insert into {schema}.runs (run_id, play, input, launch, release_id, queue,"
                " status, max_attempts, attempts, created_at, updated_at, finished_at, error)"
                " select gen_random_uuid(), 'plain', '{}', '{}', $1, $2,"
                " (array['completed', 'completed', 'completed', 'cancelled'])[1 + i % 4], 5, 1,"
                " now() - make_interval(secs => i), now(), now(), null"
                " from generate_series(1, $3::int) as i",
                A,
                qa,
                RUNS,
            )
            # The few a bad day is about: failed runs of a rare play on B, a day old.
            await conn.execute(
                f"insert into {schema}.runs (run_id, play, input, launch, release_id, queue,"
                " status, max_attempts, attempts, created_at, error)"
                " select gen_random_uuid(), 'rare', '{}', '{}', $1, $2, 'failed', 5, 5,"
                " now() - interval '1 day' - make_interval(secs => i),"
                " jsonb_build_object('name', 'RuntimeError', 'message', 'boom ' || i)"
                " from generate_series(1, 30) as i",
                B,
                qb,
            )
            await conn.execute(f"analyze {schema}.runs")
            with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
                await conn.execute("checkpoint")
            schema_sql = client.store.schema_sql
            as_of = datetime.now(UTC)
            cursor = Cursor(as_of, uuid.UUID(int=0))
            whole: list[str] = []
            for query in FILTERS:
                flt = RunFilter.from_query(query)
                shapes = {
                    "page": run_list.page_sql(flt, None, 50),
                    "later page": run_list.page_sql(flt, cursor, 50),
                    "ids": run_list.ids_sql(flt, as_of),
                }
                for shape, (sql, args) in shapes.items():
                    (explained,) = json.loads(
                        await conn.fetchval(
                            "explain (format json) " + sql.replace("{schema}", schema_sql), *args
                        )
                    )
                    if scans_of_runs(explained):
                        whole.append(f"{shape} of {query}: {json.dumps(explained)[:600]}")
            assert whole == [], "these read the runs table whole:\n" + "\n".join(whole)

            failed = await run_list.read_page(
                conn, schema_sql, RunFilter(status="failed"), None, 20
            )
            assert [r.error_message for r in failed.runs] == [f"boom {i}" for i in range(1, 21)]
            assert failed.next is not None
            rest = await run_list.read_page(
                conn, schema_sql, RunFilter(status="failed"), failed.next, 20
            )
            assert [r.error_message for r in rest.runs] == [f"boom {i}" for i in range(21, 31)]
            assert rest.next is None
            on_b = RunFilter.from_query({"release": B, "play": "rare"})
            assert len(await run_list.matching_ids(conn, schema_sql, on_b, as_of)) == 30
            everything = await run_list.matching_ids(conn, schema_sql, RunFilter(), as_of)
            assert len(everything) == run_list.MAX_BULK + 1  # bounded: "more than 10000"
    finally:
        try:
            await conn.execute(f"drop schema if exists {schema} cascade")
        finally:
            await conn.close()
