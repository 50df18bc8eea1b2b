"""Idle dev lanes go by themselves (issue 31 §1): retired by maintenance once no worker
of theirs was live for ``LANE_WORKER_DEV_LANE_IDLE_AFTER`` and they hold no open run,
then pruned as any retired lane (``LANE_WORKER_PRUNE_AFTER``); their worker booting
again makes them claim again.

Never a release lane, never a queue a release ever registered, never one another
system (the TypeScript app) uses; a dev lane with an open run stays.
``tests/e2e/test_dev_lanes_idle.py`` boots a real daemon on a pruned dev lane.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from support.db import execute, fetch, sql
from support.runtime import SCHEMA, open_client
from worker.client import LaneClient
from worker.daemon.boot import install_and_register
from worker.daemon.maintenance import Rotation, maintain
from worker.errors import LaneDrainedError
from worker.ops.lanes_text import lanes_table
from worker.version import VERSION

DAY = 86_400.0
WEEK = 7 * DAY


async def boot(client: LaneClient, queue: str, release_id: str) -> str:
    """Do what a worker's boot does for its lane (install_and_register); return its state."""
    settings: Any = SimpleNamespace(queue=queue, release_id=release_id)
    return str(await install_and_register(client.db, client.store, settings))


async def beat(
    client: LaneClient, queue: str, release_id: str, worker_id: str, version: str | None = VERSION
) -> None:
    """A heartbeat of worker ``worker_id``, of build ``version`` (this one's by default)."""
    await client.db.run(
        lambda c: client.store.lanes.heartbeat(
            c,
            worker_id=worker_id,
            release_id=release_id,
            queue=queue,
            hostname="h",
            pid=1,
            concurrency=1,
            plays=["plain"],
            version=version,
        )
    )


async def idle_for(database_url: str, queue: str, seconds: float) -> None:
    """Make the lane and its workers last seen ``seconds`` ago (stopped)."""
    await execute(
        database_url,
        f"update {SCHEMA}.releases set updated_at = now() - make_interval(secs => $2::float8)"
        " where queue = $1",
        queue, seconds,
    )  # fmt: skip
    await execute(
        database_url,
        f"update {SCHEMA}.workers set heartbeat_at = now() - make_interval(secs => $2::float8),"
        " stopped_at = now() - make_interval(secs => $2::float8) where queue = $1",
        queue, seconds,
    )  # fmt: skip


async def statuses(database_url: str) -> dict[str, tuple[str, bool]]:
    rows = await fetch(
        database_url,
        f"select queue, status, pruned_at is not null as pruned from {SCHEMA}.releases",
    )
    return {r["queue"]: (r["status"], r["pruned"]) for r in rows}


async def engine_has(database_url: str, queue: str) -> bool:
    return bool(
        await sql(database_url, "select count(*) from absurd.queues where queue_name = $1", queue)
    )


