"""The maintenance pass against real Postgres: one bad queue never stops the others."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from support.db import sql
from support.runtime import SCHEMA, open_client
from worker.client import LaneClient, RunStatus
from worker.daemon.maintenance import maintain
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


def settled_once(status: RunStatus) -> None:
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
