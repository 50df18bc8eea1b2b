"""claim_next_v2 (begins its own attempts as one set) held to claim_next_v1 (one per run).

One history on a real database: fresh runs, a run whose facts go to a runtime
API (its `run.started` fact), a play this app lacks, a run stamped with another
spelling of the lane's release, a run adopted by another lane, a retry of a run
taken over before (engine checkpoints, an older attempt left open), a run whose
store row another session holds locked, and a task without a store row (not
lane-worker's: never handed out). The
same claim is made with each version in one transaction, rolled back after
each, on the engine's clock held still: both must hand out the same runs with
the same facts, begin the same ones, and leave the same rows. The loops' static
statements are held to claim_next_v2 over the same history: the own loop's
(own_claim.sql), and a continuation loop's (adopt_claim.sql, with two runs of
the history parked and woken and their lane retired).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, eventually, one_step_app, open_client, open_runtime
from worker.db.sql import query
from worker.run.execute import Runtime

RELEASE = "rel-cs"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_cs"
NOW = "2030-01-01T00:00:00Z"
WORKER = "claim-sets-worker"

Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record]"


async def claim(conn: Conn, version: int | str) -> list[dict[str, Any]]:
    """The own loop's claim: claim_next_v<version>, or the static own_claim statement."""
    if version == "static":
        text = query("engine", "own_claim.sql", "own_claim", schema=SCHEMA, queue=QUEUE)
        rows = await conn.fetch(text, QUEUE, WORKER, 30, 16, ["one"], RELEASE, WORKER, 2)
        assert not any(r["retired"] for r in rows)
        return [{k: v for k, v in r.items() if k != "retired"} for r in rows]
    rows = await conn.fetch(
        f"select * from lane_worker.claim_next_v{version}($1, $2, 30, 16, $3, $1, null,"
        " array['one'], true, $4, $2, 2::smallint)",
        QUEUE, WORKER, SCHEMA, RELEASE,
    )  # fmt: skip
    return [dict(r) for r in rows]


async def written(conn: Conn) -> list[list[dict[str, Any]]]:
    parts = [
        f'select run_id, state, claimed_by, claim_expires_at, started_at from absurd."r_{QUEUE}"'
        " order by 1",
        "select task_id, state, attempts, first_started_at, last_attempt_run"
        f' from absurd."t_{QUEUE}" order by 1',
        f"select run_id, status, current_wait, attempts, step_keys, adopted_release_id,"
        f" adopted_queue, defer_count, updated_at from {SCHEMA}.runs order by 1",
        f"select run_id, engine_run_id, attempt, worker_id, release_id, disposition, outcome,"
        f" error from {SCHEMA}.attempts order by run_id, engine_run_id, attempt",
        f"select run_id, type, fact from {SCHEMA}.ledger order by run_id, type",
    ]
    return [[dict(x) for x in await conn.fetch(p)] for p in parts]


def comparable(rows: list[dict[str, Any]], ids: dict[int, int]) -> list[dict[str, Any]]:
    """The claim's rows with attempt ids by rank (the identity moves on between the two)."""
    out = []
    for row in rows:
        row = dict(row)
        row.pop("begun_db_now_ms")  # v2 reads the clock as the claim starts
        if row["begun_attempt_id"] is not None:
            row["begun_attempt_id"] = ids[row["begun_attempt_id"]]
        out.append(row)
    return out


def ranks(rows: list[dict[str, Any]]) -> dict[int, int]:
    begun = sorted(r["begun_attempt_id"] for r in rows if r["begun_attempt_id"] is not None)
    return {a: i for i, a in enumerate(begun)}


