"""Claims on the engine's queues: ``claim`` and when a queue's next run is due.

The engine's own claim, ``lane_worker.claim_lane_v1``'s modes (through
``claim_next``) and the loops' static statements (the own loop's
``own_claim.sql``, a continuation loop's ``adopt_claim.sql``); the
runs come with their store facts and begun attempts when asked. ``engine.py``
re-exports every name here: callers say ``engine.claim``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from worker.db.pool import Connection
from worker.db.sql import engine_query, query
from worker.db.store.rows import Begun, ClaimedRunState, args_of, row_of

R = TypeVar("R")


@dataclass(frozen=True)
class ClaimedRun:
    """One engine run handed to this worker, with its lease."""

    queue: str
    run_id: uuid.UUID
    task_id: uuid.UUID
    attempt: int
    task_name: str
    params: Any
    max_attempts: int | None
    wake_event: str | None
    event_payload: Any
    # The store's facts read with the claim (``claim_with_lanes``); None when the
    # claim did not read them or the task has no store row.
    lane: ClaimedRunState | None = None
    # The attempt the claim began as 'own' (``BeginOwn``), and the monotonic time
    # its statement was sent (the attempt's clock starts from it); None: not begun.
    begun: Begun | None = None
    sent_s: float = 0.0


async def _fetch_planned_once(
    conn: Connection, sql: str, args: Sequence[Any]
) -> list[asyncpg.Record]:
    """Run a static claim on the generic plan its prepared statement keeps.

    Left to choose, PostgreSQL planned the claim again on every call (its custom plans
    looked cheaper than the generic one): about 5 ms of planning a claim under a steady
    load, against 1.8 ms to execute the generic plan, itself faster than the custom
    ones (pg_stat_statements, bench/steady.py, 2026-12-07). SET LOCAL keeps the choice to
    this statement: the worker's other statements keep PostgreSQL's own.
    """
    async with conn.transaction():
        await conn.execute("set local plan_cache_mode = force_generic_plan")
        return await conn.fetch(sql, *args)


@dataclass(frozen=True)
class BeginOwn:
    """Who a claim begins certain own attempts for: the claimer's release, worker id, step keys."""

    release_id: str
    worker_id: str
    step_keys: int


def _prefixed(cls: type[R], r: asyncpg.Record, prefix: str, key: str) -> R | None:
    # claim_with_lanes names each column of a store row <prefix><column>; a null
    # ``key`` column means no such row.
    if r[prefix + key] is None:
        return None
    return row_of(cls, r, prefix)


@dataclass(frozen=True)
class ClaimBatch:
    """What a claim call returned: the runs, and how many expired leases it swept."""

    runs: tuple[ClaimedRun, ...]
    swept: int
    # When the claim fell short of its quantity it also read the next due time
    # (``due_known``): seconds until the next run this claim could hand out
    # (negative: already due; None: none), as ``next_due_in_s`` would return.
    due_known: bool = False
    due_in_s: float | None = None


@dataclass(frozen=True, slots=True)
class _OwnClaim:
    """``own_claim.sql``'s parameters, in its order ($1 ... $8)."""

    queue: str  # the claimer's own
    worker_id: str
    lease_s: int
    qty: int
    plays: list[str]
    begin_release_id: str
    begin_worker_id: str
    step_keys: int


@dataclass(frozen=True, slots=True)
class _AdoptClaim:
    """``adopt_claim.sql``'s parameters, in its order ($1 ... $7)."""

    queue: str  # another lane's
    worker_id: str  # ending in :continuations
    lease_s: int
    qty: int
    own_queue: str  # the claimer's
    plays: list[str]
    mode: str  # CLAIM_ADOPT or CLAIM_DRAIN, as asked


@dataclass(frozen=True, slots=True)
class _ClaimNext:
    """``lane_worker.claim_next_v2``'s parameters, in its order ($1 ... $12, claim_v2.sql)."""

    queue: str
    worker_id: str
    lease_s: int
    qty: int
    store_schema: str | None
    own_queue: str | None
    mode: str | None
    plays: list[str]
    with_lanes: bool
    begin_release_id: str | None  # the begun attempts' release, worker and step keys
    begin_worker_id: str | None
    step_keys: int | None


# lane_worker.claim_lane_v1's modes (sql/engine/claim_v1.sql says what each hands out;
# a worker whose lane is retired is served as CLAIM_DRAIN whatever it asks).
CLAIM_OWN = "own"
CLAIM_ADOPT = "adopt"
CLAIM_MINE = "mine"
CLAIM_DRAIN = "drain"


