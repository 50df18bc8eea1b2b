"""The engine client against a real Postgres: schema install, claims and the continuation fence."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import absurdctl
import asyncpg
import pytest

from support.runtime import connect
from worker.db import engine, engine_schema
from worker.db.pool import Connection
from worker.db.store import Store
from worker.errors import EngineSchemaError, RunNotRunningError

QUEUE = "runs_engine_test"
RETRY = {"kind": "fixed", "base_seconds": 1}
OWN = "w1"
CONT = f"w2:{QUEUE}:continuations"
SCHEMA = "runtime_scheduler"
CONT_OWN_QUEUE = "runs_engine_test_newer"  # the lane of the release CONT works for


@pytest.fixture
async def eng(database_url: str) -> asyncpg.Connection[asyncpg.Record]:
    """A connection to a fresh database with the engine installed and a test queue."""
    conn = await connect(database_url)
    await engine_schema.ensure_engine_schema(conn)
    await Store(SCHEMA).migrate(conn)  # the continuation claim reads the store's adopters
    await engine.ensure_queue(conn, QUEUE, record=None)
    # QUEUE's lane is retired and older than the continuation worker's own lane.
    await conn.execute(
        f"insert into {SCHEMA}.releases (queue, status, created_at)"
        " values ($1, 'retired', now() - interval '1 hour'), ($2, 'claiming', now())",
        QUEUE,
        CONT_OWN_QUEUE,
    )
    yield conn  # type: ignore[misc]
    await conn.close()


async def adopt_claim(conn: Connection, *, qty: int, with_lanes: bool = False) -> engine.ClaimBatch:
    """Claim from QUEUE as the continuation loop of a newer, claiming lane whose app has play p."""
    return await engine.claim(
        conn,
        QUEUE,
        CONT,
        lease_s=30,
        qty=qty,
        mode=engine.CLAIM_ADOPT,
        store_schema=SCHEMA,
        own_queue=CONT_OWN_QUEUE,
        plays=["p"],
        with_lanes=with_lanes,
    )


@dataclass(frozen=True)
class Spawned:
    task_id: uuid.UUID
    run_id: uuid.UUID


async def spawn(conn: Connection, name: str = "play-run") -> Spawned:
    """Spawn one task on the test queue, straight through the engine (as an app may)."""
    options = {"max_attempts": 3, "retry_strategy": RETRY}
    row = await conn.fetchrow(
        "select task_id, run_id, attempt, created from absurd.spawn_task($1, $2, $3, $4)",
        QUEUE, name, {"n": 1}, options,
    )  # fmt: skip
    assert row is not None
    return Spawned(row["task_id"], row["run_id"])


async def run_state(conn: Connection, run_id: uuid.UUID) -> str:
    """Return an engine run's state."""
    state: str = await conn.fetchval(
        f"select state from absurd.r_{QUEUE} where run_id = $1", run_id
    )
    return state


