"""The world of tests/integration/test_claim_rule.py: every combination of lane facts, one database.

Six lanes, registered in this order (a release adopts only from older ones):
``old`` (retired), ``dr`` (retired: the draining seat's), ``again`` (claiming again
after a retirement), ``me`` (claiming: the claiming seats'), ``oc`` (another claiming
lane) and ``nr`` (retired, the newest release). Then ``dv``, a worktree's dev lane
(``dev-rule``), registered last: it stands apart from the release order, adopting
nothing. On each of the queues of ``me``, ``dr``, ``old`` and ``again`` one run per
combination of wait, adopter, play and stamp.
"""

from __future__ import annotations

import itertools
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from support.runtime import SCHEMA, connect, env_of, open_client, open_runtime, queue_of
from worker.app import App
from worker.db.store import Store
from worker.run.context import TaskContext
from worker.run.execute import Runtime

LANES = ("old", "dr", "again", "me", "oc", "nr")  # registration order
DEV = "dv"  # a worktree's lane, registered after every release lane
RETIRED = ("old", "dr", "nr")
QUEUES = ("me", "dr", "old", "again")  # where runs are put (the seats' queues)
# The dev lane's app also registers p_nowhere, which no release's machine does: were
# it counted as a newer lane, `dr`'s parked p_nowhere runs would read as adoptable.
APPS = {"me": ("p_all", "p_me"), "dr": ("p_all", "p_dr"), DEV: ("p_all", "p_nowhere")}
# (worker, lane, plays, live): another machine of a lane may have another app.
WORKERS: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    ("me-a", "me", ("p_all", "p_me"), True),
    ("me-b", "me", ("p_all", "p_live"), True),
    ("me-c", "me", ("p_stopped",), False),
    ("dr-a", "dr", ("p_all", "p_dr"), True),
    ("dr-b", "dr", ("p_all", "p_live"), True),
    ("dr-c", "dr", ("p_stopped",), False),
    ("oc-a", "oc", ("p_all",), True),
    ("dv-a", DEV, ("p_all", "p_nowhere"), True),
)
PLAYS = ("p_all", "p_me", "p_dr", "p_live", "p_stopped", "p_nowhere")
ADOPTERS = ("none", "me", "dr", "again", "oc", "nr")  # again: claiming, older than me
STAMPS = ("lane", "stray")  # stray: stamped with a release of no lane here (misconfigured)
STRAY = "rule-stray"

# wait: (store status, current_wait kind or None, engine state, due, event payload)
WAITS: dict[str, tuple[str, str | None, str, str, Any]] = {
    "fresh": ("queued", None, "pending", "past", None),
    "retry": ("retrying", None, "sleeping", "past", None),
    # Its worker died mid-attempt: a claim swept the expired lease (fail_run: a retry).
    "lease_lost": ("running", None, "sleeping", "past", None),
    # A hand-back is absurd.schedule_run: `sleeping`, keeping an event payload it had.
    "handback": ("queued", None, "sleeping", "past", {"late": True}),
    "sleep_woken": ("waiting", "sleep", "sleeping", "past", None),
    "event_woken": ("waiting", "integration_event", "pending", "past", {"ok": 1}),
    "runner_woken": ("waiting", "runner", "pending", "past", {"ok": 1}),
    "sleep_asleep": ("waiting", "sleep", "sleeping", "future", None),
    "event_asleep": ("waiting", "integration_event", "sleeping", "infinity", None),
    # A kind this build does not know (a newer build parked it).
    "mystery_woken": ("waiting", "mystery", "sleeping", "past", None),
}
DUE = {"past": "now() - interval '1 second'", "future": "now() + interval '1 hour'",
       "infinity": "'infinity'::timestamptz"}  # fmt: skip


def armed_event(kind: str | None, state: str) -> bool:
    """Whether the engine run names the event it waits for (emit_event clears it as it wakes)."""
    return kind in ("integration_event", "runner") and state == "sleeping"


@dataclass(frozen=True)
class Case:
    queue: str
    wait: str
    adopter: str
    play: str
    stamp: str


CASES = tuple(Case(*c) for c in itertools.product(QUEUES, WAITS, ADOPTERS, PLAYS, STAMPS))


@dataclass
class World:
    conn: asyncpg.Connection[asyncpg.Record]
    stack: AsyncExitStack
    release: dict[str, str] = field(default_factory=dict)
    queue: dict[str, str] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # release id -> registration rank
    runtimes: dict[str, Runtime] = field(default_factory=dict)
    task: dict[Case, uuid.UUID] = field(default_factory=dict)
    # The plays the live workers of release lanes newer than `dr` that claim register
    # (not the dev lane's p_nowhere).
    adoptable_from_dr: frozenset[str] = frozenset({"p_all", "p_me", "p_live"})

    async def close(self) -> None:
        await self.conn.close()
        await self.stack.aclose()


def app_of(plays: tuple[str, ...]) -> App:
    app = App()
    for name in plays:

        @app.play(name)
        async def play(ctx: TaskContext, params: Any) -> None:
            raise AssertionError("the claim-rule test never runs a play")

    return app


