"""The maintenance pass against real Postgres: one bad queue never stops the others,
and cleanup deletes only what lane-worker created."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from structlog.testing import capture_logs

from support import typescript as ts
from support.db import execute, fetch, sql
from support.runtime import SCHEMA, env_of, open_client, open_runtime, register_worker
from worker import App, TaskContext
from worker.client import LaneClient, RunReport
from worker.daemon import maintenance
from worker.daemon.maintenance import Rotation, maintain
from worker.metrics import Metrics

GOOD_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-a"}
GOOD_QUEUE = "runs_rel_a"
# Sorts before the good queue, so a pass that stops at the first failure never reaches it.
BAD_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "old"}
BAD_QUEUE = "runs_old"


async def register(client: LaneClient, queue: str, release_id: str) -> None:
    """Register a claiming lane, as a worker's boot does."""
    await client.db.run(
        lambda c: client.store.lanes.register(c, queue=queue, release_id=release_id)
    )


async def cancel_in_engine_only(database_url: str, client: LaneClient, run_id: str) -> None:
    """End a run's engine task behind the store's back, as a cancellation policy would."""
    await sql(
        database_url,
        f"select absurd.cancel_task(queue, task_id) from {SCHEMA}.runs where run_id = $1::uuid",
        run_id,
    )
    assert (await client.status(run_id)).status == "queued"


async def maintain_once(client: LaneClient) -> tuple[Metrics, list[dict[str, Any]]]:
    """Run one maintenance pass; return its metrics and the log lines it wrote."""
    metrics = Metrics()
    with capture_logs() as lines:
        assert await maintain(client.db, client.store, worker_id="test", metrics=metrics)
    return metrics, lines


def errors_of(metrics: Metrics, queue: str) -> float | None:
    """Return ``lane_worker_maintenance_errors_total`` of ``queue``."""
    return metrics.registry.get_sample_value(
        "lane_worker_maintenance_errors_total", {"queue": queue}
    )


def settled_once(status: RunReport) -> None:
    """Assert the reconciler settled an engine-cancelled run with exactly one terminal fact."""
    assert status.status == "cancelled"
    assert status.facts == ("run.cancelled",)


async def test_a_lane_without_engine_queue_does_not_stop_the_reconciler(database_url: str) -> None:
    """A lane row an older `lanes retire <typo>` left is reported; the other lanes reconcile."""
    async with open_client(database_url, GOOD_ENV) as client:
        await sql(
            database_url,
            f"insert into {SCHEMA}.releases (queue, status, release_ids, retired_at) "
            "values ($1, 'retired', array['old'], now())",
            BAD_QUEUE,
        )
        await register(client, GOOD_QUEUE, "rel_a")
        run = await client.submit("wait")
        await cancel_in_engine_only(database_url, client, run.run_id)

        metrics, lines = await maintain_once(client)

        settled_once(await client.status(run.run_id))
    assert errors_of(metrics, BAD_QUEUE) == 1
    assert errors_of(metrics, GOOD_QUEUE) is None
    [failed] = [line for line in lines if line["event"] == "maintenance.queue_failed"]
    assert failed["queue"] == BAD_QUEUE
    assert failed["log_level"] == "error"
    assert "lanes retire old" in failed["remedy"]


async def test_a_queue_that_fails_is_counted_and_the_others_are_maintained(
    database_url: str,
) -> None:
    """An engine queue whose tables are broken fails alone: cleanup and reconcile go on."""
    async with (
        open_client(database_url, BAD_ENV) as bad,
        open_client(database_url, GOOD_ENV) as client,
    ):
        await register(bad, BAD_QUEUE, "old")
        await register(client, GOOD_QUEUE, "rel_a")
        stuck = await bad.submit("wait")
        run = await client.submit("wait")
        await cancel_in_engine_only(database_url, bad, stuck.run_id)
        await cancel_in_engine_only(database_url, client, run.run_id)
        await sql(database_url, f'alter table absurd."r_{BAD_QUEUE}" rename to broken')

        metrics, lines = await maintain_once(client)

        settled_once(await client.status(run.run_id))
        assert (await client.status(stuck.run_id)).status == "queued"
    failed = [line for line in lines if line["event"] == "maintenance.queue_failed"]
    assert [(line["queue"], line["step"]) for line in failed] == [
        (BAD_QUEUE, "cleanup"),
        (BAD_QUEUE, "reconcile"),
    ]
    assert all("UndefinedTable" in line["error"] for line in failed)
    assert errors_of(metrics, BAD_QUEUE) == 2
    assert errors_of(metrics, GOOD_QUEUE) is None