@contextlib.asynccontextmanager
async def history(url: str) -> AsyncIterator[tuple[Runtime, Conn]]:
    async with (
        open_client(url, ENV) as client,
        open_client(url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-other"}) as other,
        open_runtime(url, one_step_app(), RELEASE) as rt,
    ):
        conn = await connect(url)
        try:
            # A retry of a run taken over before: claimed and begun, a checkpoint
            # written, then its engine run failed with a retry due now.
            retried = await client.submit("one", {"n": "retried"})

            async def first() -> Any:
                return (await rt.claim(QUEUE, 1)).runs or None

            (taken,) = await eventually(first, what="the first claim")
            await conn.execute(
                "select absurd.set_task_checkpoint_state($1, $2, 's', '1', $3)",
                QUEUE, taken.task_id, taken.run_id,
            )  # fmt: skip
            await conn.execute(
                "select absurd.fail_run($1, $2, '{}'::jsonb, now() - interval '1 second')",
                QUEUE, taken.run_id,
            )  # fmt: skip
            assert retried.run_id
            for i in range(3):
                await client.submit("one", {"n": i})
            await client.submit(
                "one", {"n": "api"},
                runtime_api={"baseUrl": "http://127.0.0.1:9/api", "executorToken": "t" * 20},
            )  # fmt: skip
            await client.submit("two", {"n": "not this app's"})
            spelled = await client.submit("one", {"n": "spelled"})
            await conn.execute(
                f"update {SCHEMA}.runs set release_id = 'REL_CS' where run_id = $1",
                uuid.UUID(str(spelled.run_id)),
            )
            adopted = await client.submit("one", {"n": "adopted"})
            await conn.execute(
                f"update {SCHEMA}.runs set adopted_release_id = 'rel-other',"
                " adopted_queue = 'runs_rel_other' where run_id = $1",
                uuid.UUID(str(adopted.run_id)),
            )
            await other.submit("one", {"n": "elsewhere"})  # another queue: not claimed here
            await conn.execute("select absurd.spawn_task($1, 'no-store-row', '{}'::jsonb)", QUEUE)
            yield rt, conn
        finally:
            await conn.close()


async def both_claims(
    url: str, versions: tuple[int | str, int | str]
) -> list[tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]]:
    """Each claim over the history, in a savepoint rolled back after: (rows, rows written)."""
    async with history(url) as (_, conn):
        locked = await connect(url)
        try:
            lock = locked.transaction()
            await lock.start()
            await locked.execute(f"select 1 from {SCHEMA}.runs where input->>'n' = '0' for update")
            results = []
            outer = conn.transaction()
            await outer.start()
            try:
                await conn.execute(f"set local absurd.fake_now = '{NOW}'")
                for version in versions:
                    tx = conn.transaction()
                    await tx.start()
                    try:
                        rows = await claim(conn, version)
                        results.append((rows, await written(conn)))
                    finally:
                        await tx.rollback()
            finally:
                await outer.rollback()
            await lock.rollback()
        finally:
            await locked.close()
    return results


async def test_claim_v2_hands_out_and_begins_what_v1_does(database_url: str) -> None:
    """The same claim, v1 and v2: the same runs, facts, begun attempts and rows written."""
    (rows1, written1), (rows2, written2) = await both_claims(database_url, (1, 2))
    claimed = [r for r in rows1 if r["run_id"] is not None]
    # every run of the queue; not the task without a store row (another system's)
    assert len(claimed) == 8
    begun = [r for r in claimed if r["begun_attempt_id"] is not None]
    # fresh 1 and 2, the API run, the spelled one, the retry (not the locked, the
    # other play, the adopted one or the task without a store row)
    assert len(begun) == 5
    assert any(r["begun_engine_checkpoints"] == {"s": 1} for r in begun)
    assert comparable(rows2, ranks(rows2)) == comparable(rows1, ranks(rows1))
    assert written2 == written1


async def test_the_static_own_claim_hands_out_and_begins_what_v2_does(database_url: str) -> None:
    """The own loop's static statement and claim_next_v2: the same runs, facts, begins and rows."""
    (rows2, written2), (rows3, written3) = await both_claims(database_url, (2, "static"))
    assert sum(r["begun_attempt_id"] is not None for r in rows3) == 5
    assert comparable(rows3, ranks(rows3)) == comparable(rows2, ranks(rows2))
    assert written3 == written2


OTHER_QUEUE = "runs_rel_other"  # the newer lane whose continuation loop claims QUEUE
CONTINUATION = f"claim-sets-worker:{QUEUE}:continuations"