async def claim(
    conn: Connection,
    queue: str,
    worker_id: str,
    *,
    lease_s: int,
    qty: int,
    mode: str | None = None,
    store_schema: str | None = None,
    own_queue: str | None = None,
    plays: list[str] | None = None,
    with_lanes: bool = False,
    begin: BeginOwn | None = None,
    static: bool = True,
) -> ClaimBatch:
    """Claim up to ``qty`` runs from ``queue``.

    Without ``mode``, the engine's own claim (a claiming release on its own
    queue; without ``with_lanes`` it hands out every task, another system's
    too). With a mode (``CLAIM_OWN``, ``CLAIM_ADOPT``, ``CLAIM_MINE``,
    ``CLAIM_DRAIN``), ``lane_worker.claim_lane_v1``, which needs the run-state
    store's schema, the claimer's own lane queue and its app's plays. With
    ``with_lanes`` (and the store's schema), each run comes with its store facts
    (``ClaimedRun.lane``), read in the same round trip; with ``begin`` too, the
    attempts of the runs its own loop will certainly own are begun as well
    (``ClaimedRun.begun``). The loops' usual claims are static statements
    (``own_claim.sql``, ``adopt_claim.sql``) meaning what ``claim_next_v2``
    does; ``static=False`` always calls ``claim_next_v2`` (the tests that hold
    the two to each other).
    """
    if (with_lanes or mode is not None) and store_schema is None:
        raise ValueError("a lane claim, or a claim with lane facts, needs the store's schema")
    rows: list[asyncpg.Record] | None = None
    # Taken before the statement that answers (the runs' clock reads the
    # database's time after it): a fallback statement takes it again.
    sent_s = time.monotonic()
    if static and mode is None and with_lanes and begin is not None and queue == own_queue:
        # The own loop's usual claim: one static statement for this queue, whose
        # plan the server keeps (sql/engine/own_claim.sql).
        assert store_schema is not None
        own = _OwnClaim(
            queue=queue,
            worker_id=worker_id,
            lease_s=lease_s,
            qty=qty,
            plays=plays or [],
            begin_release_id=begin.release_id,
            begin_worker_id=begin.worker_id,
            step_keys=begin.step_keys,
        )
        sql = query("engine", "own_claim.sql", "own_claim", schema=store_schema, queue=queue)
        rows = await _fetch_planned_once(conn, sql, args_of(own))
        if any(r["retired"] for r in rows):
            rows = None  # a retired lane's worker: claim_next serves it as 'drain'
            sent_s = time.monotonic()
    if (
        static
        and mode in (CLAIM_ADOPT, CLAIM_DRAIN)
        and not with_lanes
        and begin is None
        and own_queue is not None
        and queue != own_queue
        and worker_id.endswith(":continuations")
    ):
        # A continuation loop's claim, adopting or draining: one static statement
        # for this queue (sql/engine/adopt_claim.sql). Everything else keeps
        # claim_next_v2: mode 'mine' (a lane claiming again, rare), and the calls
        # claim_lane_v1 refuses (another lane's queue without a :continuations
        # worker id, 'adopt' on the own queue), so the refusal stays its.
        assert store_schema is not None
        assert mode is not None
        adopt = _AdoptClaim(
            queue=queue,
            worker_id=worker_id,
            lease_s=lease_s,
            qty=qty,
            own_queue=own_queue,
            plays=plays or [],
            mode=mode,
        )
        sql = query("engine", "adopt_claim.sql", "adopt_claim", schema=store_schema, queue=queue)
        rows = await _fetch_planned_once(conn, sql, args_of(adopt))
    if rows is None and (with_lanes or mode is not None):
        params = _ClaimNext(
            queue=queue,
            worker_id=worker_id,
            lease_s=lease_s,
            qty=qty,
            store_schema=store_schema,
            own_queue=own_queue,
            mode=mode,
            plays=plays or [],
            with_lanes=with_lanes,
            begin_release_id=begin.release_id if begin else None,
            begin_worker_id=begin.worker_id if begin else None,
            step_keys=begin.step_keys if begin else None,
        )
        rows = await conn.fetch(engine_query("claim_next"), *args_of(params))
    elif rows is None:
        rows = await conn.fetch(engine_query("claim_task"), queue, worker_id, lease_s, qty)
    due = next((r for r in rows if r["run_id"] is None and r.get("due_known")), None)
    runs = tuple(
        ClaimedRun(
            queue=queue,
            run_id=r["run_id"],
            task_id=r["task_id"],
            attempt=r["attempt"],
            task_name=r["task_name"],
            params=r["params"],
            max_attempts=r["max_attempts"],
            wake_event=r["wake_event"],
            event_payload=r["event_payload"],
            lane=_prefixed(ClaimedRunState, r, "lane_", "run_id") if with_lanes else None,
            begun=_prefixed(Begun, r, "begun_", "attempt_id") if with_lanes else None,
            sent_s=sent_s,
        )
        for r in rows
        if r["run_id"] is not None
    )
    return ClaimBatch(
        runs=runs,
        swept=max((r["swept"] for r in rows), default=0),
        due_known=due is not None,
        due_in_s=due["due_in_s"] if due is not None else None,
    )


async def next_due_in_s(
    conn: Connection,
    queue: str,
    *,
    mode: str | None = None,
    store_schema: str | None = None,
    own_queue: str | None = None,
    plays: list[str] | None = None,
) -> float | None:
    """Seconds until ``claim`` (with the same arguments) hands out a run of ``queue``, if any.

    Negative: one is due already; measured on the database's clock, which the
    engine wakes runs by. With the store's schema, only lane-worker's tasks count.
    """
    if mode is None and store_schema is None:
        due: float | None = await conn.fetchval(engine_query("next_due"), queue)
    else:
        due = await conn.fetchval(
            engine_query("next_due_in"), queue, store_schema, own_queue, mode, plays or []
        )
    return due


@dataclass(frozen=True)
class DueCheck:
    """One queue of the claim loops' safety net: is it there, and when is a run claimable."""

    queue: str
    present: bool
    due_in_s: float | None  # as ``next_due_in_s``: negative, due already; None, none


async def next_due_many(
    conn: Connection,
    queues: list[str],
    modes: list[str | None],
    *,
    store_schema: str,
    own_queue: str,
    plays: list[str],
) -> list[DueCheck]:
    """Return ``next_due_in_s`` of each of ``queues`` (claimed in ``modes``) in one statement.

    Keep ``queues`` to a bounded batch: each queue's run table stays locked until commit.
    """
    rows = await conn.fetch(
        engine_query("next_due_many"), queues, store_schema, own_queue, plays, modes
    )
    return [DueCheck(r["queue"], r["present"], r["due_in_s"]) for r in rows]
