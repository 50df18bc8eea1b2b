"""Bounded, visible deferral (worker/run/deferral.py, worker/run/decide.py), on real Postgres.

A run a loop may not run is put back (``defer``) without spending an attempt: counted on
the run, reported, alerted once, failed for good past the fail age, its streak reset when
its adopter takes it over. Deferral is staged as the race the README describes: a
continuation loop of B holding a run of retired A that only A may run. A machine whose
app lacks a play its lane has leaves those runs to one that has it.
"""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from support.db import (
    age_worker,
    engine_runs_due,
    run_row,
    sql,
)
from support.plays import (
    ENV_A,
    QA,
    A,
    B,
    RemedyPlays,
    ReportPlays,
    narrow_app,
    remedies_app,
    report_app,
    two_lanes,
)
from support.report import blockers, counts, expected, lanes_json
from support.runtime import (
    SCHEMA,
    connect,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    set_policy,
    sleepers_due,
    work_once,
)
from worker.db import engine
from worker.metrics import Metrics
from worker.run.execute import Runtime

C = "rel-c"
QC = queue_of(C)


async def claim_bypassing_the_filter(rt: Runtime, queue: str) -> engine.ClaimedRun:
    """Claim one run of ``queue`` with the engine's own claim, as ``rt``'s loop there.

    This is the race the continuation claim's filter exists to prevent (the
    registry changed between the claim and the decision): ``Runtime.handle``
    must then decide on its own, and defer.
    """
    worker_id = rt.worker_id_for(queue)
    batch = await rt.db.run(
        lambda conn: engine.claim(conn, queue, worker_id, lease_s=rt.lease_s, qty=1)
    )
    assert len(batch.runs) == 1, batch
    return batch.runs[0]


async def streak_older_than(database_url: str, run_id: str, seconds: float) -> bool:
    """Tell whether a run's deferral streak is older than ``seconds`` by the database's clock."""
    older: bool = await sql(
        database_url,
        f"select now() - first_deferred_at > make_interval(secs => $2::float8)"
        f" from {SCHEMA}.runs where run_id = $1::uuid",
        run_id,
        seconds,
    )
    return older


async def defer_once(rt: Runtime, database_url: str, queue: str, run_id: str) -> Any:
    """Make the run due, claim it past the filter as ``rt`` and let ``rt`` handle it."""
    await engine_runs_due(database_url, queue, run_id, in_s=-1)
    claimed = await claim_bypassing_the_filter(rt, queue)
    return await rt.handle(claimed)


def long_deferrals(metrics: Metrics, queue: str) -> float:
    """Return ``lane_worker_long_deferrals_total`` of ``queue`` (0 when never counted)."""
    value = metrics.registry.get_sample_value("lane_worker_long_deferrals_total", {"queue": queue})
    return value or 0.0


@pytest.fixture
def plays(report_plays: ReportPlays) -> ReportPlays:
    """The report app's state (the deferral tests stage their runs with it)."""
    return report_plays


