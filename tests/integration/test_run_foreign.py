"""Tasks of another system on a lane queue (the TypeScript app's): left for their owner.

When release ids coincide (a dev `runs` lane, one worktree suffix, one deploy
version for both) the TS app spawns its tasks on the queue lane-worker claims.
This build's claim never picks them (claim_v1.sql); one that still reaches the
worker (the engine's own claim, as an older build of the release used, or a race)
is put back without spending an attempt, never cancelled, failed or run, and
said once per queue.
"""

from __future__ import annotations

import uuid

import pytest
import structlog

from support import typescript as ts
from support.daytona import FakeDaytona
from support.db import execute
from support.runtime import env_of, open_client, open_runtime, queue_of, work_once
from worker import App, TaskContext
from worker.db.engine import ClaimedRun
from worker.run.execute import Runtime
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
async def test_a_foreign_task_is_never_claimed_and_its_owner_runs_it(
    database_url: str, name: str, params: dict[str, str]
) -> None:
    """Never claimed, cancelled, failed or run; the owner claims it as attempt 1."""
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
        assert outcomes == ["completed"]
        assert (await client.status(mine.run_id)).status == "completed"
        (run,) = await ts.task_runs(database_url, QA, task_id)
        # Never touched: the same engine run, attempt 1, no holder, due now.
        assert (run["attempt"], run["state"], run["claimed_by"], run["later"]) == (
            1,
            "pending",
            None,
            False,
        )
        assert run["task_state"] == "pending"
        assert [e["event"] for e in logs if e["event"].startswith("run.")] == [
            "run.started",
            "run.completed",
        ]
        # Its owner's worker takes it at once, as its first attempt, and completes it.
        got = await ts.claim(database_url, QA)
        assert [(r["task_id"], r["attempt"]) for r in got] == [(task_id, 1)]
        await ts.complete(database_url, QA, got[0]["run_id"])
        (done,) = await ts.task_runs(database_url, QA, task_id)
        assert (done["state"], done["task_state"], done["claimed_by"]) == (
            "completed",
            "completed",
            ts.TS_WORKER,
        )
        assert fake.deletes == {}  # the TS app's sandbox is the TS app's to delete


async def test_foreign_tasks_that_reach_the_worker_are_put_back_logged_once_and_backed_off(
    database_url: str,
) -> None:
    """Handed over by the engine's claim: put back, each meeting doubling its back-off."""
    async with (
        open_client(database_url, env_of(A)),
        open_runtime(database_url, plain_app(), A) as rt,
    ):
        first = await ts.spawn(database_url, QA)
        second = await ts.spawn(database_url, QA)
        assert await work_once(rt) == []  # this build's claim leaves them alone
        with structlog.testing.capture_logs() as logs:
            assert await engine_claim_and_handle(rt) == ["deferred", "deferred"]
            # Due again: met a second time, each is put back for longer.
            await _make_due(database_url, QA)
            assert await engine_claim_and_handle(rt) == ["deferred", "deferred"]
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


async def engine_claim_and_handle(rt: Runtime, qty: int = 10) -> list[str]:
    """Claim the own queue with absurd.claim_task (no store filter) and handle each run."""
    worker_id = rt.worker_id_for(rt.queue)

    async def claim(conn: object) -> list[ClaimedRun]:
        rows = await conn.fetch(  # type: ignore[attr-defined]
            "select run_id, task_id, attempt, task_name, params, max_attempts, wake_event,"
            " event_payload from absurd.claim_task($1, $2, $3, $4)",
            rt.queue,
            worker_id,
            rt.lease_s,
            qty,
        )
        return [ClaimedRun(queue=rt.queue, **dict(r)) for r in rows]

    claimed = await rt.db.run(claim)
    return [(await rt.handle(run)).outcome for run in claimed]