async def continuation_claim(conn: Conn, static: bool, mode: str) -> list[dict[str, Any]]:
    """rel-other's continuation loop on QUEUE: adopt_claim.sql, or claim_next_v2 (its columns)."""
    if static:
        text = query("engine", "adopt_claim.sql", "adopt_claim", schema=SCHEMA, queue=QUEUE)
        rows = await conn.fetch(text, QUEUE, CONTINUATION, 30, 16, OTHER_QUEUE, ["one"], mode)
        return [dict(r) for r in rows]
    rows = await conn.fetch(
        "select * from lane_worker.claim_next_v2($1, $2, 30, 16, $3, $4, $5, array['one'],"
        " false, null, null, null)",
        QUEUE, CONTINUATION, SCHEMA, OTHER_QUEUE, mode,
    )  # fmt: skip
    shared = ("run_id", "task_id", "attempt", "task_name", "params", "max_attempts",
              "wake_event", "event_payload", "swept", "due_known", "due_in_s")  # fmt: skip
    # no store facts, no begun attempts on a continuation loop
    assert all(v is None for r in rows for k, v in r.items() if k not in shared)
    return [{k: r[k] for k in shared} for r in rows]


@pytest.mark.parametrize(("mode", "claimer"), [("adopt", "claiming"), ("drain", "retired")])
async def test_the_static_continuation_claim_hands_out_what_v2_does(
    database_url: str, mode: str, claimer: str
) -> None:
    """rel-cs retired; rel-other's continuation loop claims its queue both ways: same rows written.

    Two runs of the history parked and woken (a sleep, an event), the first
    adopted by rel-other; in 'adopt' both are taken, in 'drain' (rel-other
    retired too) its adoptees: the first, and the history's fresh adoptee.
    """
    async with history(database_url) as (_, conn):
        outer = conn.transaction()
        await outer.start()
        try:
            await conn.execute(f"set local absurd.fake_now = '{NOW}'")
            await conn.execute(
                f"insert into {SCHEMA}.releases (queue, status, created_at)"
                " values ($1, 'retired', now() - interval '1 hour'), ($2, $3, now())"
                " on conflict (queue) do update"
                "   set status = excluded.status, created_at = excluded.created_at",
                QUEUE, OTHER_QUEUE, claimer,
            )  # fmt: skip
            # input n=1 slept and n=2 waited for an event that came; n=1 adopted by rel-other
            await conn.execute(
                f"update {SCHEMA}.runs set status = 'waiting',"
                "   current_wait = jsonb_build_object('kind', case input->>'n' when '1'"
                "     then 'sleep' else 'integration_event' end, 'boundaryId', 'b'),"
                "   adopted_release_id = case input->>'n' when '1' then 'rel-other' end,"
                "   adopted_queue = case input->>'n' when '1' then $1 end"
                " where input->>'n' in ('1', '2')",
                OTHER_QUEUE,
            )  # fmt: skip
            await conn.execute(
                f'update absurd."r_{QUEUE}" r set'
                "   state = case s.input->>'n' when '1' then 'sleeping' else 'pending' end,"
                "   event_payload = case s.input->>'n' when '2' then '{\"ok\": 1}'::jsonb end,"
                "   available_at = now() - interval '1 second'"
                f"  from {SCHEMA}.runs s"
                "  where s.task_id = r.task_id and s.input->>'n' in ('1', '2')"
            )
            inputs = f"select run_id::text, input->>'n' as n from {SCHEMA}.runs"
            n_of = {r["run_id"]: r["n"] for r in await conn.fetch(inputs)}
            results = []
            for static in (False, True):
                tx = conn.transaction()
                await tx.start()
                try:
                    rows = await continuation_claim(conn, static, mode)
                    results.append((rows, await written(conn)))
                finally:
                    await tx.rollback()
        finally:
            await outer.rollback()
    (rows2, written2), (rows_static, written_static) = results
    assert rows_static == rows2
    assert written_static == written2
    claimed = [r for r in rows2 if r["run_id"] is not None]
    expected = ["1", "2"] if mode == "adopt" else ["1", "adopted"]
    assert sorted(n_of[r["params"]["runId"]] for r in claimed) == expected
    assert [r["due_known"] for r in rows2 if r["run_id"] is None] == [True]