async def test_a_deferred_run_is_counted_reported_and_alerted_once(
    database_url: str, plays: ReportPlays
) -> None:
    """B's loop defers A's fresh run again and again: streak, report, one warning, one metric."""
    app = report_app(plays)
    metrics = Metrics()
    alert_after_s = 0.2
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(
            database_url, app, B, metrics=metrics, defer_alert_after_s=alert_after_s
        ) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b)
        run = await client.submit("napper")
        await client.retire_release(A)

        with structlog.testing.capture_logs() as logs:
            handled = await rt_b.handle(await claim_bypassing_the_filter(rt_b, QA))
        assert (handled.disposition, handled.outcome) == ("defer", "deferred")
        row = await run_row(database_url, run.run_id)
        assert row["defer_count"] == 1
        assert row["first_deferred_at"] is not None
        assert row["defer_alerted_at"] is None
        first_deferred_at = row["first_deferred_at"]
        assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == []
        assert long_deferrals(metrics, QA) == 0
        lane_a = (await lanes_json(client))[QA]
        assert counts(lane_a) == expected(fresh=1, deferred=1)  # still fresh: never started
        assert lane_a["counts"]["oldestDeferralSeconds"] >= 0
        assert lane_a["status"] == "draining"
        assert blockers(lane_a) == [("fresh", 1, [run.run_id])]

        await eventually(
            lambda: streak_older_than(database_url, run.run_id, alert_after_s),
            what="the deferral streak to outlive the alert age",
        )
        with structlog.testing.capture_logs() as logs:
            second = await defer_once(rt_b, database_url, QA, run.run_id)
            third = await defer_once(rt_b, database_url, QA, run.run_id)
        assert [(h.disposition, h.outcome) for h in (second, third)] == [("defer", "deferred")] * 2
        alerts = [e for e in logs if e["event"] == "run.deferred_too_long"]
        assert len(alerts) == 1, logs  # one warning per streak, not one per deferral
        assert alerts[0]["log_level"] == "warning"
        assert (alerts[0]["run_id"], alerts[0]["queue"]) == (run.run_id, QA)
        assert alerts[0]["defer_count"] == 2
        assert long_deferrals(metrics, QA) == 1
        row = await run_row(database_url, run.run_id)
        assert row["defer_count"] == 3
        assert row["first_deferred_at"] == first_deferred_at
        assert row["defer_alerted_at"] is not None
        assert row["status"] == "queued"
        lane_a = (await lanes_json(client))[QA]
        assert counts(lane_a) == expected(fresh=1, deferred=1)
        assert lane_a["counts"]["oldestDeferralSeconds"] > alert_after_s
        status = await client.status(run.run_id)
        assert [(a.disposition, a.outcome) for a in status.attempts] == [("defer", "deferred")] * 3
        assert {a.attempt for a in status.attempts} == {1}  # no attempt spent

        # A's own (draining) worker takes it over: the streak is over.
        set_policy(rt_a, draining=True)
        await engine_runs_due(database_url, QA, run.run_id, in_s=-1)
        assert await work_once(rt_a) == ["parked"]
        row = await run_row(database_url, run.run_id)
        assert (row["defer_count"], row["first_deferred_at"], row["defer_alerted_at"]) == (
            0,
            None,
            None,
        )
        lane_a = (await lanes_json(client))[QA]
        assert counts(lane_a) == expected(parkedSleep=1)
        assert lane_a["counts"]["oldestDeferralSeconds"] is None
        assert lane_a["status"] == "drained"


async def test_the_deferral_warning_and_failure_carry_the_run_s_log_context(
    database_url: str, plays: ReportPlays
) -> None:
    """The streak's log lines carry release_id, queue, worker_id and run_id, like every run line.

    The README: "every line about a run carries release_id, queue, worker_id and
    run_id" (and the e2e suites' ``malformed_lines`` holds daemons to it).
    """
    app = report_app(plays)
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(
            database_url, app, B, defer_alert_after_s=0.05, defer_fail_after_s=0.05
        ) as rt_b,
    ):
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        run = await client.submit("plain")
        await client.retire_release(A)
        with structlog.testing.capture_logs() as logs:
            await rt_b.handle(await claim_bypassing_the_filter(rt_b, QA))
            await eventually(
                lambda: streak_older_than(database_url, run.run_id, 0.05), what="the streak's age"
            )
            last = await defer_once(rt_b, database_url, QA, run.run_id)
    assert last.outcome == "failed"
    streak_lines = [
        e for e in logs if e["event"] in ("run.deferred_too_long", "run.failed_for_good")
    ]
    assert sorted(e["event"] for e in streak_lines) == [
        "run.deferred_too_long",
        "run.failed_for_good",
    ]
    for line in logs:  # run.deferred as well: it shows what the whole set should carry
        if line.get("run_id"):
            missing = [k for k in ("release_id", "queue", "worker_id") if not line.get(k)]
            assert missing == [], f"{line['event']} lacks {missing}: {line}"


