"""Sandbox cleanup (``ctx.register_sandbox``, worker/run/sandbox.py) against a fake Daytona.

A run that registered a sandbox gets, in the transaction that ends it, one
``daytona-sandbox-cleanup`` task on its lane; a worker deletes the sandbox with
Daytona's SDK. A sandbox already gone counts as cleaned; a 500 or a hanging DELETE
is retried by the engine; the last failure gives the cleanup up and the report
names the sandbox; a worker without the SDK's key leaves the task queued; once the
lane is retired a newer release takes the cleanup over.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import structlog

from support.daytona import HANG, FakeDaytona
from support.db import sql
from support.runtime import (
    SCHEMA,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    work_once,
)
from worker import App, TaskContext
from worker.run.execute import Runtime
from worker.run.sandbox import SANDBOX_CLEANUP_TASK, DaytonaDeleter

A, B = "rel-sbx-a", "rel-sbx-b"
KEY = "daytona-key-9c2d"


def sandbox_app() -> App:
    app = App()

    @app.play("uses-sandboxes")
    async def uses(ctx: TaskContext, params: Any) -> Any:
        for sandbox_id in params["sandboxes"]:
            await ctx.register_sandbox(sandbox_id)
            await ctx.register_sandbox(sandbox_id)  # again, as on a resume: recorded once
        if params.get("fail"):
            raise RuntimeError("the play failed; its sandboxes still go")
        return "ok"

    return app


def with_daytona(rt: Runtime, fake: FakeDaytona) -> Runtime:
    """Give ``rt`` a Daytona deleter pointed at ``fake`` (as the daemon does from DAYTONA_*)."""
    deleter, why_not = DaytonaDeleter.from_env(fake.env(KEY))
    assert why_not is None
    rt.cleanups.deleter = deleter
    rt.cleanups.call_timeout_s = 1.0
    return rt


async def cleanup_rows(url: str) -> dict[str, tuple[str | None, int]]:
    rows = await sql(
        url,
        f"select coalesce(jsonb_object_agg(sandbox_id, jsonb_build_array(cleanup,"
        f" cleanup_attempts)), '{{}}') from {SCHEMA}.run_sandboxes",
    )
    return {k: (v[0], v[1]) for k, v in rows.items()}


async def cleanup_tasks(url: str, queue: str) -> list[str]:
    """The states of the cleanup tasks on ``queue``."""
    found = await sql(
        url,
        f"select coalesce(jsonb_agg(state order by task_id), '[]') from absurd.t_{queue}"
        " where task_name = $1",
        SANDBOX_CLEANUP_TASK,
    )
    return list(found)


async def test_a_run_s_sandboxes_are_deleted_once_it_ends(database_url: str) -> None:
    """Completed and failed runs alike: one cleanup task per sandbox, spawned as the run ends."""
    async with (
        FakeDaytona() as fake,
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, sandbox_app(), A) as rt,
    ):
        fake.sandboxes |= {"sb-1", "sb-2", "sb-3"}
        await client.submit("uses-sandboxes", {"sandboxes": ["sb-1", "sb-2"]})
        failing = await client.submit("uses-sandboxes", {"sandboxes": ["sb-3"], "fail": True})
        await sql(database_url, f"update absurd.t_{queue_of(A)} set max_attempts = 1")
        assert sorted(await work_once(rt)) == ["completed", "failed"]
        # Spawned in the transactions that ended the runs, before any worker saw them.
        assert await cleanup_tasks(database_url, queue_of(A)) == ["pending"] * 3
        assert (await client.status(failing.run_id)).status == "failed"
        with_daytona(rt, fake)
        assert await work_once(rt) == ["completed"] * 3
    assert sorted(fake.deleted) == ["sb-1", "sb-2", "sb-3"]
    assert fake.auth == {f"Bearer {KEY}"}
    assert await cleanup_rows(database_url) == {
        "sb-1": ("done", 1), "sb-2": ("done", 1), "sb-3": ("done", 1),
    }  # fmt: skip
    assert await cleanup_tasks(database_url, queue_of(A)) == ["completed"] * 3


async def test_gone_500_and_a_hanging_delete(database_url: str) -> None:
    """404: cleaned. 500 and a DELETE that never answers: retried by the engine, then deleted."""

    def script(sandbox_id: str, n: int) -> int:
        if n == 0:
            return {"sb-500": 500, "sb-hang": HANG}.get(sandbox_id, 200)
        return 200

    async with (
        FakeDaytona(script) as fake,
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, sandbox_app(), A) as rt,
    ):
        fake.sandboxes |= {"sb-500", "sb-hang"}  # "sb-gone" is not there
        await client.submit("uses-sandboxes", {"sandboxes": ["sb-gone", "sb-500", "sb-hang"]})
        assert await work_once(rt) == ["completed"]
        with_daytona(rt, fake)
        with structlog.testing.capture_logs() as logs:
            assert sorted(await work_once(rt)) == ["completed", "retrying", "retrying"]

            async def all_done() -> bool:
                await work_once(rt)
                rows = await cleanup_rows(database_url)
                return all(state == "done" for state, _ in rows.values())

            await eventually(all_done, timeout_s=30, what="every cleanup done")
    assert sorted(fake.deleted) == ["sb-500", "sb-hang"]
    assert await cleanup_rows(database_url) == {
        "sb-gone": ("done", 1), "sb-500": ("done", 2), "sb-hang": ("done", 2),
    }  # fmt: skip
    assert KEY not in repr(logs)
    assert {e["event"] for e in logs} >= {"sandbox.cleanup_retry", "sandbox.cleaned"}


async def test_the_last_failure_gives_the_cleanup_up_and_the_report_names_the_sandbox(
    database_url: str,
) -> None:
    """A DELETE that always fails: after the task's last attempt, failed, named with a remedy."""
    async with (
        FakeDaytona(lambda s, n: 500) as fake,
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, sandbox_app(), A) as rt,
    ):
        fake.sandboxes.add("sb-stuck")
        await client.activate_release(A, force=True)
        await client.submit("uses-sandboxes", {"sandboxes": ["sb-stuck"]})
        assert await work_once(rt) == ["completed"]
        await sql(
            database_url,
            f"update absurd.t_{queue_of(A)} set max_attempts = 2 where task_name = $1",
            SANDBOX_CLEANUP_TASK,
        )
        with_daytona(rt, fake)
        seen: list[str] = []

        async def given_up() -> bool:
            seen.extend(await work_once(rt))
            return "failed" in seen

        await eventually(given_up, timeout_s=30, what="the cleanup given up")
        (lane,) = [v for v in await client.lanes() if v.release_id == A]
    assert seen.count("retrying") == 1
    assert await cleanup_rows(database_url) == {"sb-stuck": ("failed", 2)}
    shown = lane.as_json()["sandboxCleanup"]
    assert (shown["pending"], shown["failed"], shown["failedSandboxes"]) == (0, 1, ["sb-stuck"])
    assert "delete these sandboxes in Daytona by hand" in shown["remedy"]
    assert lane.status == "claiming"


