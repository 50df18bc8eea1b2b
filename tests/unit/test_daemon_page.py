"""The lanes page's rows: what an operator must act on, and no blocker on a claiming lane."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from html import escape

from worker.daemon import page, run_page
from worker.db.store.rows import OpenRun
from worker.ops.lane_view import Blocker, LaneView

BASE = {"live_workers": 1, "queued": 0, "running": 0, "waiting": 0, "adoptable": 0}


def test_a_claiming_lane_shows_no_blocker() -> None:
    """As `lane-worker lanes` prints it: claiming is the lane's state, not a blocker to act on."""
    claiming = LaneView(
        release_id="a", queue="runs_a", status="claiming",
        blocked_by=(Blocker("claiming", 0, "retire it first"),), **BASE,
    )  # fmt: skip
    html = page.render([claiming])
    assert "data-reason" not in html
    assert "retire it first" not in html
    # The lanes page leads to the others, as /runs, /deploys and /actions do.
    assert page.NAV in html
    assert '<a href="/deploys">deploys</a>' in page.NAV


def test_a_draining_lane_shows_its_blockers_with_their_first_run_ids() -> None:
    """Each blocker with its remedy; the run ids it names, and how many more there are."""
    draining = LaneView(
        release_id="b", queue="runs_b", status="draining",
        blocked_by=(Blocker("fresh", 3, "move them", ("r1", "r2")),), **BASE,
    )  # fmt: skip
    html = page.render([draining])
    assert '<li data-reason="fresh"><b>fresh</b> (3): move them' in html
    assert "<summary>runs (first 2 of 3)</summary><code>r1</code> <code>r2</code>" in html


def test_a_pruned_lane_says_so_beside_its_status() -> None:
    """A pruned lane that open runs name again reads as such; others carry no mark."""
    pruned = LaneView(release_id="c", queue="runs_c", status="draining", pruned=True, **BASE)
    plain = LaneView(release_id="d", queue="runs_d", status="drained", **BASE)
    html = page.render([pruned, plain])
    assert html.count('data-field="pruned"') == 1
    assert '<span class="draining" data-field="status">draining</span> <span class="note" ' in html


def test_a_lane_with_another_systems_tasks_on_its_queue_counts_them_beside_its_status() -> None:
    """Tasks lane-worker did not create are shown as information, never as blockers."""
    shared = LaneView(release_id="e", queue="runs_e", status="claiming", foreign_tasks=3, **BASE)
    plain = LaneView(release_id="f", queue="runs_f", status="claiming", **BASE)
    html = page.render([shared, plain])
    assert html.count('data-field="foreignTasks"') == 1
    assert ">3 foreign task(s)</span>" in html


def test_the_current_release_its_machines_the_scaler_and_a_stranded_lane_are_marked() -> None:
    """Registry marks, live/desired machines, the scaler's word, a stranded lane, the time read."""
    as_of = datetime(2026, 12, 4, 17, 0, 5, tzinfo=UTC)
    current = LaneView(
        release_id="b", queue="runs_b", status="claiming", role="current", machines_desired=2,
        machines_live=1, scaler="created m-1", as_of=as_of, **BASE,
    )  # fmt: skip
    stranded = LaneView(
        release_id="a", queue="runs_a", status="draining", role="retired", machines_desired=1,
        as_of=as_of, **{**BASE, "live_workers": 0},
    )  # fmt: skip
    draining = LaneView(release_id="z", queue="runs_z", status="draining", as_of=as_of, **BASE)
    html = page.render([current, stranded, draining])
    assert (
        '<td data-field="releaseId">b<span class="badge" data-field="role">current</span>' in html
    )
    assert '<td class="n" data-field="machines">1/2<div class="scaler" data-field="scaler">' in html
    assert (
        'data-queue="runs_a" data-status="draining" data-safe-to-stop="no" class="stranded"' in html
    )
    assert html.count('class="stranded"') == 1  # a normal drain (live workers) is not stranded
    assert "stranded: no live worker" in html
    assert 'As of <span data-field="asOf">2026-12-04 17:00:05 UTC</span>.' in html