async def test_a_run_deferred_past_the_fail_age_fails_for_good_with_one_terminal_fact(
    database_url: str, plays: ReportPlays
) -> None:
    """Past the fail age a deferral fails the run for good: reason, one fact, task cancelled."""
    app = report_app(plays)
    fail_after_s = 0.2
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B, defer_fail_after_s=fail_after_s) as rt_b,
    ):
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        run = await client.submit("plain")
        await client.retire_release(A)
        first = await rt_b.handle(await claim_bypassing_the_filter(rt_b, QA))
        assert (first.disposition, first.outcome) == ("defer", "deferred")
        assert (await client.status(run.run_id)).status == "queued"
        await eventually(
            lambda: streak_older_than(database_url, run.run_id, fail_after_s),
            what="the deferral streak to outlive the fail age",
        )
        with structlog.testing.capture_logs() as logs:
            last = await defer_once(rt_b, database_url, QA, run.run_id)
        assert (last.disposition, last.outcome) == ("defer", "failed")
        status = await client.status(run.run_id)
        assert status.status == "failed"
        assert status.error["name"] == "DeferralLimitExceeded"
        assert status.error["fatal"] is True
        assert "deferred 2 times" in status.error["message"]
        assert status.facts == ("run.failed",)  # exactly one terminal fact
        assert [(a.disposition, a.outcome) for a in status.attempts] == [
            ("defer", "deferred"),
            ("defer", "failed"),
        ]
        failed_logs = [e for e in logs if e["event"] == "run.failed_for_good"]
        assert [(e["run_id"], e["log_level"]) for e in failed_logs] == [(run.run_id, "error")]
        row = await run_row(database_url, run.run_id)
        assert row["finished_at"] is not None
        conn = await connect(database_url)
        try:
            task_state = await engine.task_state(conn, QA, row["task_id"])
            engine_states = await conn.fetch(f"select state from absurd.r_{QA}")
        finally:
            await conn.close()
        assert task_state == "cancelled"
        assert [r["state"] for r in engine_states] == ["cancelled"]  # not rescheduled
        # Nobody runs it afterwards, and A's lane has nothing left: drained.
        set_policy(rt_a, draining=True)
        assert await work_once(rt_a) == []
        lane_a = (await lanes_json(client))[QA]
        assert counts(lane_a) == expected()
        assert lane_a["status"] == "drained"
        assert (await client.status(run.run_id)).facts == ("run.failed",)


async def test_an_adopter_taking_the_run_over_resets_its_streak(
    database_url: str, plays: ReportPlays
) -> None:
    """A B machine lacking the play defers A's parked run; a B machine with it adopts: reset."""
    metrics = Metrics()
    full = report_app(plays)
    lacking = report_app(plays, without=("napper",))
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, full, A) as rt_a,
        open_runtime(database_url, lacking, B, metrics=metrics, worker_base="b-old") as rt_b_old,
        open_runtime(database_url, full, B, worker_base="b-new") as rt_b_new,
    ):
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        await register_worker(rt_b_new)
        run = await client.submit("napper", {"seconds": 0.2})
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        # A rolling restart's older B machine (its app lacks the play) claims it in a race.
        handled = await rt_b_old.handle(await claim_bypassing_the_filter(rt_b_old, QA))
        assert (handled.disposition, handled.outcome) == ("defer", "deferred")
        assert metrics.registry.get_sample_value("lane_worker_incompatible_defers_total") == 1
        row = await run_row(database_url, run.run_id)
        assert (row["defer_count"], row["status"]) == (1, "waiting")
        lane_a = (await lanes_json(client))[QA]
        assert counts(lane_a) == expected(parkedSleep=1, deferred=1)
        assert lane_a["counts"]["oldestDeferralSeconds"] >= 0

        await engine_runs_due(database_url, QA, run.run_id, in_s=-1)
        assert await work_once(rt_b_new, QA) == ["completed"]
        row = await run_row(database_url, run.run_id)
        assert (row["defer_count"], row["first_deferred_at"], row["defer_alerted_at"]) == (
            0,
            None,
            None,
        )
        status = await client.status(run.run_id)
        assert status.adopted_release_id == B
        assert [(a.disposition, a.outcome) for a in status.attempts] == [
            ("own", "parked"),
            ("defer", "deferred"),
            ("adopt", "completed"),
        ]


# -- a play another machine of the lane has ---------------------------------------------------


async def test_a_machine_without_the_play_leaves_the_run_to_one_that_has_it(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """Mixed apps in one release: the narrow machine never fails the run and then skips it."""
    app = remedies_app(remedy_plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, narrow_app(), A, worker_base="test-rel-a-narrow") as narrow,
    ):
        await register_worker(narrow)
        runs = [await client.submit("plain", {"n": n}) for n in range(3)]
        outcomes = await work_once(narrow)
        assert outcomes == ["deferred"] * len(runs), outcomes
        assert narrow.policy.value.lane_plays_differ
        assert await work_once(narrow) == []  # it claims past them now
        done: list[str] = []

        async def all_done() -> bool:
            done.extend(await work_once(rt_a))
            return len(done) == len(runs)

        await eventually(all_done, what="the full machine to run them")
        for run in runs:
            status = await client.status(run.run_id)
            assert status.status == "completed"
            owned = [(a.worker_id, a.outcome) for a in status.attempts if a.disposition == "own"]
            assert owned == [("test-rel-a", "completed")]


