"""Operator commands beside another system's queues and tasks (issue 29 §2), on real Postgres.

The TypeScript app creates engine queues of its own and spawns tasks on lane
queues when release ids coincide. `lanes retire/activate/move/show` act only on
lanes lane-worker registered (a lane row, or its runs); `lanes prune` never drops
a queue that holds any unfinished task (another system's, a sandbox cleanup) nor
one that holds another system's task at all, finished or not;
`lanes --json` counts the tasks on a lane's queue that lane-worker did not create.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import typescript as ts
from support.db import sql
from support.runtime import (
    SCHEMA,
    env_of,
    open_client,
    open_runtime,
    queue_of,
    work_once,
)
from worker import App, TaskContext
from worker.errors import UnknownLaneError
from worker.ops.report import lanes_table

A, B = "rel-fa", "rel-fb"
QA, QB = queue_of(A), queue_of(B)
TS_ONLY = "rel-ts-only"  # a release only the TypeScript app ever used: its queue, no lane
TS_REL = "rel-tsrel"  # one only the TypeScript app used, retired with --force


def app_with_sandbox() -> App:
    app = App()

    @app.play("plain")
    async def plain(ctx: TaskContext, params: Any) -> str:
        return "ok"

    @app.play("boxed")
    async def boxed(ctx: TaskContext, params: Any) -> str:
        await ctx.register_sandbox("sbx-1")
        return "ok"

    return app


async def queue_exists(database_url: str, queue: str) -> bool:
    """Tell whether the engine still has ``queue``."""
    return bool(
        await sql(database_url, "select count(*) from absurd.queues where queue_name = $1", queue)
    )


async def retired_long_ago(database_url: str, queue: str) -> None:
    """Retire-date the lane an hour back and mark its workers stopped (prune may act)."""
    await sql(
        database_url,
        f"update {SCHEMA}.releases set retired_at = now() - interval '1 hour' where queue = $1",
        queue,
    )
    await sql(
        database_url, f"update {SCHEMA}.workers set stopped_at = now() where queue = $1", queue
    )


@pytest.mark.parametrize("command", ["retire", "activate", "show", "move"])
async def test_a_queue_only_the_typescript_app_used_is_no_lane(
    database_url: str, command: str
) -> None:
    """Refused with one sentence naming the release; nothing is written, the task stays."""
    queue = queue_of(TS_ONLY)
    async with (
        open_client(database_url, env_of(B)) as client,
        open_runtime(database_url, app_with_sandbox(), B) as rt,
    ):
        await client.activate_release(B, force=True)
        task_id = await ts.spawn(database_url, queue)
        act = {
            "retire": lambda: client.retire_release(TS_ONLY),
            "activate": lambda: client.activate_release(TS_ONLY),
            "show": lambda: client.lane(TS_ONLY),
            "move": lambda: client.move_lane(TS_ONLY, B),
        }[command]
        with pytest.raises(UnknownLaneError) as refused:
            await act()
        assert repr(TS_ONLY) in str(refused.value)
        assert str(refused.value).count(". ") <= 1
        assert not await client.lane_known(TS_ONLY)
        assert (
            await sql(
                database_url, f"select count(*) from {SCHEMA}.releases where queue = $1", queue
            )
            == 0
        )
        assert [v.queue for v in await client.lanes()] == [QB]
        assert await work_once(rt) == []
    (run,) = await ts.task_runs(database_url, queue, task_id)
    assert (run["state"], run["claimed_by"]) == ("pending", None)


async def test_prune_keeps_a_lane_whose_queue_holds_a_foreign_task(database_url: str) -> None:
    """A pending TS task on a retired, drained lane's queue: kept until the task ends."""
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app_with_sandbox(), A) as rt,
    ):
        mine = await client.submit("plain")
        assert await work_once(rt) == ["completed"]
        task_id = await ts.spawn(database_url, QA)
        await client.retire_release(A)
        await retired_long_ago(database_url, QA)
        (view,) = await client.lanes()
        # Never a blocker; a drained lane's are named by prune (keptBusy), not counted here.
        assert (view.status, view.foreign_tasks) == ("drained", 0)
        assert await client.prune_lanes(0, dry_run=True) == []
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_busy(0) == [QA]
        assert await queue_exists(database_url, QA)
        (run,) = await ts.task_runs(database_url, QA, task_id)
        assert (run["state"], run["task_state"]) == ("pending", "pending")
        # Its owner finishes it: the queue is still the TS app's too (its history,
        # the queue it spawns on), so the lane is kept, named apart from busy ones.
        (claimed,) = await ts.claim(database_url, QA)
        await ts.complete(database_url, QA, claimed["run_id"])
        assert await client.prune_lanes(0, dry_run=True) == []
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_busy(0) == []
        assert await client.prune_kept_foreign(0) == [QA]
        assert await queue_exists(database_url, QA)
        (run,) = await ts.task_runs(database_url, QA, task_id)
        assert (run["state"], run["task_state"]) == ("completed", "completed")
        await ts.spawn(database_url, QA)  # the TS app's next spawn finds its queue
        assert (await client.status(mine.run_id)).status == "completed"