def test_open_runs_name_the_command_for_the_rest_quoted_and_escaped() -> None:
    """A hostile release id stays text, and the command quotes it for a shell."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    run = OpenRun(
        lane="runs_x", run_id=uuid.UUID(int=1), play="<i>p</i>", status="queued",
        bucket="fresh", attempts=0, defer_count=2, created_at=now, updated_at=now,
    )  # fmt: skip
    view = LaneView(
        release_id="x'; rm -rf /", queue="runs_x", status="claiming", as_of=now,
        counts={"fresh": 3}, open_runs=(run,), **BASE,
    )  # fmt: skip
    html = page.render([view])
    assert "<i>" not in html
    assert f'<a href="/runs/{run.run_id}">' in html
    assert "deferred 2x" in html
    command = escape("lane-worker runs --status open --lane 'x'\"'\"'; rm -rf /' --limit 3")
    assert f"and 2 more: <code>{command}</code>" in html


def test_ages_read_in_the_largest_useful_unit() -> None:
    """Seconds, minutes, hours and minutes, days and hours."""
    assert [page.age(s) for s in (5, 600, 3 * 3600 + 20 * 60, 2 * 86400 + 4 * 3600)] == [
        "5 s", "10 min", "3 h 20 min", "2 d 4 h",
    ]  # fmt: skip


def test_the_run_page_says_what_a_wait_waits_for() -> None:
    """A sleep's end, an event's key with its engine event name, a runner's attempt."""
    run_id = "r1"
    assert run_page.waits_for(run_id, {"kind": "sleep", "wakeAtMs": 0}) == (
        "sleeps until 1970-01-01 00:00:00 UTC"
    )
    said = run_page.waits_for(run_id, {"kind": "integration_event", "eventKey": "go",
                                       "deadlineMs": None, "boundaryId": "gate"})  # fmt: skip
    assert said == "event 'go' (engine event evt:r1:go), deadline: no deadline (boundary gate)"
    assert run_page.waits_for(run_id, None) == ""
    assert "detached runner attempt 2" in run_page.waits_for(
        run_id, {"kind": "runner", "runnerAttempt": 2, "deadlineMs": 1000}
    )


async def test_the_run_page_answers_404_for_a_bad_id_and_503_while_the_store_is_away() -> None:
    """A malformed id is 404 without a read; a read that fails is 503 naming its error."""
    reads: list[uuid.UUID] = []

    async def away(run_id: uuid.UUID) -> None:
        reads.append(run_id)
        raise ConnectionRefusedError("no database")

    status, html = await run_page.answer(away, "<b>x</b>", timeout_s=1)
    assert (status, reads) == (404, [])
    assert "<b>" not in html
    status, html = await run_page.answer(away, str(uuid.UUID(int=7)), timeout_s=1)
    assert status == 503
    assert 'data-error="ConnectionRefusedError"' in html


OLD_WORKER = {"workerId": "w-old", "plays": ["p"], "machineId": None, "version": None,
              "claiming": None, "claimHealth": "unknown", "notClaiming": []}  # fmt: skip


def test_a_claiming_lane_of_an_older_build_says_its_claim_health_is_unknown() -> None:
    """A build before 0.2.0 is neither claiming nor not: its runs waiting long are shown."""
    waiting = LaneView(
        release_id="a", queue="runs_a", status="claiming", workers=(OLD_WORKER,),
        blocked_by=(Blocker("claiming", 0, "retire it first"),
                    Blocker("claimHealthUnknown", 2, "runs queued for 75 s; check them")),
        **BASE,
    )  # fmt: skip
    html = page.render([waiting])
    assert 'data-worker="w-old" data-version="" data-claiming="unknown"' in html
    assert (
        '<div class="note" data-field="claimHealth">claim health unknown: lane-worker before '
        "0.2.0 does not report it</div>"
    ) in html
    assert "not claiming" not in html
    assert 'data-field="claimHealthUnknown">no live worker known to claim' in html
    assert "stranded" not in html.split("<tbody>")[1]
    assert '<li data-reason="claimHealthUnknown"><b>claimHealthUnknown</b> (2): runs queued' in html
    assert "retire it first" not in html  # still a claiming lane's own business


def test_a_drained_lane_says_nothing_of_its_live_workers_claiming() -> None:
    """Its machines are safe to stop: 'no live worker (known to) claim' there is noise."""
    for worker in (OLD_WORKER, {**OLD_WORKER, "version": "0.2.1", "claiming": False,
                                "claimHealth": "notClaiming"}):  # fmt: skip
        drained = LaneView(release_id="d", queue="runs_d", status="drained", workers=(worker,),
                           **BASE)  # fmt: skip
        html = page.render([drained])
        assert 'data-field="claimHealthUnknown"' not in html
        assert 'data-field="noClaims"' not in html


def test_an_idle_dev_lane_says_since_when_beside_its_status() -> None:
    """A worktree's lane with no live worker: "idle: no worker since ...", the remedy as its
    title; a release lane with no worker, or a dev lane with one, carries no such mark."""
    seen = datetime(2026, 12, 1, 9, 30, 12, tzinfo=UTC)
    idle = {**BASE, "live_workers": 0}
    views = [
        LaneView(release_id="dev-wt", queue="runs_wt", status="claiming", last_seen=seen, **idle),
        LaneView(release_id="rel-a", queue="runs_rel_a", status="claiming", last_seen=seen, **idle),
        LaneView(release_id="dev-up", queue="runs_up", status="claiming", last_seen=seen, **BASE),
    ]
    html = page.render(views)
    assert html.count('data-field="idleDev"') == 1
    assert ">idle: no worker since 2026-12-01 09:30 UTC</span>" in html
    assert escape("`lane-worker lanes retire dev-wt`") in html