async def test_idle_dev_lanes_are_retired_then_pruned_and_nothing_else(
    database_url: str,
) -> None:
    async with open_client(database_url) as client:
        # A worktree deleted a week and more ago: no worker, nothing open.
        await boot(client, "runs_gone", "dev-gone")
        await beat(client, "runs_gone", "dev-gone", "w-gone")
        # The shared dev lane (`dev`), idle as long: the same rule.
        await boot(client, "runs", "dev")
        # Idle but not long enough.
        await boot(client, "runs_recent", "dev-recent")
        # Idle long, but a run waits there: kept (shown idle).
        await boot(client, "runs_busy", "dev-busy")
        busy_run = await client.submit("plain", {}, queue_suffix="busy")
        # A release lane idle as long: never by this rule.
        await boot(client, "runs_rel_old", "rel-old")
        # A queue a release and a dev suffix share (release `mixed`, suffix dev-mixed),
        # as an older build let them (this build refuses the second one's boot): never
        # by this rule.
        await boot(client, "runs_mixed", "dev-mixed")
        await sql(
            database_url,
            f"update {SCHEMA}.releases set release_ids = release_ids || 'mixed'::text"
            " where queue = 'runs_mixed'",
        )
        # The TypeScript app made the queue first: another system's, kept.
        await sql(database_url, "select absurd.create_queue('runs_ts')")
        await boot(client, "runs_ts", "dev-ts")
        # A dev lane whose worker is live, however long ago it booted: kept.
        await boot(client, "runs_live", "dev-live")
        for queue in ("runs_gone", "runs", "runs_busy", "runs_rel_old", "runs_mixed",
                      "runs_ts", "runs_live"):  # fmt: skip
            await idle_for(database_url, queue, WEEK + 60)
        await idle_for(database_url, "runs_recent", WEEK - 600)
        await beat(client, "runs_live", "dev-live", "w-live")

        # 0: never.
        assert await maintain(client.db, client.store, worker_id="t", dev_idle_after_s=0.0)
        assert {s for s, _ in (await statuses(database_url)).values()} == {"claiming"}

        with capture_logs() as lines:
            assert await maintain(
                client.db, client.store, worker_id="t", rotation=Rotation(),
                dev_idle_after_s=WEEK, prune_after_s=DAY,
            )  # fmt: skip
        said = await statuses(database_url)
        assert said["runs_gone"] == ("retired", False)
        assert said["runs"] == ("retired", False)
        for queue in ("runs_recent", "runs_busy", "runs_rel_old", "runs_mixed", "runs_ts",
                      "runs_live"):  # fmt: skip
            assert said[queue] == ("claiming", False), queue
        retired = sorted(line["queue"] for line in lines if line["event"] == "lane.dev_retired")
        assert retired == ["runs", "runs_gone"]
        passed = [line for line in lines if line["event"] == "maintenance.passed"]
        assert passed[-1]["dev_retired"] == 2

        # Retired a day ago: pruned as any retired lane (engine queue dropped, rows kept).
        await execute(
            database_url,
            f"update {SCHEMA}.releases set retired_at = now() - interval '2 days'"
            " where status = 'retired'",
        )
        assert await maintain(
            client.db, client.store, worker_id="t", dev_idle_after_s=WEEK, prune_after_s=DAY
        )
        said = await statuses(database_url)
        assert said["runs_gone"] == ("retired", True)
        assert not await engine_has(database_url, "runs_gone")
        assert await engine_has(database_url, "runs_busy")
        assert (await client.status(busy_run.run_id)).status == "queued"

        # The worktree comes back: its worker boots and its lane claims again, queue and all.
        assert await boot(client, "runs_gone", "dev-gone") == "claiming"
        assert (await statuses(database_url))["runs_gone"] == ("claiming", False)
        assert await engine_has(database_url, "runs_gone")
        created = await client.db.run(
            lambda c: client.store.lanes.queue_created_here(c, queue="runs_gone")
        )
        assert created is True  # recorded: a later prune may drop it again


async def test_a_retired_release_lane_still_refuses_boot(database_url: str) -> None:
    """Only dev lanes come back by a boot: a retired, drained release lane refuses (78)."""
    async with open_client(database_url) as client:
        await boot(client, "runs_rel_x", "rel-x")
        await client.retire_release("rel-x", force=True)
        try:
            await boot(client, "runs_rel_x", "rel-x")
        except LaneDrainedError:
            pass
        else:
            raise AssertionError("a retired release lane booted")
        assert (await statuses(database_url))["runs_rel_x"] == ("retired", False)
        # A dev lane retired by hand comes back the same way as one retired by the rule.
        await boot(client, "runs_wt", "dev-wt")
        await client.retire_release("dev-wt", force=True)
        assert await boot(client, "runs_wt", "dev-wt") == "claiming"


