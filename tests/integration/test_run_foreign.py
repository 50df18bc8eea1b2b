"""Tasks of another system on a lane queue (the TypeScript app's): left for their owner.

When release ids coincide (a dev `runs` lane, one worktree suffix, one deploy
version for both) the TS app spawns its tasks on the queue lane-worker claims.
Today's claim can still hand them over; the worker must put each back without
spending an attempt, never cancel, fail or run it, and say so once per queue.
"""

from __future__ import annotations

import uuid

import pytest
import structlog

from support import typescript as ts
from support.daytona import FakeDaytona
from support.db import execute
from support.runtime import env_of, eventually, open_client, open_runtime, queue_of, work_once
from worker import App, TaskContext
from worker.run.foreign import FOREIGN_BACKOFF_MAX_S, backoff_s
from worker.run.sandbox import SANDBOX_CLEANUP_TASK, DaytonaDeleter

A = "rel-shared"
QA = queue_of(A)


def plain_app() -> App:
    app = App()

    @app.play("plain")
    async def plain(ctx: TaskContext, params: dict[str, object]) -> str:
        return "mine"

    return app


FOREIGN = [
    pytest.param(ts.TS_TASK, {"from": "typescript"}, id="another-task-name"),
    pytest.param("play-run", {"runId": str(uuid.uuid4())}, id="play-run-of-an-unknown-run"),
    pytest.param(
        SANDBOX_CLEANUP_TASK,
        {"runId": str(uuid.uuid4()), "sandboxId": "sbx-of-the-ts-app"},
        id="sandbox-cleanup-of-the-ts-app",
    ),
    pytest.param("play-run", {"nothing": "like ours"}, id="play-run-without-a-run-id"),
]


@pytest.mark.parametrize(("name", "params"), FOREIGN)
async def test_a_foreign_task_is_put_back_untouched_and_its_owner_runs_it(
    database_url: str, name: str, params: dict[str, str]
) -> None:
    """Never cancelled, failed or run; no attempt spent; the owner claims it as attempt 1."""
    async with (
        FakeDaytona() as fake,
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, plain_app(), A) as rt,
    ):
        fake.sandboxes.add("sbx-of-the-ts-app")
        deleter, _ = DaytonaDeleter.from_env(fake.env("key"))
        rt.cleanups.deleter = deleter
        mine = await client.submit("plain")
        task_id = await ts.spawn(database_url, QA, name, params)
        with structlog.testing.capture_logs() as logs:
            outcomes = await work_once(rt)
        assert sorted(outcomes) == ["completed", "deferred"]
        assert (await client.status(mine.run_id)).status == "completed"
        (run,) = await ts.task_runs(database_url, QA, task_id)
        # Put back as it was: the same engine run, attempt 1, no holder, due later.
        assert (run["attempt"], run["state"], run["claimed_by"], run["later"]) == (
            1,
            "sleeping",
            None,
            True,
        )
        assert run["task_state"] == "sleeping"
        assert [e["event"] for e in logs if e["event"].startswith("run.")] == [
            "run.started",
            "run.completed",
            "run.foreign_left",
        ]
        # Its owner's worker takes it once due, as its first attempt, and completes it.
        got = await eventually(lambda: ts.claim(database_url, QA), what="the TS claim")
        assert [(r["task_id"], r["attempt"]) for r in got] == [(task_id, 1)]
        await ts.complete(database_url, QA, got[0]["run_id"])
        (done,) = await ts.task_runs(database_url, QA, task_id)
        assert (done["state"], done["task_state"], done["claimed_by"]) == (
            "completed",
            "completed",
            ts.TS_WORKER,
        )
        assert fake.deletes == {}  # the TS app's sandbox is the TS app's to delete


async def test_foreign_tasks_are_logged_once_per_queue_and_backed_off(database_url: str) -> None:
    """Each meeting doubles the task's back-off (bounded); the queue is logged once."""
    async with (
        open_client(database_url, env_of(A)),
        open_runtime(database_url, plain_app(), A) as rt,
    ):
        first = await ts.spawn(database_url, QA)
        second = await ts.spawn(database_url, QA)
        with structlog.testing.capture_logs() as logs:
            assert await work_once(rt) == ["deferred", "deferred"]
            # Due again: met a second time, each is put back for longer.
            await _make_due(database_url, QA)
            assert await work_once(rt) == ["deferred", "deferred"]
        said = [e for e in logs if e["event"] == "run.foreign_left"]
        assert [(e["queue"], e["due_in_s"]) for e in said] == [(QA, 1.0)]
        for task_id in (first, second):
            (run,) = await ts.task_runs(database_url, QA, task_id)
            assert (run["attempt"], run["state"], run["task_attempts"]) == (1, "sleeping", 1)
    assert [backoff_s(n) for n in (1, 2, 3, 4, 5, 6, 7, 50)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert FOREIGN_BACKOFF_MAX_S == 30


async def _make_due(database_url: str, queue: str) -> None:
    await execute(
        database_url,
        f'update absurd."r_{queue}" set available_at = absurd.current_time()'
        " where state = 'sleeping'",
    )