async def test_retiring_a_release_nothing_used_creates_its_engine_queue(database_url: str) -> None:
    """`lanes retire`/`activate` of a never-used release leave a lane whose engine queue exists."""
    async with open_client(database_url, GOOD_ENV) as client:
        assert not await client.lane_known("typo-1")
        retired = await client.retire_release("typo-1", force=True)
        activated = await client.activate_release("typo-2", force=True)
        for queue in (retired, activated):
            count = "select count(*) from absurd.queues where queue_name = $1"
            assert await sql(database_url, count, queue) == 1
            # Its tables exist: a pass reconciles it without an error.
            tables = "select to_regclass($1) is not null"
            assert await sql(database_url, tables, f"absurd.t_{queue}")
        metrics, lines = await maintain_once(client)
    assert not [line for line in lines if line["event"] == "maintenance.queue_failed"]
    assert errors_of(metrics, retired) is None


TS_QUEUE = "ts_only"  # the TypeScript app's own queue: no lane row, no run of this store


async def task_of(database_url: str, run_id: str) -> uuid.UUID:
    """Return the engine task of a store run."""
    task_id: uuid.UUID = await sql(
        database_url, f"select task_id from {SCHEMA}.runs where run_id = $1::uuid", run_id
    )
    return task_id


async def cancel_task(database_url: str, queue: str, task_id: uuid.UUID) -> None:
    await sql(database_url, "select absurd.cancel_task($1, $2)", queue, task_id)


async def long_ago(database_url: str, queue: str) -> None:
    """Move every end and every event of ``queue`` 31 days back: past any cleanup policy."""
    for statement in (
        f"update absurd.\"t_{queue}\" set cancelled_at = cancelled_at - interval '31 days'",
        f"update absurd.\"r_{queue}\" set completed_at = completed_at - interval '31 days', "
        "failed_at = failed_at - interval '31 days'",
        f"update absurd.\"e_{queue}\" set emitted_at = emitted_at - interval '31 days'",
    ):
        await execute(database_url, statement)


async def engine_rows(database_url: str, queue: str) -> dict[str, set[Any]]:
    """Return what ``queue``'s engine tables hold: task ids by table, and event names."""
    found: dict[str, set[Any]] = {}
    for table, column in (
        ("t", "task_id"),
        ("r", "task_id"),
        ("c", "task_id"),
        ("e", "event_name"),
    ):
        rows = await fetch(database_url, f'select {column} from absurd."{table}_{queue}"')
        found[table] = {r[column] for r in rows}
    return found