async def test_concurrent_install_from_ten_connections_installs_once(
    empty_database_url: str,
) -> None:
    """Ten workers booting at once: exactly one installs, the rest find it current."""
    conns = [await connect(empty_database_url) for _ in range(10)]
    try:
        outcomes = await asyncio.gather(*(engine_schema.ensure_engine_schema(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
    installed = f"installed {engine_schema.ENGINE_SCHEMA_VERSION}"
    assert sorted(outcomes) == ["current"] * 9 + [installed]
    check = await connect(empty_database_url)
    try:
        assert await check.fetchval("select absurd.get_schema_version()") == "0.5.1"
    finally:
        await check.close()


async def test_install_is_idempotent(eng: asyncpg.Connection[asyncpg.Record]) -> None:
    """A second install changes nothing and reports the schema current."""
    assert await engine_schema.ensure_engine_schema(eng) == "current"
    await engine.ensure_queue(eng, QUEUE, record=None)
    policy = await eng.fetchrow(
        "select cleanup_ttl, cleanup_limit from absurd.get_queue_policy($1)", QUEUE
    )
    assert policy is not None
    assert policy["cleanup_ttl"] == timedelta(hours=6)
    assert policy["cleanup_limit"] == 1000


async def test_newer_engine_schema_is_refused(eng: asyncpg.Connection[asyncpg.Record]) -> None:
    """A database holding a newer engine schema than this build knows is refused clearly."""
    await eng.execute(
        "create or replace function absurd.get_schema_version() returns text "
        "language sql as $$ select '9.0.0'::text $$"
    )
    with pytest.raises(EngineSchemaError) as caught:
        await engine_schema.ensure_engine_schema(eng)
    assert caught.value.found == "9.0.0"
    assert "9.0.0" in str(caught.value)
    assert "0.5.1" in str(caught.value)


async def test_older_engine_schema_is_upgraded(empty_database_url: str) -> None:
    """An engine schema one release older is upgraded through absurdctl's bundled migration."""
    conn = await connect(empty_database_url)
    try:
        await conn.execute(absurdctl.BUNDLED_SCHEMA_SQL)
        # Pretend the 0.5.1 step has not run: its migration is idempotent.
        await conn.execute(
            "create or replace function absurd.get_schema_version() returns text "
            "language sql as $$ select '0.5.0'::text $$"
        )
        assert await engine_schema.ensure_engine_schema(conn) == "upgraded 0.5.0 -> 0.5.1"
        assert await conn.fetchval("select absurd.get_schema_version()") == "0.5.1"
    finally:
        await conn.close()


async def test_own_claim_hands_out_fresh_work(eng: asyncpg.Connection[asyncpg.Record]) -> None:
    """A normal worker id claims a fresh submit through absurd.claim_task."""
    spawned = await spawn(eng)
    batch = await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=5)
    assert [r.run_id for r in batch.runs] == [spawned.run_id]
    assert batch.runs[0].params == {"n": 1}
    assert await run_state(eng, batch.runs[0].run_id) == "running"


async def test_continuation_fence_never_hands_out_fresh_or_pending_retry(
    eng: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Fresh submits and immediate (pending) retries are invisible to a continuation loop."""
    await spawn(eng)  # stays a fresh submit
    await spawn(eng)
    claimed = (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=1)).runs
    # Fail with an explicit retry time of now: the retry run is `pending`, no payload.
    await engine.fail(
        eng, QUEUE, claimed[0].run_id, {"message": "boom"}, retry_at=datetime.now(UTC)
    )
    batch = await adopt_claim(eng, qty=10)
    assert batch.runs == ()
    assert batch.swept == 0


async def store_row(
    conn: Connection,
    task_id: uuid.UUID,
    status: str,
    *,
    adopted_queue: str | None = None,
) -> None:
    """Give an engine task the run-state store row the continuation claim reads."""
    await conn.execute(
        f"insert into {SCHEMA}.runs (run_id, play, input, launch, release_id, queue, task_id,"
        " status, max_attempts, adopted_queue, adopted_release_id)"
        " values ($1, 'p', '{}', '{}', 'rel', $2, $3, $4, 5, $5, $5)",
        uuid.uuid4(),
        QUEUE,
        task_id,
        status,
        adopted_queue,
    )


async def test_continuation_fence_hands_out_woken_sleeper_and_event_woken_run(
    eng: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A due sleeper and an event-woken run, parked in the store, are handed out."""
    sleeper = await spawn(eng, "sleeper")
    waiter = await spawn(eng, "waiter")
    for task in (sleeper, waiter):
        await store_row(eng, task.task_id, "waiting")
    runs = {r.task_name: r for r in (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=2)).runs}
    await engine.schedule(eng, QUEUE, runs["sleeper"].run_id, datetime.now(UTC))
    suspended, _, _ = await engine.await_event(
        eng, QUEUE, waiter.task_id, runs["waiter"].run_id, "wait:approval", "evt:x:approval", None
    )
    assert suspended
    await eng.execute("select absurd.emit_event($1, $2, $3)", QUEUE, "evt:x:approval", {"ok": True})

    batch = await adopt_claim(eng, qty=10)
    got = {r.task_id: r for r in batch.runs}
    assert set(got) == {sleeper.task_id, waiter.task_id}
    assert got[waiter.task_id].event_payload == {"ok": True}
    assert got[sleeper.task_id].attempt == 1


async def test_a_queue_holding_only_an_open_event_wait_has_no_due_time(
    eng: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A wait without a timeout is due at 'infinity': no due time, and no error.

    PostgreSQL before 17 cannot subtract an infinite timestamp: the next-due read
    of every loop failed, and logged a warning each poll, on a queue whose only
    open run waited for a webhook.
    """
    waiter = await spawn(eng, "waiter")
    await store_row(eng, waiter.task_id, "waiting")
    (run,) = (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=1)).runs
    suspended, _, _ = await engine.await_event(
        eng, QUEUE, waiter.task_id, run.run_id, "wait:hook", "evt:x:hook", None
    )
    assert suspended
    assert await eng.fetchval(
        f"select available_at = 'infinity' from absurd.r_{QUEUE} where run_id = $1", run.run_id
    )
    assert await engine.next_due_in_s(eng, QUEUE) is None
    for mode, own_queue in (("all", QUEUE), ("own", QUEUE), ("adopt", CONT_OWN_QUEUE)):
        due = await engine.next_due_in_s(
            eng, QUEUE, mode=mode, store_schema=SCHEMA, own_queue=own_queue, plays=["waiter"]
        )
        assert due is None, mode


async def test_continuation_fence_hands_out_only_runs_it_may_adopt_or_own(
    eng: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Due sleepers: parked ones and its own adopted ones, not retries or another's adoptees."""
    other = "runs_engine_test_other"
    await eng.execute(  # an adopter lane older than the claimer's: adoptable from, once retired
        f"insert into {SCHEMA}.releases (queue, status, created_at)"
        " values ($1, 'claiming', now() - interval '30 minutes')",
        other,
    )
    cases = {
        "parked": ("waiting", None),
        "retrying": ("retrying", None),  # only the retired lane's own workers may run it
        "handed-back": ("queued", None),
        "mine-retrying": ("retrying", CONT_OWN_QUEUE),  # adopted by the claimer: its own work
        "other-parked": ("waiting", other),  # adopted by another claiming lane
    }
    tasks = {}
    for name, (status, adopter) in cases.items():
        tasks[name] = await spawn(eng, name)
        await store_row(eng, tasks[name].task_id, status, adopted_queue=adopter)
    for run in (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=10)).runs:
        await engine.schedule(eng, QUEUE, run.run_id, datetime.now(UTC))

    async def claimed_names() -> set[str]:
        batch = await adopt_claim(eng, qty=10)
        return {r.task_name for r in batch.runs}

    due_in = await eng.fetchval(
        "select lane_worker.next_due_in_v1($1, $2, $3, 'adopt', '{p}')",
        QUEUE,
        SCHEMA,
        CONT_OWN_QUEUE,
    )
    assert due_in is not None
    assert due_in <= 0
    assert await claimed_names() == {"parked", "mine-retrying"}
    # The other adopter's lane is retired: its parked run is adoptable again.
    await eng.execute(f"update {SCHEMA}.releases set status = 'retired' where queue = $1", other)
    for name in ("parked", "mine-retrying"):
        run_id = await eng.fetchval(
            f"select run_id from absurd.r_{QUEUE} where task_id = $1", tasks[name].task_id
        )
        await engine.schedule(eng, QUEUE, run_id, datetime.now(UTC) + timedelta(hours=1))
    assert await claimed_names() == {"other-parked"}


async def test_continuation_claim_refuses_other_worker_ids(
    eng: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The continuation claim function serves only worker ids ending in :continuations."""
    with pytest.raises(asyncpg.PostgresError, match="continuations"):
        await eng.fetch(
            "select * from lane_worker.claim_lane_v1($1, 'w1', 30, 1, $2, $3, 'adopt', '{}')",
            QUEUE,
            SCHEMA,
            CONT_OWN_QUEUE,
        )


@pytest.mark.parametrize("with_lanes", [False, True], ids=["claim_lane", "claim_with_lanes"])
async def test_continuation_claim_sweeps_expired_leases(
    eng: asyncpg.Connection[asyncpg.Record], with_lanes: bool
) -> None:
    """A lease that expired on a queue only continuation loops poll is failed and retried.

    Also through ``claim_with_lanes``: a sweep that hands out nothing still reaches the caller.
    """
    spawned = await spawn(eng)
    await store_row(eng, spawned.task_id, "running")
    claimed = (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=1)).runs[0]
    await eng.execute(
        f"update absurd.r_{QUEUE} set claim_expires_at = now() - interval '1 second' "
        "where run_id = $1",
        claimed.run_id,
    )
    batch = await adopt_claim(eng, qty=5, with_lanes=with_lanes)
    assert batch.swept == 1
    assert batch.runs == ()  # the retry sleeps for its backoff first
    assert await run_state(eng, claimed.run_id) == "failed"
    retry = await eng.fetchrow(
        f"select state, attempt from absurd.r_{QUEUE} where task_id = $1 and attempt = 2",
        spawned.task_id,
    )
    assert retry is not None
    assert retry["state"] == "sleeping"
    with pytest.raises(RunNotRunningError):
        await engine.complete(eng, QUEUE, claimed.run_id, {"late": True})


async def test_a_claim_with_lanes_hands_out_what_the_plain_claim_does(
    eng: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The same runs, in the same states, each with its store facts."""
    spawned = {(await spawn(eng, f"play-{n}")).task_id for n in range(3)}
    for task_id in spawned:
        await store_row(eng, task_id, "queued")
    plain = await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=2)
    with_lanes = await engine.claim(
        eng, QUEUE, OWN, lease_s=30, qty=5, store_schema=SCHEMA, with_lanes=True
    )
    assert len(plain.runs) == 2
    assert len(with_lanes.runs) == 1
    assert {r.task_id for r in plain.runs + with_lanes.runs} == spawned
    [run] = with_lanes.runs
    assert run.lane is not None
    assert run.lane.play == "p"
    assert (run.queue, run.attempt, run.max_attempts, run.params) == (QUEUE, 1, 3, {"n": 1})
    assert run.task_name.startswith("play-")
    assert run.wake_event is None
    assert await run_state(eng, run.run_id) == "running"
    assert with_lanes.swept == 0
    with pytest.raises(ValueError, match="store's schema"):
        await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=1, with_lanes=True)


@pytest.mark.parametrize(
    ("mode", "own_queue", "store_status"),
    [(None, QUEUE, "queued"), (engine.CLAIM_ADOPT, CONT_OWN_QUEUE, "waiting")],
    ids=["own loop", "continuation loop"],
)
async def test_a_claim_that_falls_short_reads_the_next_due_time_in_its_round_trip(
    eng: asyncpg.Connection[asyncpg.Record], mode: str | None, own_queue: str, store_status: str
) -> None:
    """Its loop then waits without a next-due read of its own (one statement per poll).

    A full batch reads none: the loop claims again at once anyway.
    """
    worker = OWN if mode is None else CONT
    sleeper = await spawn(eng, "sleeper")
    await store_row(eng, sleeper.task_id, store_status)
    (run,) = (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=1)).runs
    # Due in an hour: far from the lease (30 s) and from "now", however long the
    # machine takes between this line and the claim.
    await engine.schedule(eng, QUEUE, run.run_id, datetime.now(UTC) + timedelta(seconds=3600))

    async def claim(qty: int) -> engine.ClaimBatch:
        return await engine.claim(
            eng, QUEUE, worker, lease_s=30, qty=qty, mode=mode, store_schema=SCHEMA,
            own_queue=own_queue, plays=["p"], with_lanes=mode is None,
        )  # fmt: skip

    batch = await claim(4)
    assert batch.runs == ()
    assert batch.due_known
    assert batch.due_in_s is not None
    assert 3000 < batch.due_in_s <= 3600
    separately = await engine.next_due_in_s(
        eng, QUEUE, mode=mode, store_schema=SCHEMA, own_queue=own_queue, plays=["p"]
    )
    assert separately is not None
    assert 3000 < separately <= batch.due_in_s

    due_now = f"update absurd.r_{QUEUE} set available_at = now() where run_id = $1"
    await eng.execute(due_now, run.run_id)
    assert (await claim(1)).due_known is False  # a full batch of one
    # Claimed and running: what is due next is the end of its 30 s lease.
    await eng.execute(
        f"update absurd.r_{QUEUE} set state = 'sleeping', available_at = now()"
        " where run_id = $1", run.run_id,
    )  # fmt: skip
    batch = await claim(4)
    assert len(batch.runs) == 1
    assert batch.due_known
    assert batch.due_in_s is not None
    # Not the hour-away run, nor the one just claimed (due now: 0 or less).
    assert 0 < batch.due_in_s <= 30


