"""In-process workers for runtime tests: a real pool, real claims, real plays.

The daemon (its loops, signals, LISTEN) is tested end to end elsewhere; here a
test drives claims itself so it can stop a run between any two durable points.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import asyncpg

from support import give_up_after
from worker import lanes
from worker.app import App
from worker.client import LaneClient
from worker.config.settings import Tuning
from worker.db import engine
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.metrics import Metrics
from worker.run.begin import DeferLimits
from worker.run.context import TaskContext
from worker.run.execute import Runtime
from worker.run.handle import WorkerSeat

SCHEMA = "runtime_scheduler"
T = TypeVar("T")


@asynccontextmanager
async def open_client(url: str, env: Mapping[str, str] | None = None) -> AsyncIterator[LaneClient]:
    """A LaneClient on ``url`` with an explicit environment (never the test process's)."""
    client = await LaneClient.connect(url, env=dict(env or {}))
    try:
        await client.ensure_schemas()
        yield client
    finally:
        await client.close()


@asynccontextmanager
async def open_runtime(
    url: str,
    app: App,
    release_id: str,
    *,
    lease_s: int = 30,
    worker_base: str | None = None,
    metrics: Metrics | None = None,
    defer_alert_after_s: float = Tuning.defer_alert_after_s,
    defer_fail_after_s: float = 0.0,
    unknown_play_grace_s: float = Tuning.unknown_play_grace_s,
) -> AsyncIterator[Runtime]:
    """A Runtime for ``release_id`` on its own 2-connection pool."""
    db = await Database.open(PoolOptions(url=url, max_size=2, retry_for_s=5))
    seat = WorkerSeat.of(
        release_id, worker_base=worker_base or f"test-{release_id}", lease_s=lease_s
    )
    defer = DeferLimits(defer_alert_after_s, defer_fail_after_s, unknown_play_grace_s)
    try:
        yield Runtime(db, Store(SCHEMA), app, seat, defer=defer, metrics=metrics)
    finally:
        await db.close()


def set_policy(rt: Runtime, **changes: Any) -> None:
    """Publish ``rt``'s claim policy with ``changes``, as the daemon's lane follower would."""
    rt.policy.publish(replace(rt.policy.value, **changes))


async def connect(url: str) -> asyncpg.Connection[asyncpg.Record]:
    """Open a plain connection with the JSON codecs lane-worker's pool uses."""
    conn = await asyncpg.connect(url)
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


async def work_once(runtime: Runtime, queue: str | None = None, qty: int = 10) -> list[str]:
    """Claim what is due on ``queue`` (default: the runtime's own) and handle each run."""
    batch = await runtime.claim(queue or runtime.queue, qty)
    return [(await runtime.handle(run)).outcome for run in batch.runs]


async def work_until(
    runtime: Runtime, expected: str, *, queue: str | None = None, timeout_s: float = 20
) -> list[str]:
    """Keep claiming until some run ends with outcome ``expected``; return all outcomes seen."""
    seen: list[str] = []

    async def done() -> bool:
        seen.extend(await work_once(runtime, queue))
        return expected in seen

    await eventually(done, timeout_s=timeout_s, what=f"an attempt ending {expected!r}")
    return seen


async def eventually(
    check: Callable[[], Awaitable[Any]], *, timeout_s: float = 20, what: str = "condition"
) -> Any:
    """Await ``check`` until it returns something truthy, or fail after ``timeout_s``.

    ``WAIT_FLOOR_S`` at least: the limit only tells a hang from a loaded machine.
    """
    timeout_s = give_up_after(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def register_worker(runtime: Runtime, worker_id: str | None = None) -> None:
    """Record a live worker of ``runtime``'s release with its plays (as a heartbeat does)."""
    await runtime.db.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid,"
        " concurrency, plays) values ($1, $2, $3, 'test', 1, 8, $4)",
        worker_id or runtime.worker_base,
        runtime.release_id,
        runtime.queue,
        runtime.plays,
    )


async def sleepers_due(conn: asyncpg.Connection[asyncpg.Record], queue: str) -> bool:
    """Tell whether no engine run on ``queue`` sleeps into the future (the database's clock)."""
    late = await conn.fetchval(
        f"select count(*) from absurd.r_{queue}"
        " where state = 'sleeping' and available_at > absurd.current_time()"
    )
    return bool(late == 0)


def env_of(release: str) -> dict[str, str]:
    """The client environment that stamps ``release``."""
    return {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release}


def queue_of(release_id: str) -> str:
    """Return the lane queue of a release."""
    return lanes.queue_name_for_release(release_id)


class GatedPlays(Protocol):
    """What :func:`hold_in_flight` needs of a play's state: the event its gated step sets."""

    def entered_event(self, name: str) -> asyncio.Event:
        """Return the event set when the gated step of run ``name`` starts."""
        ...


async def claim_one(rt: Runtime, queue: str) -> engine.ClaimedRun:
    """Claim exactly one run of ``queue`` as ``rt``'s loop for it would."""
    batch = await rt.claim(queue, 5)
    assert len(batch.runs) == 1, batch
    return batch.runs[0]


async def claim_one_undecided(rt: Runtime, queue: str) -> engine.ClaimedRun:
    """Claim exactly one run of ``queue`` without its store facts or a begun attempt.

    ``handle`` then reads the facts and begins the attempt itself, as for a retired
    lane's queue or a run the own loop's claim does not begin: the path whose
    races (a move between the claim and the fence) tests still drive.
    """
    mode = rt.claim_mode(queue)
    batch = await rt.db.run(
        lambda c: engine.claim(
            c, queue, rt.worker_id_for(queue), lease_s=rt.lease_s, qty=5, mode=mode,
            store_schema=rt.store.schema, own_queue=rt.queue, plays=rt.plays,
        )
    )  # fmt: skip
    assert len(batch.runs) == 1, batch
    return batch.runs[0]


async def hold_in_flight(rt: Runtime, plays: GatedPlays, name: str) -> asyncio.Task[Any]:
    """Claim run ``name`` (whose gated step holds) and handle it in a task, blocked mid-step."""
    claimed = await claim_one(rt, rt.queue)
    task = asyncio.create_task(rt.handle(claimed))
    await asyncio.wait_for(plays.entered_event(name).wait(), 20)
    return task


def one_step_app() -> App:
    """An app with play ``one``: one step that returns ``{"n": params["n"]}``."""
    app = App()

    @app.play("one")
    async def one(ctx: TaskContext, params: dict[str, Any]) -> dict[str, int]:
        return await ctx.step("s", lambda: {"n": params["n"]})  # type: ignore[no-any-return]

    return app