async def test_prune_keeps_a_lane_whose_queue_holds_only_finished_foreign_tasks(
    database_url: str,
) -> None:
    """Retired with --force, the TS app's finished task alone: kept, until the engine cleans it.

    Before, `lanes prune` dropped the queue with the TS app's history, and its next
    spawn_task failed: relation "absurd.t_<queue>" does not exist.
    """
    queue = queue_of(TS_REL)
    async with open_client(database_url, env_of(B)) as client:
        task_id = await ts.spawn(database_url, queue)
        (claimed,) = await ts.claim(database_url, queue)
        await ts.complete(database_url, queue, claimed["run_id"])
        await client.retire_release(TS_REL, force=True)
        await retired_long_ago(database_url, queue)
        assert await client.prune_lanes(0, dry_run=True) == []
        assert await client.prune_lanes(0) == []
        assert (await client.prune_kept_busy(0), await client.prune_kept_foreign(0)) == (
            [],
            [queue],
        )
        assert await queue_exists(database_url, queue)
        await ts.spawn(database_url, queue)  # no "relation ... does not exist"
        # Once the engine's cleanup has removed the TS app's tasks, the lane goes.
        await sql(database_url, f'delete from absurd."r_{queue}"')
        await sql(database_url, f'delete from absurd."t_{queue}"')
        assert await client.prune_kept_foreign(0) == []
        assert await client.prune_lanes(0) == [queue]
        assert not await queue_exists(database_url, queue)
    assert task_id is not None


async def test_prune_keeps_a_lane_whose_sandbox_cleanup_is_pending(database_url: str) -> None:
    """A run's cleanup waits on its retired lane: the queue is not dropped with it."""
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app_with_sandbox(), A) as rt,
    ):
        run = await client.submit("boxed")
        assert await work_once(rt) == ["completed"]  # no Daytona here: the cleanup waits
        await client.retire_release(A)
        await retired_long_ago(database_url, QA)
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_busy(0) == [QA]
        assert await queue_exists(database_url, QA)
        pending = await sql(
            database_url,
            f"select count(*) from {SCHEMA}.run_sandboxes where run_id = $1::uuid"
            " and cleanup = 'pending'",
            run.run_id,
        )
        assert pending == 1
        (view,) = await client.lanes()
        assert (view.cleanups_pending, view.foreign_tasks) == (1, 0)


async def test_lanes_counts_foreign_tasks_per_queue_and_says_what_they_are(
    database_url: str,
) -> None:
    """Two TS tasks beside a lane-worker run: counted apart, the run's counts unchanged."""
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app_with_sandbox(), A),
        open_runtime(database_url, app_with_sandbox(), B),
    ):
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        await client.submit("plain")
        await ts.spawn(database_url, QA)
        await ts.spawn(database_url, QA, "play-run", {"runId": "not-ours"})
        await ts.spawn(database_url, "ts_jobs")  # the TS app's own queue: not a lane
        views = {v.queue: v for v in await client.lanes()}
    assert set(views) == {QA, QB}
    assert (views[QA].foreign_tasks, views[QA].queued) == (2, 1)
    assert views[QB].foreign_tasks == 0
    lines = lanes_table(list(views.values()))
    assert f"{A}: 2 unfinished task(s) on {QA} were not created by lane-worker" in "\n".join(lines)