async def test_a_play_only_a_stopped_machine_had_is_deferred_then_failed_past_the_limit(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """No live machine has the play, a stopped one did: deferred (counted), then fails at the limit.

    The path that still reaches LANE_WORKER_DEFER_FAIL_AFTER (docs/DESIGN.md).
    """
    app = remedies_app(remedy_plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(
            database_url, narrow_app(), A, worker_base="test-rel-a-narrow",
            defer_fail_after_s=0.5,
        ) as narrow,
    ):  # fmt: skip
        await register_worker(narrow)
        await age_worker(database_url, rt_a.worker_base)  # the full machine stopped
        run = await client.submit("plain")
        assert await work_once(narrow) == ["deferred"]
        row = await run_row(database_url, run.run_id)
        assert (row["status"], row["defer_count"]) == ("queued", 1)
        assert (await client.lane(A)).counts["deferred"] == 1  # the report names it
        await sql(
            database_url,
            f"update {SCHEMA}.runs set first_deferred_at = now() - interval '1 minute'"
            " where run_id = $1::uuid",
            run.run_id,
        )
        await sql(database_url, f"update absurd.r_{QA} set available_at = now()")
        assert await work_once(narrow) == ["failed"]
        status = await client.status(run.run_id)
        assert (status.status, status.error["name"]) == ("failed", "DeferralLimitExceeded")
        assert status.facts == ("run.failed",)

        # A play no machine of the lane ever registered is unknown: past the grace it
        # fails visibly (the next test), but this runtime's fail limit comes first.
        typo = await client.submit("plian")
        assert await work_once(narrow) == ["deferred"]
        await sql(
            database_url,
            f"update {SCHEMA}.runs set first_deferred_at = now() - interval '1 minute'"
            " where run_id = $1::uuid",
            typo.run_id,
        )
        await sql(database_url, f"update absurd.r_{QA} set available_at = now()")
        assert await work_once(narrow) == ["failed"]
        assert (await client.status(typo.run_id)).error["name"] == "DeferralLimitExceeded"


async def test_a_play_no_machine_ever_registered_waits_through_the_grace_then_fails(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """A hotfix's new play (or a typo): put back with no attempt spent for
    LANE_WORKER_UNKNOWN_PLAY_GRACE from its first put-back, then UnknownPlayError."""
    app = remedies_app(remedy_plays)
    async with (
        two_lanes(database_url, app) as (client, _rt_a, _rt_b),
        open_runtime(database_url, narrow_app(), A, worker_base="test-rel-a-narrow") as narrow,
    ):
        await register_worker(narrow)
        # A play no machine of the lane ever registered is waited for through the grace
        # (a hotfix may be bringing it), put back with no attempt spent, then is unknown:
        # it fails visibly.
        typo = await client.submit("plian")
        assert await work_once(narrow) == ["deferred"]
        row = await run_row(database_url, typo.run_id)
        assert (row["status"], row["defer_count"]) == ("queued", 1)
        waiting = await client.status(typo.run_id)
        assert waiting.attempt_count == 0, waiting
        await sql(
            database_url,
            f"update {SCHEMA}.runs set first_deferred_at = now() - interval '500 seconds'"
            " where run_id = $1::uuid",
            typo.run_id,
        )
        await sql(database_url, f"update absurd.r_{QA} set available_at = now()")
        assert await work_once(narrow) == ["deferred"]  # still within the 600 s grace
        await sql(
            database_url,
            f"update {SCHEMA}.runs set first_deferred_at = now() - interval '601 seconds'"
            " where run_id = $1::uuid",
            typo.run_id,
        )
        await sql(database_url, f"update absurd.r_{QA} set available_at = now()")
        assert await work_once(narrow) == ["failed"]
        gone = await client.status(typo.run_id)
        assert gone.error["name"] == "UnknownPlayError"
        assert gone.attempt_count == 1  # the put-backs spent none