async def test_a_lease_extension_waits_for_a_locked_row_only_briefly(
    eng: asyncpg.Connection[asyncpg.Record], database_url: str
) -> None:
    """An operator's open transaction holds the run's row: the extension gives up, not the pool."""
    await spawn(eng, "held")
    (run,) = (await engine.claim(eng, QUEUE, OWN, lease_s=30, qty=1)).runs
    other = await connect(database_url)
    try:
        async with other.transaction():
            await other.execute(
                f"select 1 from absurd.r_{QUEUE} where run_id = $1 for update", run.run_id
            )
            started = time.monotonic()
            with pytest.raises(asyncpg.LockNotAvailableError):
                await engine.extend_claim(eng, QUEUE, run.run_id, 30)
            # It waits 100 ms (EXTEND_LOCK_WAIT_MS); a generous bound, as the defects
            # are far off: no lock timeout never ends (the lock is held), 100 taken as
            # seconds 100 s.
            assert time.monotonic() - started < 60
        await engine.extend_claim(eng, QUEUE, run.run_id, 60)  # the lock is gone
    finally:
        await other.close()
    left = await eng.fetchval(
        f"select extract(epoch from claim_expires_at - now()) from absurd.r_{QUEUE}"
        " where run_id = $1",
        run.run_id,
    )
    assert 50 < left <= 60
