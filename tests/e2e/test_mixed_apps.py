"""Machines of one release with different apps, with real daemons and the real CLI.

A machine whose app lacks a play leaves its runs to the machine that has it, also
runs moved onto the lane by `lanes move`; a play no machine of the lane ever
registered is waited for through LANE_WORKER_UNKNOWN_PLAY_GRACE (a hotfix that adds
it), then fails visibly (UnknownPlayError). Apps: ``support.apps.mixed`` (``lean``
and ``full``).
"""

from __future__ import annotations

from typing import Any

import pytest

from support.cli import lane_worker, lane_worker_json
from support.daemon import Daemons, queue_of
from support.db import all_ended, fetch, statuses
from support.runtime import SCHEMA, open_client

MIXED, OLD, HOTFIX = "rs3-mixed", "rs3-old", "rs3-hotfix"


@pytest.mark.timeout(150)
async def test_mixed_apps_of_one_release_run_each_play_on_the_machine_that_has_it(
    database_url: str,
) -> None:
    """M1's app lacks `only-full`; M2's has it. Every such run completes on M2, none fails.

    Before the fix, M1's own loop claimed runs of `only-full` and failed them for
    good with UnknownPlayError. Runs moved onto the lane from a retired lane go
    the same way. A play that no machine of the lane ever registered still fails
    visibly.
    """
    mixed_id = MIXED  # the lane's release id as deployed (issue 31 §1)
    mixed_q, old_q = queue_of(MIXED), queue_of(OLD)
    # Fresh runs on an old lane that no machine will serve: `lanes move` brings them over.
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": OLD}) as old_client:
        stranded = [
            (await old_client.submit("only-full", {"n": f"old-{i}", "seconds": 0.2})).run_id
            for i in range(6)
        ]
    async with Daemons(database_url) as pool:
        # M1 takes up to 8 runs at once; M2 only 2, so M1 is offered most of them.
        # No grace for a play nobody registered (the hotfix test below has one).
        m1 = pool.start(
            MIXED, name="M1", app="support.apps.mixed:lean", LANE_WORKER_UNKNOWN_PLAY_GRACE="0"
        )
        m2 = pool.start(
            MIXED,
            name="M2",
            app="support.apps.mixed:full",
            LANE_WORKER_CONCURRENCY="2",
            LANE_WORKER_UNKNOWN_PLAY_GRACE="0",
        )
        await m1.ready()
        await m2.ready()
        m1_id, m2_id = m1.worker_id, m2.worker_id
        workers = {
            row["worker_id"]: sorted(row["plays"])
            for row in await fetch(
                database_url,
                f"select worker_id, plays from {SCHEMA}.workers"
                " where queue = $1 and stopped_at is null",
                mixed_q,
            )
        }
        assert workers == {m1_id: ["common"], m2_id: ["common", "only-full"]}, workers

        retired = await lane_worker_json(database_url, "lanes", "retire", OLD)
        assert (retired["queue"], retired["status"]) == (old_q, "retired"), retired
        moved = await lane_worker_json(database_url, "lanes", "move", OLD, "--to", MIXED)
        assert sorted(moved["moved"]) == sorted(stranded), moved
        assert moved["refused"] == [], moved

        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": MIXED}) as client:
            direct = [
                (await client.submit("only-full", {"n": i, "seconds": 0.2})).run_id
                for i in range(20)
            ]
            commons = [(await client.submit("common", {"n": i})).run_id for i in range(4)]
            unknown = (await client.submit("never-registered", {"n": 0})).run_id
        runs = [*stranded, *direct]

        await all_ended(database_url, [*runs, *commons, unknown], timeout_s=60)
        found = await statuses(database_url, runs)
        not_completed = {r: s for r, s in found.items() if s != "completed"}
        assert not_completed == {}, (
            f"{len(not_completed)} of {len(runs)} runs of only-full did not complete: "
            f"{not_completed}\n{await unknown_play_failures(database_url)}"
        )
        assert set((await statuses(database_url, commons)).values()) == {"completed"}

        # No attempt anywhere failed for a play the lane has; every one that took a
        # run of only-full over (own or adopt) ran on M2.
        failures = await unknown_play_failures(database_url)
        assert [f["run_id"] for f in failures] == [unknown], failures
        every = await fetch(
            database_url,
            f"select a.run_id::text, a.worker_id, a.disposition, a.outcome"
            f"  from {SCHEMA}.attempts a join {SCHEMA}.runs r using (run_id)"
            "  where r.play = 'only-full' order by a.attempt_id",
        )
        executed = [a for a in every if a["disposition"] in ("own", "adopt")]
        elsewhere = [dict(a) for a in executed if not a["worker_id"].startswith(m2_id)]
        assert elsewhere == [], elsewhere
        assert {a["run_id"] for a in executed} == set(runs)
        assert {a["outcome"] for a in executed} == {"completed"}, [dict(a) for a in executed]
        # M1 was offered such runs (else this test proved nothing) and left each to M2.
        by_m1 = [
            (a["disposition"], a["outcome"]) for a in every if a["worker_id"].startswith(m1_id)
        ]
        assert by_m1, "M1 never claimed a run of only-full: the mixed lane was not exercised"
        assert set(by_m1) == {("defer", "deferred")}, by_m1
        # `status` counts the attempts that ran the play, not M1's put-backs (claims).
        deferred_run = next(a["run_id"] for a in every if a["worker_id"].startswith(m1_id))
        ran = sum(1 for a in executed if a["run_id"] == deferred_run)
        shown = await lane_worker(database_url, "status", deferred_run)
        [line] = [x for x in shown.stdout.splitlines() if x.startswith("attempts")]
        assert line.split()[1] == str(ran), line
        [line] = [x for x in shown.stdout.splitlines() if x.startswith("claims")]
        assert "put back without running it" in line, line
        moved_rows = await fetch(
            database_url,
            f"select distinct queue, release_id from {SCHEMA}.runs where run_id = any($1::uuid[])",
            stranded,
        )
        assert [tuple(r) for r in moved_rows] == [(mixed_q, mixed_id)]

        # The play nobody registered fails visibly, once, for good.
        async with open_client(database_url, {}) as client:
            gone = await client.status(unknown)
        assert gone.status == "failed"
        assert gone.error["name"] == "UnknownPlayError", gone.error
        assert "never-registered" in gone.error["message"], gone.error
        assert [(a.disposition, a.outcome) for a in gone.attempts][-1] == ("own", "failed")
        for daemon in (m1, m2):
            assert daemon.malformed_lines() == [], daemon.name