async def test_cleanup_deletes_only_what_lane_worker_created(database_url: str) -> None:
    """Another system's finished tasks and events stay, on a shared queue and on its own.

    The TypeScript app shares the lane's queue (release ids coincide) and has a
    queue of its own. Everything ended 31 days ago, past both lane-worker's
    policy (6 hours) and the engine's default (30 days): the engine's cleanup
    deleted all of it; lane-worker's pass deletes only its own.
    """
    async with open_client(database_url, GOOD_ENV) as client:
        # The TS app was there first: its task ran a step and completed.
        ts_done = await ts.spawn(database_url, GOOD_QUEUE)
        [claimed] = await ts.claim(database_url, GOOD_QUEUE)
        await sql(
            database_url,
            "select absurd.set_task_checkpoint_state($1, $2, 'step-1', $3::jsonb, $4)",
            GOOD_QUEUE, ts_done, json.dumps({"v": 1}), claimed["run_id"],
        )  # fmt: skip
        await ts.complete(database_url, GOOD_QUEUE, claimed["run_id"])
        # A play-run of the TS app: its runId is no run of this store.
        ts_play = await ts.spawn(database_url, GOOD_QUEUE, "play-run", {"runId": str(uuid.uuid4())})
        await cancel_task(database_url, GOOD_QUEUE, ts_play)
        ts_own = await ts.spawn(database_url, TS_QUEUE)
        await cancel_task(database_url, TS_QUEUE, ts_own)
        for queue, event in (
            (GOOD_QUEUE, f"evt:{uuid.uuid4()}:approved"),
            (GOOD_QUEUE, "ts-event"),
            (TS_QUEUE, "ts-event"),
        ):
            await sql(database_url, "select absurd.emit_event($1, $2, '{}'::jsonb)", queue, event)

        await register(client, GOOD_QUEUE, "rel_a")
        # lane-worker's: a cancelled run with a signal and a sandbox (its cleanup ended
        # too), and the task a `lanes move` left behind (named by its params' runId).
        done = await client.submit("wait")
        await client.signal(done.run_id, "approved", {"by": "me"})
        await sql(database_url, f"select {SCHEMA}.register_sandbox($1::uuid, 'sb-1')", done.run_id)
        assert await client.cancel(done.run_id)
        cleanup = await sql(
            database_url,
            f"select cleanup_task_id from {SCHEMA}.run_sandboxes where run_id = $1::uuid",
            done.run_id,
        )
        await cancel_task(database_url, GOOD_QUEUE, cleanup)
        moved = await client.submit("wait")
        left = await ts.spawn(database_url, GOOD_QUEUE, "play-run", {"runId": moved.run_id})
        await cancel_task(database_url, GOOD_QUEUE, left)
        for queue in (GOOD_QUEUE, TS_QUEUE):
            await long_ago(database_url, queue)
        # Ended within its policy's 6 hours: stays.
        recent = await client.submit("wait")
        assert await client.cancel(recent.run_id)
        before = await engine_rows(database_url, GOOD_QUEUE)
        ts_before = await engine_rows(database_url, TS_QUEUE)

        _, lines = await maintain_once(client)

        after = await engine_rows(database_url, GOOD_QUEUE)
        assert await engine_rows(database_url, TS_QUEUE) == ts_before
    ours = {await task_of(database_url, done.run_id), cleanup, left}
    assert ours <= before["t"]
    assert after["t"] == before["t"] - ours
    assert after["t"] >= {ts_done, ts_play, await task_of(database_url, recent.run_id)}
    assert after["r"] == before["r"] - ours
    assert after["c"] == before["c"] - ours
    assert ts_done in after["c"]
    assert after["e"] == before["e"] - {f"evt:{done.run_id}:approved"}
    assert ts_before["t"] == {ts_own}
    assert "ts-event" in ts_before["e"]
    cleaned = [line for line in lines if line["event"] == "maintenance.cleaned"]
    assert [(c["queue"], c["tasks"], c["events"]) for c in cleaned] == [(GOOD_QUEUE, 3, 1)]
    [passed] = [line for line in lines if line["event"] == "maintenance.passed"]
    assert (passed["engine_queues"], passed["own_queues"], passed["cleaned"]) == (2, 1, 1)


async def ended_hours_ago(database_url: str, queue: str, task_id: uuid.UUID, hours: float) -> None:
    """Make a cancelled task's end ``hours`` back on the engine's clock."""
    await execute(
        database_url,
        f'update absurd."t_{queue}" set cancelled_at = absurd.current_time()'
        " - make_interval(secs => $2 * 3600) where task_id = $1",
        task_id,
        hours,
    )