async def build_world(url: str) -> World:
    """Register the lanes and workers, submit every case, and set each run's facts."""
    stack = AsyncExitStack()
    world = World(await connect(url), stack)
    for rank, lane in enumerate(LANES):
        world.release[lane] = f"rule-{lane}"
        world.queue[lane] = queue_of(world.release[lane])
        world.order[world.release[lane]] = rank
    world.release[DEV] = "dev-rule"
    world.queue[DEV] = queue_of(world.release[DEV])
    world.order[world.release[DEV]] = len(LANES)
    clients = {
        lane: await stack.enter_async_context(open_client(url, env_of(world.release[lane])))
        for lane in LANES
    }
    # The real registry calls, in order: `lanes activate` registers each lane (in
    # release order: created_at), `lanes retire` retires, and `again` was retired and
    # activated again (a rollback).
    for lane in LANES:
        await clients[lane].activate_release(world.release[lane], force=True)
    for lane in (*RETIRED, "again"):
        await clients[lane].retire_release(world.release[lane], force=True)
    await clients["again"].activate_release(world.release["again"], force=True)
    # A worktree's worker registers its lane as it boots (the daemon's register call).
    await Store(SCHEMA).lanes.register(world.conn, queue=world.queue[DEV], release_id="dev-rule")
    for lane, app_plays in APPS.items():
        world.runtimes[lane] = await stack.enter_async_context(
            open_runtime(url, app_of(app_plays), world.release[lane], worker_base=f"seat-{lane}")
        )
    store = Store(SCHEMA)
    for worker, lane, plays, live in WORKERS:  # a heartbeat, and a stop mark
        await store.lanes.heartbeat(
            world.conn, worker_id=worker, release_id=world.release[lane],
            queue=world.queue[lane], hostname="test", pid=1, concurrency=8, plays=list(plays),
        )  # fmt: skip
        if not live:
            await store.lanes.worker_stopped(world.conn, worker_id=worker)
    # Every run through the real submit: the store's submit_run (the app's SQL API,
    # which LaneClient.submit calls once per run), one statement for all of them.
    made = await world.conn.fetch(
        f"select n, (s ->> 'runId')::uuid as run_id from unnest($1::text[], $2::text[])"
        f" with ordinality as c(play, release, n),"
        f" lateral {SCHEMA}.submit_run(c.play, '{{}}'::jsonb, c.release, null, null, null) s",
        [c.play for c in CASES],
        [world.release[c.queue] for c in CASES],
    )
    runs = {r["n"]: r["run_id"] for r in made}
    tasks: dict[uuid.UUID, uuid.UUID] = {
        r["run_id"]: r["task_id"]
        for r in await world.conn.fetch(
            f"select run_id, task_id from {SCHEMA}.runs where run_id = any($1)", list(runs.values())
        )
    }
    for n, case in enumerate(CASES, start=1):
        world.task[case] = tasks[runs[n]]
    await set_facts(world)
    return world


async def set_facts(world: World) -> None:
    """Give each run its case's facts by direct updates of the store's and engine's rows.

    No API reaches these combinations at this scale: a parked, woken, retried or
    adopted run needs an attempt that ran its play to that point (and adoption a
    claim by the adopter), one run at a time. The rows written are the ones those
    paths leave (worker/sql/store/attempts.sql park_run and begin_attempt, the
    engine's schedule_run / await_event / emit_event / fail_run): store status,
    current_wait, adopted_release_id / adopted_queue, and the engine run's state,
    available_at, wake_event and event_payload. The stray stamp is a launch row
    no submit writes (a misconfigured app that stamped another release).
    """
    store_rows: list[tuple[Any, ...]] = []
    engine_rows: dict[str, list[tuple[Any, ...]]] = {q: [] for q in QUEUES}
    for case in CASES:
        status, kind, state, due, payload = WAITS[case.wait]
        wait = None if kind is None else {"kind": kind, "boundaryId": f"b-{case.wait}"}
        adopter = None if case.adopter == "none" else world.release[case.adopter]
        store_rows.append((
            world.task[case], status, wait, adopter,
            None if adopter is None else world.queue[case.adopter],
            STRAY if case.stamp == "stray" else None,
        ))  # fmt: skip
        engine_rows[case.queue].append(
            (world.task[case], state, due, payload, armed_event(kind, state))
        )
    await world.conn.executemany(
        f"update {SCHEMA}.runs set status = $2, current_wait = $3, adopted_release_id = $4,"
        " adopted_queue = $5, release_id = coalesce($6, release_id) where task_id = $1",
        store_rows,
    )
    for queue, updates in engine_rows.items():
        await world.conn.executemany(
            f"update absurd.r_{world.queue[queue]} set state = $2,"
            f" available_at = case $3 when 'past' then {DUE['past']}"
            f" when 'future' then {DUE['future']} else {DUE['infinity']} end,"
            " event_payload = $4, wake_event = case when $5 then 'evt:rule' end"
            " where task_id = $1",
            updates,
        )
