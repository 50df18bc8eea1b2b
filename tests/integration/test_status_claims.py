"""`status` (text and --json) and the run page number each claim once (issue 31).

The engine's attempt number repeats across a defer and a resumed park, so each
claim also gets ``claim`` (1, 2, ...); a deferral shows its reason, each claim
its machine; a finished durable sleep is listed with the steps as an event's
wait is; the run page shows the run's input.
"""

from __future__ import annotations

import json
import uuid

from support.cli import lane_worker
from support.db import sql, wake_nap
from support.plays import QA, A, RemedyPlays, narrow_app, remedies_app, two_lanes
from support.runtime import SCHEMA, open_runtime, register_worker, work_once
from worker.daemon.run_page import render_run
from worker.db.pool import Connection
from worker.ops.run_view import RunView, read_run

MACHINE = "m-7811"


async def test_claims_numbered_once_with_reason_machine_and_sleeps(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    app = remedies_app(remedy_plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, narrow_app(), A, worker_base="test-rel-a-narrow") as narrow,
    ):
        await register_worker(narrow)
        await sql(
            database_url,
            f"update {SCHEMA}.workers set machine_id = $2 where worker_id = $1",
            rt_a.worker_base,
            MACHINE,
        )
        run = await client.submit("napper", {"seconds": 3600, "who": "<i>me</i>"})
        assert await work_once(narrow) == ["deferred"]
        assert await work_once(rt_a) == ["parked"]
        await wake_nap(database_url, QA, run.run_id)
        assert await work_once(rt_a) == ["completed"]

        said = await lane_worker(database_url, "status", run.run_id, "--json")
        assert said.returncode == 0, said.stderr
        attempts = json.loads(said.stdout)["attempts"]
        # The engine's number stays as it was (1, three times); each claim has its own.
        assert [(a["claim"], a["attempt"]) for a in attempts] == [(1, 1), (2, 1), (3, 1)]
        assert [a["outcome"] for a in attempts] == ["deferred", "parked", "completed"]
        reason = attempts[0]["error"]["reason"]
        assert "is not registered in this app of release rel-a" in reason, reason
        assert [a["machineId"] for a in attempts] == [None, MACHINE, MACHINE]
        assert all(a["claimedAt"] and a["finishedAt"] for a in attempts)
        steps = json.loads(said.stdout)["steps"]
        [nap] = [s for s in steps if s["name"] == "sleep:nap"]
        assert (nap["releaseId"], nap["attempt"], nap["workerId"]) == ("rel-a", 1, "test-rel-a")
        assert {s["name"] for s in steps} == {"step:first", "sleep:nap", "step:second"}

        text = await lane_worker(database_url, "status", run.run_id)
        assert text.returncode == 0, text.stderr
        lines = [" ".join(line.split()) for line in text.stdout.splitlines()]
        assert "claim 1 defer by test-rel-a-narrow (release rel-a) -> deferred" in lines, lines
        assert f"reason {reason}" in lines, lines
        own = f"own by test-rel-a (release rel-a, machine {MACHINE})"
        assert f"claim 2 attempt 1: {own} -> parked" in lines, lines
        assert f"claim 3 attempt 1: {own} -> completed" in lines, lines
        assert "wait sleep:nap committed by release rel-a (attempt 1)" in lines, lines

        store = client.store

        async def read(conn: Connection) -> RunView | None:
            return await read_run(conn, store, uuid.UUID(run.run_id))

        view = await client.db.run(read)
        assert view is not None
        page = render_run(view)
        assert "&lt;i&gt;me&lt;/i&gt;" in page  # the input, as text
        assert "<i>me" not in page
        assert f"<td><code>{MACHINE}</code></td><td>1</td>" in page
        assert "is not registered in this app of release rel-a" in page
        assert "<code>sleep:nap</code>" in page