async def unknown_play_failures(database_url: str) -> list[dict[str, Any]]:
    """Return the attempts that failed with UnknownPlayError (run, play, worker)."""
    rows = await fetch(
        database_url,
        f"select a.run_id::text, r.play, a.worker_id from {SCHEMA}.attempts a"
        f"  join {SCHEMA}.runs r using (run_id)"
        " where a.outcome = 'failed' and a.error::text like '%UnknownPlayError%'"
        " order by a.attempt_id",
    )
    return [dict(r) for r in rows]


@pytest.mark.timeout(150)
async def test_a_hotfix_adding_a_play_loses_none_of_its_runs_to_the_old_machines(
    database_url: str,
) -> None:
    """Release R's old machine lacks the hotfix's new play; runs of it are submitted before
    the new machine boots. The old machine puts them back (no attempt spent) through the
    grace, and the new machine, once up, runs each exactly once.

    Before the fix the old machine failed each for good as an unknown play (the walk of
    2026-12-07).
    """
    queue = queue_of(HOTFIX)
    async with Daemons(database_url) as pool:
        old = pool.start(HOTFIX, name="old", app="support.apps.mixed:lean")
        await old.ready()
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": HOTFIX}) as client:
            runs = [
                (await client.submit("only-full", {"n": i, "seconds": 0})).run_id for i in range(3)
            ]
        for run_id in runs:
            said = await old.wait_for("run.deferred", run_id=run_id, timeout_s=60)
            assert "LANE_WORKER_UNKNOWN_PLAY_GRACE" in said["reason"], said
        assert set((await statuses(database_url, runs)).values()) == {"queued"}

        new = pool.start(HOTFIX, name="new", app="support.apps.mixed:full")
        await new.ready()
        # Due again now rather than at the end of the 30 s put-back: the test need not wait.
        await fetch(database_url, f"update absurd.r_{queue} set available_at = now() returning 1")
        await all_ended(database_url, runs, timeout_s=60)
        assert set((await statuses(database_url, runs)).values()) == {"completed"}
        every = await fetch(
            database_url,
            f"select a.run_id::text, a.worker_id, a.disposition, a.outcome"
            f"  from {SCHEMA}.attempts a where a.run_id = any($1::uuid[]) order by a.attempt_id",
            runs,
        )
        by_old = {
            (a["disposition"], a["outcome"])
            for a in every
            if a["worker_id"].startswith(old.worker_id)
        }
        assert by_old == {("defer", "deferred")}, [dict(a) for a in every]
        ran = [a for a in every if a["disposition"] in ("own", "adopt")]
        assert sorted(a["run_id"] for a in ran) == sorted(runs)  # each exactly once
        assert all(a["worker_id"].startswith(new.worker_id) for a in ran), ran
        async with open_client(database_url, {}) as client:
            for run_id in runs:
                assert (await client.status(run_id)).attempt_count == 1
        assert await unknown_play_failures(database_url) == []
