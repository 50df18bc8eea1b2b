"""Each live worker's build and claim health, as its heartbeat writes them and the report reads.

An older build's heartbeat names its columns and writes no version (store
migration 0021 is additive): it still works, and the report says "before
0.2.0". A lane whose only live worker does not claim is not "claiming with a
live worker": its work is stranded, and the remedies say why.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg

from support.report import remedies
from support.runtime import SCHEMA, connect, open_client
from worker.daemon import page
from worker.db.store import Store
from worker.ops.lanes_text import lane_detail, lanes_table
from worker.version import VERSION

A = "rel-a"
QA = "runs_rel_a"
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A}
FAILING = {"queue": QA, "loop": "own", "failingForSeconds": 42.0, "failures": 6,
           "reason": "RaiseError: unknown claim mode all"}  # fmt: skip


async def old_build_beat(conn: asyncpg.Connection[Any], worker_id: str) -> None:
    """The heartbeat of a build before 0.2.0 (migration 0012's columns, no version)."""
    await conn.execute(
        f"insert into {SCHEMA}.workers as w (worker_id, release_id, queue, hostname, pid,"
        " concurrency, plays, machine_id, ready_at) values ($1, $2, $3, 'old', 1, 8, $4, 'm-old',"
        " now()) on conflict (worker_id) do update set heartbeat_at = now(), stopped_at = null,"
        " plays = excluded.plays, machine_id = excluded.machine_id,"
        " ready_at = coalesce(w.ready_at, excluded.ready_at)",
        worker_id, A, QA, ["plain"],
    )  # fmt: skip


async def beat(
    conn: asyncpg.Connection[Any], worker_id: str, not_claiming: list[dict[str, Any]]
) -> None:
    """This build's heartbeat, with the loops that do not claim."""
    await Store(SCHEMA).lanes.heartbeat(
        conn, worker_id=worker_id, release_id=A, queue=QA, hostname="new", pid=2,
        concurrency=8, plays=["plain"], machine_id="m-new", ready=True, version=VERSION,
        not_claiming=not_claiming,
    )  # fmt: skip


async def test_each_worker_shows_its_build_and_an_older_builds_beat_still_works(
    database_url: str,
) -> None:
    """`lanes --json`, `lanes show`, the page and `releases --json` name each worker's build."""
    conn = await connect(database_url)
    try:
        async with open_client(database_url, ENV_A) as client:
            await client.releases.deploy(A, image="app:1", machines=2)
            await client.activate_release(A, force=True)
            await old_build_beat(conn, "old-worker")
            await old_build_beat(conn, "old-worker")  # its upsert too
            await beat(conn, "new-worker", [])
            [view] = [v for v in await client.lanes() if v.queue == QA]
            workers = {w["workerId"]: w for w in view.as_json()["workers"]}
            assert workers["old-worker"] == {
                "workerId": "old-worker", "plays": ["plain"], "machineId": "m-old",
                "version": None, "claiming": None, "claimHealth": "unknown", "notClaiming": [],
            }  # fmt: skip
            assert workers["new-worker"]["claimHealth"] == "claiming"
            assert (view.claiming_workers, view.unknown_workers) == (1, 1)
            assert workers["new-worker"]["version"] == VERSION
            assert workers["new-worker"]["machineId"] == "m-new"
            detail = "\n".join(lane_detail(view))
            assert "build before 0.2.0; plays: plain; claim health unknown" in detail
            assert f"build {VERSION}; plays: plain" in detail
            html = page.render([view])
            assert 'data-worker="old-worker" data-version="" data-claiming="unknown"' in html
            assert f'data-worker="new-worker" data-version="{VERSION}"' in html
            assert '<span data-field="version">before 0.2.0</span>' in html
            releases, _ = await client.releases.list()
            [mine] = [r.as_json() for r in releases if r.release_id == A]
            assert mine["builds"] == {VERSION: 1, "before 0.2.0": 1}
            assert (mine["liveWorkers"], mine["readyWorkers"]) == (2, 2)
            # A worker whose claims keep failing is not ready for the scaler either.
            await beat(conn, "new-worker", [FAILING])
            releases, _ = await client.releases.list()
            [mine] = [r.as_json() for r in releases if r.release_id == A]
            assert (mine["liveWorkers"], mine["readyWorkers"]) == (2, 1)
            [deployed] = await client.db.run(Store(SCHEMA).registry.deployments)
            assert deployed.ready_machines == ["m-old"]
    finally:
        await conn.close()


async def test_a_lane_whose_only_live_worker_does_not_claim_is_stranded_and_says_why(
    database_url: str,
) -> None:
    """Claiming or draining, its runs wait for a claim that keeps failing: the report says so."""
    conn = await connect(database_url)
    try:
        async with open_client(database_url, ENV_A) as client:
            await client.activate_release(A, force=True)
            run = await client.submit("plain")
            await beat(conn, "stuck-worker", [FAILING])
            [view] = [v for v in await client.lanes() if v.queue == QA]
            lane = view.as_json()
            assert (lane["status"], lane["liveWorkers"], lane["claimingWorkers"]) == (
                "claiming", 1, 0,
            )  # fmt: skip
            assert lane["stranded"] is True
            [worker] = lane["workers"]
            assert worker["claiming"] is False
            [said] = worker["notClaiming"]
            assert {k: said[k] for k in ("queue", "loop", "failures", "reason")} == {
                k: FAILING[k] for k in ("queue", "loop", "failures", "reason")
            }
            assert said["failingForSeconds"] >= 42  # `since` is kept on the database's clock
            assert "not claiming" in remedies(lane)["fresh"]
            table = "\n".join(lanes_table([view]))
            assert "worker stuck-worker (" + VERSION + ") is not claiming: own loop on " in table
            assert "unknown claim mode all" in table
            html = page.render([view])
            assert "stranded: no live worker claims" in html
            assert 'data-claiming="no"' in html

            await client.retire_release(A)
            [view] = [v for v in await client.lanes() if v.queue == QA]
            lane = view.as_json()
            assert (lane["status"], lane["stranded"]) == ("draining", True)
            remedy = remedies(lane)["fresh"]
            assert "not claiming" in remedy
            assert "will run them" not in remedy
            assert run.run_id in [i for b in lane["blockedBy"] for i in b["runIds"]]

            await beat(conn, "stuck-worker", [])  # a claim succeeded again
            [view] = [v for v in await client.lanes() if v.queue == QA]
            lane = view.as_json()
            assert (lane["claimingWorkers"], lane["stranded"]) == (1, False)
            assert "will run them" in remedies(lane)["fresh"]

            # A claiming lane with nothing open whose worker cannot claim: not stranded, but
            # the page says nothing would run there.
            await client.activate_release(A)
            await client.remedies.fail_run(run.run_id, "done with it")
            await beat(conn, "stuck-worker", [FAILING])
            [view] = [v for v in await client.lanes() if v.queue == QA]
            assert (view.status, view.stranded, view.claiming_workers) == ("claiming", False, 0)
            assert 'data-field="noClaims">no live worker claims</span>' in page.render([view])
    finally:
        await conn.close()


def queued_for(remedy: str) -> int:
    """The seconds a claimHealthUnknown blocker says its oldest run has been queued."""
    found = re.search(r"runs queued for (\d+) s", remedy)
    assert found is not None, remedy
    return int(found.group(1))


async def test_a_lane_whose_only_live_worker_is_an_older_build_says_its_claim_health_is_unknown(
    database_url: str,
) -> None:
    """A build before 0.2.0 reports no claim health: never shown as claiming (issue 29).

    Its claims may fail for good (`unknown claim mode "all"` after a newer build's
    install) and nothing in its row would say so. The lane is not called stranded
    (the worker may well claim), but fresh runs queued a minute on the database's
    clock are a blocker, shown on a claiming lane too, until a worker known to claim
    is live.
    """
    conn = await connect(database_url)
    try:
        async with open_client(database_url, ENV_A) as client:
            await client.activate_release(A, force=True)
            first = await client.submit("plain")
            second = await client.submit("plain")
            await old_build_beat(conn, "old-worker")

            async def lane_a() -> Any:
                [view] = [v for v in await client.lanes() if v.queue == QA]
                return view

            view = await lane_a()
            lane = view.as_json()
            [worker] = lane["workers"]
            assert (worker["version"], worker["claiming"], worker["claimHealth"]) == (
                None, None, "unknown",
            )  # fmt: skip
            assert (lane["status"], lane["liveWorkers"], lane["claimingWorkers"]) == (
                "claiming", 1, 0,
            )  # fmt: skip
            assert (lane["claimHealthUnknownWorkers"], lane["stranded"]) == (1, False)
            # Just submitted: a worker that claims would take them within its poll.
            assert "claimHealthUnknown" not in [b["reason"] for b in lane["blockedBy"]]
            table = "\n".join(lanes_table([view]))
            assert "rel-a: 1 of its 1 live worker(s) run lane-worker before 0.2.0" in table
            assert "is not claiming" not in table
            html = page.render([view])
            assert 'data-claiming="unknown"' in html
            assert 'data-field="claimHealthUnknown">no live worker known to claim' in html
            assert "data-reason" not in html

            # The first run has waited 90 s on the database's clock.
            await conn.execute(
                f"update {SCHEMA}.runs set created_at = now() - interval '90 seconds'"
                " where run_id = $1",
                first.run_id,
            )
            view = await lane_a()
            lane = view.as_json()
            [blocker] = [b for b in lane["blockedBy"] if b["reason"] == "claimHealthUnknown"]
            assert blocker["count"] == 2
            assert blocker["runIds"] == [first.run_id, second.run_id]  # oldest first
            assert queued_for(blocker["remedy"]) >= 90
            assert "(before 0.2.0) cannot say whether they claim" in blocker["remedy"]
            assert "lane-worker lanes move rel-a --to RELEASE" in blocker["remedy"]
            assert (lane["status"], lane["stranded"]) == ("claiming", False)
            table = "\n".join(lanes_table([view]))
            assert "rel-a: blocked by claimHealthUnknown (2): runs queued for" in table
            assert "blocked by claiming" not in table  # its other blockers stay unlisted
            detail = "\n".join(lane_detail(view))
            assert f"  runs: {first.run_id} {second.run_id}" in detail
            html = page.render([view])
            assert '<li data-reason="claimHealthUnknown"><b>claimHealthUnknown</b> (2): ' in html
            assert 'data-reason="claiming"' not in html

            # Retired, the lane drains with the same word: not stranded, runs waiting long.
            await client.retire_release(A)
            lane = (await lane_a()).as_json()
            assert (lane["status"], lane["stranded"]) == ("draining", False)
            reasons = [b["reason"] for b in lane["blockedBy"]]
            assert reasons == ["fresh", "claimHealthUnknown"]

            # A worker of this build that claims is live beside it: nothing unknown to say.
            await beat(conn, "new-worker", [])
            view = await lane_a()
            lane = view.as_json()
            assert (lane["claimingWorkers"], lane["claimHealthUnknownWorkers"]) == (1, 1)
            assert [b["reason"] for b in lane["blockedBy"]] == ["fresh"]
            assert "before 0.2.0, which does not report" not in "\n".join(lanes_table([view]))
            assert 'data-field="claimHealthUnknown"' not in page.render([view])
    finally:
        await conn.close()