async def test_lanes_marks_an_idle_dev_lane_with_since_when_and_what_to_do(
    database_url: str,
) -> None:
    async with open_client(database_url) as client:
        await boot(client, "runs_wt_open", "dev-wt_open")
        await beat(client, "runs_wt_open", "dev-wt_open", "w-open")
        await client.submit("plain", {}, queue_suffix="wt_open")
        await boot(client, "runs_wt_done", "dev-wt_done")
        await boot(client, "runs_rel_y", "rel-y")
        for queue in ("runs_wt_open", "runs_wt_done", "runs_rel_y"):
            await idle_for(database_url, queue, 3 * DAY)
        await boot(client, "runs_wt_live", "dev-wt_live")
        await beat(client, "runs_wt_live", "dev-wt_live", "w-live")
        views = {v.queue: v for v in await client.lanes()}
        assert [q for q, v in views.items() if v.idle_dev] == ["runs_wt_open", "runs_wt_done"]
        assert views["runs_wt_open"].as_json()["dev"] is True
        assert views["runs_rel_y"].as_json()["dev"] is False
        seen = views["runs_wt_open"].last_seen
        assert seen is not None
        since = seen.strftime("%Y-%m-%d %H:%M UTC")
        lines = lanes_table(list(views.values()))
        assert (
            f"dev-wt_open: idle dev lane: no worker since {since}, 1 open run(s) wait on it; "
            "start its worker again (DEEPLINE_ABSURD_QUEUE_SUFFIX=wt_open), or cancel them "
            "(`lane-worker cancel RUN_ID`), then `lane-worker lanes retire dev-wt_open` and "
            "`lane-worker lanes prune --older-than 0`."
        ) in lines
        done = [line for line in lines if line.startswith("dev-wt_done: idle dev lane")]
        assert len(done) == 1
        assert "maintenance retires it once idle past LANE_WORKER_DEV_LANE_IDLE_AFTER" in done[0]
        assert not [line for line in lines if "idle dev lane" in line and "rel-y" in line]
        assert not [line for line in lines if line.startswith("dev-wt_live: idle")]


async def test_an_idle_dev_lane_whose_last_worker_is_an_older_build_is_kept(
    database_url: str,
) -> None:
    """Only a build from 0.3.0 on activates its retired dev lane at boot: a lane whose last
    worker (the one seen last) ran an older build, or recorded none (before 0.2.0), is
    never retired idle; one whose last worker is this build is, whatever came before."""
    workers = {
        "runs_old": [("w-old", "0.2.1")],
        "runs_none": [("w-none", None)],
        "runs_upgraded": [("w-was-old", "0.2.1"), ("w-now", VERSION)],
        "runs_downgraded": [("w-was-new", VERSION), ("w-back", "0.2.1")],
        "runs_later": [("w-later", "0.10.0")],
    }
    async with open_client(database_url) as client:
        for queue, beats in workers.items():
            release_id = "dev-" + queue.removeprefix("runs_")
            await boot(client, queue, release_id)
            for age, (worker_id, version) in enumerate(reversed(beats)):
                await beat(client, queue, release_id, worker_id, version)
                await execute(
                    database_url,
                    f"update {SCHEMA}.workers set heartbeat_at = now() - make_interval("
                    "secs => $2::float8), stopped_at = now() - make_interval(secs => $2::float8)"
                    " where worker_id = $1",
                    worker_id, WEEK + 60 + age,
                )  # fmt: skip
            await execute(
                database_url,
                f"update {SCHEMA}.releases set updated_at = now() - interval '8 days'"
                " where queue = $1",
                queue,
            )
        with capture_logs() as lines:
            assert await maintain(client.db, client.store, worker_id="t", dev_idle_after_s=WEEK)
        retired = sorted(line["queue"] for line in lines if line["event"] == "lane.dev_retired")
        assert retired == ["runs_later", "runs_upgraded"]
        said = await statuses(database_url)
        for queue in ("runs_old", "runs_none", "runs_downgraded"):
            assert said[queue] == ("claiming", False), queue
        # Re-checked under the lane's lock as well: asked directly, it is refused.
        assert not await client.db.run(
            lambda c: client.store.lanes.retire_idle_dev(c, queue="runs_old", idle_after_s=WEEK)
        )