async def test_a_worker_that_cannot_delete_leaves_the_cleanup_queued_and_says_so_once(
    database_url: str,
) -> None:
    """No SDK key: the task is put back (no attempt spent), one warning; the report counts it."""
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, sandbox_app(), A) as rt,
    ):
        assert DaytonaDeleter.from_env({}) == (None, "DAYTONA_API_KEY is not set")
        await client.activate_release(A, force=True)
        await client.submit("uses-sandboxes", {"sandboxes": ["sb-a", "sb-b"]})
        assert await work_once(rt) == ["completed"]
        with structlog.testing.capture_logs() as logs:
            assert await work_once(rt) == ["deferred", "deferred"]
        (lane,) = [v for v in await client.lanes() if v.release_id == A]
    assert [e["event"] for e in logs].count("sandbox.cleanup_unavailable") == 1
    assert await cleanup_rows(database_url) == {"sb-a": ("pending", 0), "sb-b": ("pending", 0)}
    attempts = await sql(
        database_url,
        f"select max(attempts) from absurd.t_{queue_of(A)} where task_name = $1",
        SANDBOX_CLEANUP_TASK,
    )
    assert attempts == 1  # put back: the engine's attempt count did not move
    assert lane.as_json()["sandboxCleanup"]["pending"] == 2


async def test_a_retired_lane_s_cleanup_is_taken_over_by_a_newer_release(
    database_url: str,
) -> None:
    """A's run ended, A is retired and drained: B's continuation loop deletes A's sandbox."""
    async with (
        FakeDaytona() as fake,
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, sandbox_app(), A) as rt_a,
        open_runtime(database_url, sandbox_app(), B) as rt_b,
    ):
        fake.sandboxes.add("sb-old")
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        await register_worker(rt_b)
        await client.submit("uses-sandboxes", {"sandboxes": ["sb-old"]})
        assert await work_once(rt_a) == ["completed"]
        await client.retire_release(A)
        (lane,) = [v for v in await client.lanes() if v.release_id == A]
        assert lane.status == "drained"  # a pending cleanup never blocks the drain
        registry = {r.queue: r for r in await rt_b.db.run(
            lambda c: rt_b.store.lanes.registry(c, own_queue=rt_b.queue))}  # fmt: skip
        assert registry[queue_of(A)].has_open  # so B attaches a continuation loop there
        with_daytona(rt_b, fake)
        assert await work_once(rt_b, queue_of(A)) == ["completed"]
    assert fake.deleted == ["sb-old"]


async def test_register_sandbox_refuses_a_bad_id_and_an_unknown_run(database_url: str) -> None:
    """Through SQL, as any caller: 22023 for a blank id, P0002 for no such run."""
    import asyncpg

    from support.runtime import connect

    conn = await connect(database_url)
    try:
        with pytest.raises(asyncpg.NoDataFoundError):
            await conn.fetchval(f"select {SCHEMA}.register_sandbox($1, 'sb')", uuid.uuid4())
        with pytest.raises(asyncpg.InvalidParameterValueError):
            await conn.fetchval(f"select {SCHEMA}.register_sandbox($1, ' ')", uuid.uuid4())
    finally:
        await conn.close()
