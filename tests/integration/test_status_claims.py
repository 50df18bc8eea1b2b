"""`status` (text and --json) and the run page number each claim once (issue 31).

The engine's attempt number repeats across a defer and a resumed park, so each
claim also gets ``claim`` (1, 2, ...); a deferral shows its reason, each claim
its machine; a finished durable sleep is listed with the steps as an event's
wait is; the run page shows the run's input. "attempts" means one thing everywhere
(the engine attempts spent, as max attempts counts them): a run that parks twice and
completes on its one attempt shows 1 in `status`, its --json, run_status, `runs` and
the run page, and 3 claims (issue 31 of the new user's walk: status said 3).
"""

from __future__ import annotations

import json
import uuid

from support.cli import lane_worker
from support.db import run_row, sql, wake_nap
from support.plays import QA, A, RemedyPlays, narrow_app, remedies_app, two_lanes
from support.runtime import SCHEMA, eventually, open_runtime, register_worker, work_once
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
        attempts = json.loads(said.stdout)["claims"]
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


async def test_a_run_that_parks_twice_spent_one_attempt_everywhere(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """A nap, then an event's wait, then done: one engine attempt, three claims."""
    app = remedies_app(remedy_plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        run = await client.submit("nap-then-wait")
        assert await work_once(rt_a) == ["parked"]  # the nap
        # Its wake time moved too (not only the engine's due time): a 0.3 s nap resumed
        # early would park on the nap again, and the claims below would count it.
        await wake_nap(database_url, QA, run.run_id)

        async def parked_again() -> bool:
            return "parked" in await work_once(rt_a)  # now waiting for "go"

        await eventually(parked_again, what="the run to park on its event")
        # While parked, `status` says what it waits for; a signal of another key says it
        # wakes nothing (the walk of 2026-12-07: "delivered", and the run stayed parked).
        parked = await lane_worker(database_url, "status", run.run_id)
        assert parked.returncode == 0, parked.stderr
        assert any(
            line.startswith("waits for") and line.endswith("event 'go'")
            for line in parked.stdout.splitlines()
        ), parked.stdout
        as_json = json.loads(
            (await lane_worker(database_url, "status", run.run_id, "--json")).stdout
        )
        assert as_json["waitsFor"]["kind"] == "integration_event"
        assert as_json["waitsFor"]["eventKey"] == "go"
        wrong = await lane_worker(database_url, "signal", run.run_id, "gooo")
        assert wrong.returncode == 0, wrong.stderr
        assert "The run waits for event 'go', not 'gooo': it stays parked" in wrong.stdout
        assert not (await client.signal(run.run_id, "go", {"by": "test"})).duplicate

        async def completed() -> bool:
            return "completed" in await work_once(rt_a)

        await eventually(completed, what="the run to complete")
        row = await run_row(database_url, run.run_id)
        assert (row["status"], row["attempts"]) == ("completed", 1)

        said = await lane_worker(database_url, "status", run.run_id, "--json")
        assert said.returncode == 0, said.stderr
        shown = json.loads(said.stdout)
        assert (shown["attempts"], shown["maxAttempts"]) == (1, row["max_attempts"])
        assert shown["waitsFor"] is None  # it ended
        claims = shown["claims"]
        assert [(c["claim"], c["attempt"], c["disposition"]) for c in claims] == [
            (1, 1, "own"), (2, 1, "own"), (3, 1, "own"),
        ]  # fmt: skip
        assert [c["outcome"] for c in claims] == ["parked", "parked", "completed"]

        text = await lane_worker(database_url, "status", run.run_id)
        assert text.returncode == 0, text.stderr
        lines = [" ".join(line.split()) for line in text.stdout.splitlines()]
        assert f"attempts 1 of {row['max_attempts']}" in lines, lines
        assert "claims 3 (1 began an attempt, 2 resumed after a park)" in lines, lines

        # The store's function, as an app in any language reads it.
        fn = json.loads(
            await sql(database_url, f"select {SCHEMA}.run_status($1::uuid)::text", run.run_id)
        )
        assert (fn["attemptCount"], fn["maxAttempts"], len(fn["claims"])) == (
            1, row["max_attempts"], 3,
        )  # fmt: skip
        assert fn["attempts"] == fn["claims"]  # the old name, for older builds

        listed = await lane_worker(database_url, "runs", "--json")
        assert listed.returncode == 0, listed.stderr
        [entry] = [r for r in json.loads(listed.stdout)["runs"] if r["runId"] == run.run_id]
        assert entry["attempts"] == 1

        store = client.store

        async def read(conn: Connection) -> RunView | None:
            return await read_run(conn, store, uuid.UUID(run.run_id))

        view = await client.db.run(read)
        assert view is not None
        page = render_run(view)
        assert f'<td data-field="attempts">1 of {row["max_attempts"]}</td>' in page, page
        claims_cell = '<td data-field="claims">3 (1 began an attempt, 2 resumed after a park)</td>'
        assert claims_cell in page, page
