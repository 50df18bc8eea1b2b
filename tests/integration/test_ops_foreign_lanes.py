"""Operator commands beside another system's queues and tasks (issue 29 §2), on real Postgres.

The TypeScript app creates engine queues of its own and spawns tasks on lane
queues when release ids coincide. `lanes retire/activate/move/show` act only on
lanes lane-worker registered (a lane row, or its runs); `lanes prune` never drops
a queue that holds any unfinished task (another system's, a sandbox cleanup) nor
one that holds another system's task at all, finished or not, nor one it did not
create (migration 0024's record); `lanes --json` counts the tasks on a lane's
queue that lane-worker did not create.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from support import typescript as ts
from support.db import fetch, sql
from support.runtime import (
    SCHEMA,
    env_of,
    open_client,
    open_runtime,
    queue_of,
    work_once,
)
from worker import App, TaskContext
from worker.client import LaneClient
from worker.config.settings import Settings
from worker.daemon.boot import install_and_register
from worker.db import schema
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.errors import UnknownLaneError
from worker.ops.lanes_text import lanes_table

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


async def test_prune_keeps_a_queue_with_the_apps_task_naming_a_run_of_ours(
    database_url: str,
) -> None:
    """Only a ``play-run`` task is lane-worker's by its params' runId, as in cleanup.

    The TS app's finished `ts-notify-slack` task names a lane-worker run in its
    params; the queue is lane-worker's by record, but dropping it would drop the
    app's task: kept as foreign.
    """
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app_with_sandbox(), A) as rt,
    ):
        mine = await client.submit("plain")
        assert await work_once(rt) == ["completed"]
        notify = await ts.spawn(database_url, QA, "ts-notify-slack", {"runId": mine.run_id})
        (claimed,) = await ts.claim(database_url, QA)
        assert claimed["task_id"] == notify
        await ts.complete(database_url, QA, claimed["run_id"])
        await client.retire_release(A)
        await retired_long_ago(database_url, QA)
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_foreign(0) == [QA]
        assert await queue_exists(database_url, QA)


async def recorded_queues(database_url: str) -> list[tuple[str, bool]]:
    """The engine queues the store recorded creating (migration 0024), with ``legacy``."""
    rows = await fetch(
        database_url, f"select queue, legacy from {SCHEMA}.created_queues order by queue"
    )
    return [(r["queue"], r["legacy"]) for r in rows]


async def ts_history_ran_and_was_cleaned(database_url: str, queue: str) -> None:
    """The TS app creates ``queue``, runs a task there, then its own cleanup removes it."""
    await ts.spawn(database_url, queue)
    (claimed,) = await ts.claim(database_url, queue)
    await ts.complete(database_url, queue, claimed["run_id"])
    # The engine's cleanup (the app's policy) deletes finished tasks with their runs.
    await sql(database_url, f'delete from absurd."r_{queue}"')
    await sql(database_url, f'delete from absurd."t_{queue}"')


async def by_force(client: LaneClient, database_url: str, release: str) -> None:
    """`lanes retire <rel> --force` names the queue in a lane row."""
    await client.retire_release(release, force=True)


async def by_a_worker(client: LaneClient, database_url: str, release: str) -> None:
    """A worker of the release boots (the daemon's install_and_register), then `lanes retire`."""
    settings = Settings.from_env({
        "WORKFLOW_RUNTIME_POSTGRES": database_url,
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": release,
    })  # fmt: skip
    db = await Database.open(PoolOptions(url=database_url, max_size=1, retry_for_s=5))
    try:
        await install_and_register(db, Store(SCHEMA), settings)
    finally:
        await db.close()
    await client.retire_release(release)


@pytest.mark.parametrize("registered", [by_force, by_a_worker], ids=["retire_force", "worker"])
async def test_prune_never_drops_a_queue_the_typescript_app_created(
    database_url: str, registered: Callable[[LaneClient, str, str], Awaitable[None]]
) -> None:
    """A lane row on the TS app's queue, drained, the app's tasks gone: the queue stays.

    Before, `lanes prune` dropped it once the app's own cleanup had removed its
    finished tasks, and the app's next spawn_task failed: relation
    "absurd.t_<queue>" does not exist. The lane is kept, named as keptNotOurs,
    and not marked pruned (its queue is there).
    """
    queue = queue_of(TS_REL)
    async with open_client(database_url, env_of(B)) as client:
        await ts_history_ran_and_was_cleaned(database_url, queue)
        await registered(client, database_url, TS_REL)
        await retired_long_ago(database_url, queue)
        assert await client.prune_lanes(0, dry_run=True) == []
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_not_ours(0) == [queue]
        # Named once, as not lane-worker's: neither busy nor holding a foreign task.
        assert (await client.prune_kept_busy(0), await client.prune_kept_foreign(0)) == ([], [])
        assert await queue_exists(database_url, queue)
        assert (await client.lane(TS_REL)).pruned is False
        assert await recorded_queues(database_url) == []
        await ts.spawn(database_url, queue)  # no "relation ... does not exist"
        # A task of the app there again: still not lane-worker's, whatever it holds.
        assert await client.prune_kept_not_ours(0) == [queue]
        assert await client.prune_kept_busy(0) == []


async def test_prune_drops_a_queue_lane_worker_created_and_forgets_it(database_url: str) -> None:
    """Recorded by each way lane-worker creates a queue; pruned as before, the record with it.

    A queue of the same name the TS app makes afterwards is the app's: never pruned.
    """
    forced, submitted = queue_of(TS_REL), queue_of(A)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app_with_sandbox(), A) as rt,
    ):
        await client.retire_release(TS_REL, force=True)  # the client's engine.ensure_queue
        await sql(database_url, f"select {SCHEMA}.ensure_lane_queue($1)", submitted)  # SQL API
        assert await recorded_queues(database_url) == [(submitted, False), (forced, False)]
        await client.submit("plain")
        assert await work_once(rt) == ["completed"]
        await client.retire_release(A)
        for queue in (forced, submitted):
            await retired_long_ago(database_url, queue)
        assert sorted(await client.prune_lanes(0)) == sorted([forced, submitted])
        assert not await queue_exists(database_url, forced)
        assert not await queue_exists(database_url, submitted)
        assert await recorded_queues(database_url) == []
        # `lanes activate` makes the queue again: lane-worker's again, prunable again.
        await client.activate_release(A)
        assert await recorded_queues(database_url) == [(submitted, False)]
        await client.retire_release(A)
        await retired_long_ago(database_url, submitted)
        assert await client.prune_lanes(0) == [submitted]
        # The app makes the pruned lane's queue anew (release ids coincide), and the
        # lane claims again (a rollback): the queue is the app's, kept.
        await ts_history_ran_and_was_cleaned(database_url, forced)
        await client.activate_release(TS_REL)
        await client.retire_release(TS_REL)
        await retired_long_ago(database_url, forced)
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_not_ours(0) == [forced]
        assert await queue_exists(database_url, forced)


