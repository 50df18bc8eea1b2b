"""A play under its lease (worker/run/lease.py, worker/run/threads.py), on real Postgres.

A sync step body that blocks keeps its lease and runs once while other runs go on; an
attempt ends only once every sync step body it started has returned (cancelled, or
given up by its play's task group), and no retry starts before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg
import pytest
import structlog

from support.db import (
    attempt_rows,
)
from support.plays import (
    ENV_A,
    QA,
    A,
)
from support.runtime import (
    claim_one,
    env_of,
    eventually,
    open_client,
    open_runtime,
    register_worker,
    work_until,
)
from worker import App, TaskContext
from worker.client import LaneClient
from worker.errors import RunStillOpenError
from worker.run.execute import Runtime

C = "rel-c"


class LeaseWatch:
    """Watches one engine run's lease from its own thread and event loop (not the worker's)."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.expired_while_running = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._watch()), daemon=True)

    async def _watch(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self.stop.is_set():
                if await conn.fetchval(
                    f"select exists (select 1 from absurd.r_{self.queue} where state = 'running'"
                    " and claim_expires_at < clock_timestamp())"
                ):
                    self.expired_while_running = True
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    def __enter__(self) -> LeaseWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


async def test_a_sync_step_longer_than_the_lease_runs_once_and_others_progress(
    database_url: str,
) -> None:
    """A blocking sync step twice the lease: lease kept, one execution, one attempt; others run."""
    calls: Counter[str] = Counter()
    finished: dict[str, float] = {}
    quick_done = threading.Event()
    app = App()

    @app.play("blocking")
    async def blocking(ctx: TaskContext, params: Any) -> str:
        def slow() -> str:
            calls["slow"] += 1
            time.sleep(4.5)  # a sync client call that does not yield, past the lease
            # ... and on until the quick run has finished, however slow the machine (a
            # step that held the event loop would keep it from ever finishing: then it
            # ends after this, a minute on).
            quick_done.wait(60)
            return "done"

        result = str(await ctx.step("slow", slow))
        finished["blocking"] = time.monotonic()
        return result

    @app.play("quick")
    async def quick(ctx: TaskContext, params: Any) -> int:
        value = int(await ctx.step("q", lambda: 1))
        finished["quick"] = time.monotonic()
        quick_done.set()
        return value

    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A, lease_s=2) as rt,
    ):
        slow_run = await client.submit("blocking")
        batch = await rt.claim(QA, 1)
        with LeaseWatch(database_url, QA) as watch:
            async with anyio.create_task_group() as tg:
                tg.start_soon(rt.handle, batch.runs[0])
                quick_run = await client.submit("quick")
                assert await work_until(rt, "completed") == ["completed"]
        slow_status = await client.status(slow_run.run_id)
        quick_status = await client.status(quick_run.run_id)
    assert not watch.expired_while_running
    assert calls == Counter({"slow": 1})
    assert slow_status.status == quick_status.status == "completed"
    assert [(a.attempt, a.outcome) for a in slow_status.attempts] == [(1, "completed")]
    assert finished["quick"] < finished["blocking"]


# -- a sync step body that outlives its attempt's await ---------------------------------------


class Blocking:
    """A play whose sync step bodies block on a thread until ``release`` is set.

    ``one`` holds one step; ``group`` runs a failing async step beside a held
    sync one in a task group, so the group gives up the sync step's await.
    """

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.app = App()

        def body() -> str:
            self.entered.set()
            self.release.wait(60)
            self.returned.set()
            return "held"

        @self.app.play("one")
        async def one(ctx: TaskContext, params: Any) -> Any:
            return await ctx.step("hold", body)

        @self.app.play("group")
        async def group(ctx: TaskContext, params: Any) -> Any:
            async def fail() -> None:
                await asyncio.to_thread(self.entered.wait, 20)
                raise RuntimeError("the other branch failed")

            async with asyncio.TaskGroup() as tg:
                tg.create_task(ctx.step("hold", body))
                tg.create_task(ctx.step("fail", fail))


@asynccontextmanager
async def blocking_lane(
    database_url: str, blocking: Blocking
) -> AsyncIterator[tuple[LaneClient, Runtime]]:
    """A client and a live runtime of A with a 3 s lease (extended every second)."""
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, blocking.app, A, lease_s=3) as rt,
    ):
        await client.activate_release(A, force=True)
        await register_worker(rt)
        yield client, rt


def logged(logs: list[dict[str, Any]], event: str) -> bool:
    return any(entry.get("event") == event for entry in logs)


async def test_a_cancelled_run_is_not_retried_while_its_sync_step_still_runs(
    database_url: str,
) -> None:
    """Cancelled mid sync step: the attempt stays open until the body returns; no retry before."""
    blocking = Blocking()
    async with blocking_lane(database_url, blocking) as (client, rt):
        run = await client.submit("one")
        claimed = await claim_one(rt, QA)
        try:
            with structlog.testing.capture_logs() as logs:
                task = asyncio.create_task(rt.handle(claimed))
                await eventually(lambda: asyncio.sleep(0, blocking.entered.is_set()))
                assert await client.cancel(run.run_id)
                # The lease keeper finds the cancel within a second or so.
                await eventually(
                    lambda: asyncio.sleep(0, task.done() or logged(logs, "run.step_still_running")),
                    what="the cancel observed",
                )
                assert not task.done(), "the attempt ended while its step body still ran"
                with pytest.raises(RunStillOpenError, match="may still be executing"):
                    await client.retry_run(run.run_id)
                rows = await attempt_rows(database_url, run.run_id)
                assert [r["outcome"] for r in rows] == [None]
        finally:
            blocking.release.set()
        assert (await asyncio.wait_for(task, 20)).outcome == "cancelled"
        assert [r["outcome"] for r in await attempt_rows(database_url, run.run_id)] == ["cancelled"]
        retried = await client.retry_run(run.run_id)
        assert retried.created


async def test_a_play_that_gives_up_a_sync_step_ends_its_attempt_only_once_it_returned(
    database_url: str,
) -> None:
    """A task group fails beside a held sync step: attempt and lease last until it returns."""
    blocking = Blocking()
    async with blocking_lane(database_url, blocking) as (client, rt):
        run = await client.submit("group")
        claimed = await claim_one(rt, QA)
        try:
            with structlog.testing.capture_logs() as logs:
                task = asyncio.create_task(rt.handle(claimed))
                await eventually(
                    lambda: asyncio.sleep(0, task.done() or logged(logs, "run.step_still_running")),
                    what="the play's failure",
                )
                assert not task.done(), "the attempt ended while its step body still ran"
                # Its lease is still extended: nobody else can claim the run meanwhile.
                await asyncio.sleep(4)  # longer than the lease: a lapsed one would show here
                assert not (await rt.claim(QA, 5)).runs
                rows = await attempt_rows(database_url, run.run_id)
                assert [r["outcome"] for r in rows] == [None]
        finally:
            blocking.release.set()
        assert (await asyncio.wait_for(task, 20)).outcome == "retrying"
        assert blocking.returned.is_set()