async def test_own_tasks_on_a_queue_the_typescript_app_created_go_after_six_hours(
    database_url: str,
) -> None:
    """lane-worker's own retention, not the queue's policy; the app's policy and tasks stay.

    The app created the lane's queue first, with the engine's default policy (30
    days). A pass deletes lane-worker's task that ended 7 hours ago (by that policy
    it would wait 30 days), keeps its task that ended 5 hours ago and the app's task
    that ended 7 hours ago, and leaves the queue's policy as the app set it.
    """
    async with open_client(database_url, GOOD_ENV) as client:
        theirs = await ts.spawn(database_url, GOOD_QUEUE)
        await cancel_task(database_url, GOOD_QUEUE, theirs)
        await register(client, GOOD_QUEUE, "rel_a")
        old, recent = await client.submit("wait"), await client.submit("wait")
        for run in (old, recent):
            assert await client.cancel(run.run_id)
        old_task, recent_task = (
            await task_of(database_url, old.run_id),
            await task_of(database_url, recent.run_id),
        )
        for task_id, hours in ((theirs, 7), (old_task, 7), (recent_task, 5)):
            await ended_hours_ago(database_url, GOOD_QUEUE, task_id, hours)

        _, lines = await maintain_once(client)

        after = await engine_rows(database_url, GOOD_QUEUE)
        policy = await fetch(
            database_url,
            "select cleanup_ttl, cleanup_limit from absurd.get_queue_policy($1)",
            GOOD_QUEUE,
        )
    assert old_task not in after["t"]
    assert {theirs, recent_task} <= after["t"]
    assert [(p["cleanup_ttl"], p["cleanup_limit"]) for p in policy] == [(timedelta(days=30), 1000)]
    cleaned = [line for line in lines if line["event"] == "maintenance.cleaned"]
    assert [(c["queue"], c["tasks"]) for c in cleaned] == [(GOOD_QUEUE, 1)]


async def submitted_by_sql(database_url: str, play: str, release: str) -> str:
    """Submit a run through the store's SQL API (no lane row: its first submit makes the queue)."""
    run_id: str = await sql(
        database_url,
        f"select ({SCHEMA}.submit_run($1, '{{}}'::jsonb, $2))->>'runId'",
        play,
        release,
    )
    return run_id


async def test_another_systems_task_naming_a_run_of_ours_stays(database_url: str) -> None:
    """Only a ``play-run`` task is lane-worker's by its params' runId; the app's notifier stays.

    The TypeScript app's `ts-notify-slack` task carries a lane-worker run's id in
    its params. The claim does not count it as lane-worker's; cleanup deleted it
    with the run's own task.
    """
    queue = "runs_x1"
    async with open_client(database_url, GOOD_ENV) as client:
        run_id = await submitted_by_sql(database_url, "demo", "x1")
        await sql(database_url, f"select {SCHEMA}.cancel_run($1::uuid)", run_id)
        notify = await ts.spawn(database_url, queue, "ts-notify-slack", {"runId": run_id})
        [claimed] = await ts.claim(database_url, queue)
        assert claimed["task_id"] == notify
        await ts.complete(database_url, queue, claimed["run_id"])
        await long_ago(database_url, queue)

        _, lines = await maintain_once(client)

        after = await engine_rows(database_url, queue)
    assert after["t"] == after["r"] == {notify}
    cleaned = [line for line in lines if line["event"] == "maintenance.cleaned"]
    assert [(c["queue"], c["tasks"]) for c in cleaned] == [(queue, 1)]


def demo_app() -> App:
    app = App()

    @app.play("demo")
    async def demo(ctx: TaskContext, params: Any) -> str:
        return "ok"

    return app


