"""`status` shows each claim's machine id whole (issue 31: a Fly machine id was cut short).

A real worker id is ``RELEASE@HOST:PID:TOKEN``; with a release id of a usual length the
claim line ran past the column's 100 characters and lost its end, the machine id.
"""

from __future__ import annotations

from typing import Any

from support.cli import lane_worker
from support.db import sql
from support.runtime import SCHEMA, open_client, open_runtime, register_worker, work_once
from worker import App, TaskContext

RELEASE = "Release-2026.12.07-hotfix-billing"
WORKER = f"{RELEASE}@ip-10-0-12-34.ec2.internal:12345:a1b2c3"
MACHINE = "148e4d55f36278"  # a Fly machine id's length


async def test_status_shows_the_machine_id_whole(database_url: str) -> None:
    app = App()

    @app.play("quick")
    async def quick(ctx: TaskContext, params: Any) -> str:
        return "ok"

    async with (
        open_client(database_url) as client,
        open_runtime(database_url, app, RELEASE, worker_base=WORKER) as rt,
    ):
        await register_worker(rt)
        await sql(
            database_url,
            f"update {SCHEMA}.workers set machine_id = $2 where worker_id = $1",
            WORKER,
            MACHINE,
        )
        run = await client.submit("quick", {}, release_id=RELEASE)
        assert await work_once(rt) == ["completed"]

    text = await lane_worker(database_url, "status", run.run_id)
    assert text.returncode == 0, text.stderr
    [claim] = [line for line in text.stdout.splitlines() if line.startswith("  claim 1")]
    assert claim.endswith(f"(release {RELEASE}, machine {MACHINE}) -> completed"), claim