async def test_prune_keeps_a_recorded_name_another_system_made_again(database_url: str) -> None:
    """lane-worker's queue dropped by other means (absurdctl, an older build's prune), then
    made again by the TS app: a new queue, not the recorded one (its creation time): kept."""
    queue = queue_of(TS_REL)
    async with open_client(database_url, env_of(B)) as client:
        await client.retire_release(TS_REL, force=True)
        assert await recorded_queues(database_url) == [(queue, False)]
        await sql(database_url, "select absurd.drop_queue($1)", queue)
        await ts_history_ran_and_was_cleaned(database_url, queue)
        await retired_long_ago(database_url, queue)
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_not_ours(0) == [queue]
        assert await queue_exists(database_url, queue)


async def test_lanes_from_before_the_record_are_grandfathered(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 0024 records every existing queue a lane row or a run names (legacy): pruned
    as before.

    A store at 0023 (a build before the record) holds: a lane with the queue that
    build created, a queue only the SQL API's submit created (a run, no lane row),
    the TS app's queue with no lane row, a lane whose queue is gone.
    """
    url = empty_database_url
    old, ts_queue, gone = queue_of(A), queue_of(TS_REL), queue_of("rel-gone")
    submitted = queue_of(B)
    every = schema.known_migrations()
    before = [m for m in every if m.version < 24]
    monkeypatch.setattr(schema, "known_migrations", lambda: before)
    async with open_client(url, env_of(B)) as client:
        await client.db.run(lambda c: c.execute("select absurd.create_queue($1)", old))
        await ts_history_ran_and_was_cleaned(url, ts_queue)
        for queue, release in ((old, A), (gone, "rel-gone")):
            # As that build registered a lane (this build's statement needs migration 0030).
            await sql(
                url,
                f"insert into {SCHEMA}.releases (queue, status, release_ids)"
                " values ($1, 'claiming', array[$2::text])",
                queue,
                release,
            )
        run_id = await sql(
            url, f"select ({SCHEMA}.submit_run('plain', '{{}}'::jsonb, $1))->>'runId'", B
        )
        await sql(url, f"select {SCHEMA}.cancel_run($1::uuid)", run_id)
    assert await sql(url, f"select to_regclass('{SCHEMA}.created_queues')") is None
    monkeypatch.setattr(schema, "known_migrations", lambda: every)
    async with open_client(url, env_of(B)) as client:
        assert await recorded_queues(url) == [(old, True), (submitted, True)]
        await client.retire_release(A)
        await client.retire_release(B)  # known by its run
        await client.retire_release(TS_REL, force=True)  # a lane row after the migration
        for queue in (old, submitted, ts_queue):
            await retired_long_ago(url, queue)
        assert sorted(await client.prune_lanes(0)) == sorted([old, submitted])
        assert await client.prune_kept_not_ours(0) == [ts_queue]
        assert not await queue_exists(url, old)
        assert not await queue_exists(url, submitted)
        assert await queue_exists(url, ts_queue)
        assert await recorded_queues(url) == []


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