async def test_the_task_a_move_left_on_a_queue_only_the_sql_api_made_is_cleaned(
    database_url: str,
) -> None:
    """A queue lane-worker recorded creating is its own to clean, with no lane row nor run.

    The SQL API's submit made ``runs_m1`` (no lane row); `lanes move m1 --to m2`
    put the run on m2's queue and cancelled its old task on m1. Nothing named m1
    then, and that task was never cleaned.
    """
    old_queue = "runs_m1"
    async with (
        open_client(database_url, env_of("m2")) as client,
        open_runtime(database_url, demo_app(), "m2") as rt,
    ):
        run_id = await submitted_by_sql(database_url, "demo", "m1")
        old_task = await task_of(database_url, run_id)
        await client.activate_release("m2", force=True)
        await register_worker(rt)  # a live worker of m2 that runs `demo`
        report = await client.move_lane("m1", "m2")
        assert report.moved == (run_id,)
        assert await engine_rows(database_url, old_queue) == {
            "t": {old_task}, "r": {old_task}, "c": set(), "e": set()
        }  # fmt: skip
        await long_ago(database_url, old_queue)

        _, lines = await maintain_once(client)

        assert (await engine_rows(database_url, old_queue))["t"] == set()
    cleaned = [line for line in lines if line["event"] == "maintenance.cleaned"]
    assert [(c["queue"], c["tasks"]) for c in cleaned] == [(old_queue, 1)]


# -- lanes pruned by themselves (LANE_WORKER_PRUNE_AFTER) ---------------------------------


async def ended_lane(database_url: str, release: str, *, open_run: bool = False) -> str:
    """A retired lane whose only run ended (cancelled), or is still queued; return its queue."""
    async with open_client(database_url, env_of(release)) as client:
        submitted = await client.submit("plain", {})
        if not open_run:
            assert await client.cancel(submitted.run_id)
        await client.retire_release(release)
    return submitted.queue


async def retired_ago(database_url: str, queue: str, seconds: float) -> None:
    await execute(
        database_url,
        f"update {SCHEMA}.releases set retired_at = now() - make_interval(secs => $2::float8)"
        " where queue = $1",
        queue, seconds,
    )  # fmt: skip


async def pruned(database_url: str) -> set[str]:
    rows = await fetch(
        database_url, f"select queue from {SCHEMA}.releases where pruned_at is not null"
    )
    return {r["queue"] for r in rows}


async def test_maintenance_prunes_lanes_retired_longer_than_prune_after(
    database_url: str, monkeypatch: Any
) -> None:
    """Retired over LANE_WORKER_PRUNE_AFTER ago with nothing unfinished: pruned by a pass,
    a bounded number a pass. Recent, with an open run, or with the setting at 0: kept."""
    day = 86_400.0
    old_a = await ended_lane(database_url, "prn-a")
    old_b = await ended_lane(database_url, "prn-b")
    recent = await ended_lane(database_url, "prn-recent")
    busy = await ended_lane(database_url, "prn-busy", open_run=True)
    for queue in (old_a, old_b, busy):
        await retired_ago(database_url, queue, 2 * day)
    await retired_ago(database_url, recent, day - 600)
    async with open_client(database_url, GOOD_ENV) as client:
        # 0: never, whatever the lanes.
        assert await maintain(client.db, client.store, worker_id="test", prune_after_s=0.0)
        assert await pruned(database_url) == set()
        monkeypatch.setattr(maintenance, "PRUNE_CHECKS_PER_PASS", 1)
        with capture_logs() as lines:
            rotation = Rotation()
            for _ in range(3):
                assert await maintain(
                    client.db, client.store, worker_id="test", rotation=rotation,
                    prune_after_s=day,
                )  # fmt: skip
    assert await pruned(database_url) == {old_a, old_b}
    said = [line["queue"] for line in lines if line["event"] == "lane.pruned"]
    assert sorted(said) == [old_a, old_b]  # one a pass: each once
    for queue, exists in ((old_a, False), (old_b, False), (recent, True), (busy, True)):
        listed = await sql(
            database_url, "select count(*) from absurd.queues where queue_name = $1", queue
        )
        assert bool(listed) == exists, queue
    passes = [line for line in lines if line["event"] == "maintenance.passed"]
    assert [p["pruned"] for p in passes] == [1, 1, 0]
