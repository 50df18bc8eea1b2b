"""Adoption across releases (the claim's lane filter and worker/run/decide.py), on real Postgres.

A newer release adopts a retired lane's parked runs only if it has their play and no
other lane adopted them; an older release never adopts a newer one's; an adopter keeps
its runs through a third release, a race, a rollback (`lanes activate`) and its own
retirement; a machine of the adopter without the play is never handed them.
"""

from __future__ import annotations

from typing import Any

import structlog

from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    set_policy,
    sleepers_due,
    work_once,
    work_until,
)
from worker import App, TaskContext

A, B, C = "rel-a", "rel-b", "rel-c"
QA = queue_of(A)
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "3"}


def napping_app(name: str, naps: int = 1) -> App:
    """Play ``name``: a step, then ``naps`` times a 0.3 s nap and a step; returns who ran each."""
    app = App()

    @app.play(name)
    async def nap(ctx: TaskContext, params: Any) -> list[str]:
        ran = [await ctx.step("first", lambda: ctx.release_id)]
        for n in range(naps):
            await ctx.sleep(f"nap-{n}", 0.3)
            ran.append(await ctx.step(f"after-{n}", lambda: ctx.release_id))
        return ran

    return app


async def test_a_parked_run_whose_play_the_newer_release_lacks_stays_with_its_own_lane(
    database_url: str,
) -> None:
    """B lacks the play: B never adopts it; A stays draining and its own worker finishes it."""
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, napping_app("only-in-a"), A) as rt_a,
        open_runtime(database_url, napping_app("something-else"), B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b)  # B is live, and registers its plays
        run = await client.submit("only-in-a")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        set_policy(rt_a, draining=True)
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        assert await work_once(rt_b, QA) == []  # not handed to B at all
        assert await work_once(rt_a) == ["completed"]
        status = await client.status(run.run_id)
    assert lanes[QA] == "draining"  # B cannot adopt it: only A may run it
    assert status.output == [A, A]
    assert status.adopted_release_id is None


async def test_adopting_without_the_play_in_a_race_defers_and_counts(database_url: str) -> None:
    """Handed a parked run whose play it lacks (a race), B defers it, never fails it."""
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, napping_app("only-in-a"), A) as rt_a,
        open_runtime(database_url, napping_app("something-else"), B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        run = await client.submit("only-in-a")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        rt_b.plays = ["only-in-a"]  # the claim believes B has it: the race
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        with structlog.testing.capture_logs() as logs:
            assert await work_once(rt_b, QA) == ["deferred"]
        status = await client.status(run.run_id)
    assert status.status == "waiting"
    assert [(a.release_id, a.disposition) for a in status.attempts] == [(A, "own"), (B, "defer")]
    (deferred,) = [e for e in logs if e["event"] == "run.deferred"]
    assert "only-in-a" in deferred["reason"]
    assert B in deferred["reason"]


async def test_a_lane_activated_again_leaves_its_adopted_runs_to_their_adopter(
    database_url: str,
) -> None:
    """B adopted A's run; `lanes activate A`: A's own loop never runs it again, B finishes it."""
    app = App()
    executed: list[tuple[str, str]] = []

    @app.play("two-naps")
    async def two_naps(ctx: TaskContext, params: Any) -> None:
        for step in ("one", "two", "three"):
            await ctx.step(step, lambda s=step: executed.append((s, ctx.release_id)))
            if step != "three":
                await ctx.sleep(f"nap-{step}", 0.3)

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        run = await client.submit("two-naps")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await work_until(rt_b, "parked", queue=QA)  # B adopted it at nap-one
        await client.activate_release(A, force=True)  # a rollback: A claims again
        set_policy(rt_b, claiming_queues=frozenset({QA}))  # as B's registry refresh sees it
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="nap-two due")
        finally:
            await conn.close()
        # A's own loop (the engine's claim) is handed it once, gives it to B, and
        # skips it from then on.
        assert await work_once(rt_a) == ["deferred"]
        assert rt_a.policy.value.foreign_adoptees
        assert await work_once(rt_a) == []

        async def b_finished() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_finished, what="B to finish its adopted run on a claiming lane")
        status = await client.status(run.run_id)
    assert executed == [("one", A), ("two", B), ("three", B)]
    assert status.status == "completed"


async def test_a_machine_of_the_adopter_without_the_play_never_fails_its_adoptee(
    database_url: str,
) -> None:
    """B adopted the run; another B machine whose app lacks the play is never handed it."""
    full, partial = napping_app("only-in-full", naps=2), napping_app("something-else")
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, full, A) as rt_a,
        open_runtime(database_url, full, B, worker_base="b-full") as rt_b_full,
        open_runtime(database_url, partial, B, worker_base="b-partial") as rt_b_partial,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b_full)
        run = await client.submit("only-in-full")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await eventually(lambda: _adopted_and_parked(rt_b_full), what="B adopting the run")
        assert (await client.status(run.run_id)).status == "waiting"  # parked at nap-1
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        assert await work_once(rt_b_partial, QA) == []
        # A race (the claim thought it had the play): deferred, never failed for good.
        rt_b_partial.plays = ["only-in-full"]
        assert await work_once(rt_b_partial, QA) == ["deferred"]
        status = await client.status(run.run_id)
    assert status.status == "waiting"
    assert status.adopted_release_id == B


async def _adopted_and_parked(rt: Any) -> bool:
    """Claim on A's queue with ``rt``; tell whether a run parked (adopted at the nap)."""
    outcomes = await work_once(rt, QA)
    return "parked" in outcomes or "completed" in outcomes


async def test_a_rollback_keeps_the_retired_adopter_draining_for_its_adoptee(
    database_url: str,
) -> None:
    """B adopted A's run; `activate A`, `retire B`: B stays draining and finishes it itself."""
    app = napping_app("loop", naps=2)
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_a)
        await register_worker(rt_b)
        run = await client.submit("loop")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await eventually(lambda: _adopted_and_parked(rt_b), what="B adopting the run")
        await client.activate_release(A, force=True)
        await client.retire_release(B, force=True)
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        set_policy(rt_b, draining=True)
        set_policy(rt_a, foreign_adoptees=True)
        assert await work_once(rt_a) == []  # A never takes back B's adoptee

        async def b_finished() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_finished, what="retired B to finish its adoptee")
        status = await client.status(run.run_id)
    assert lanes[queue_of(B)] == "draining"
    assert status.output == [A, B, B]


async def test_an_older_release_never_adopts_a_newer_release_s_parked_run(
    database_url: str,
) -> None:
    """B's deploy is aborted (B retired while A claims): A is not handed B's parked run."""
    app = napping_app("loop")
    async with (
        open_client(database_url, {**ENV_A, "DEEPLINE_RUNTIME_DEPLOY_VERSION": B}) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # A's lane exists first: it is the older one
        await client.activate_release(B, force=True)
        await register_worker(rt_a)
        run = await client.submit("loop")
        assert await work_once(rt_b) == ["parked"]
        await client.retire_release(B, force=True)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, queue_of(B)), what="the nap due")
        finally:
            await conn.close()
        assert await work_once(rt_a, queue_of(B)) == []
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        set_policy(rt_b, draining=True)
        assert await work_once(rt_b) == ["completed"]
        status = await client.status(run.run_id)
    assert lanes[queue_of(B)] == "draining"  # nothing newer can adopt it
    assert status.output == [B, B]


# -- a third release, and a race, leave the adopter its run ---------------------------------


def naps_app(executed: list[tuple[str, str]]) -> App:
    """A step, a nap, a step, a nap, a step; each step records (step, release)."""
    app = App()

    @app.play("naps")
    async def naps(ctx: TaskContext, params: Any) -> list[str]:
        def mark(step: str) -> str:
            executed.append((step, ctx.release_id))
            return ctx.release_id

        one = await ctx.step("one", lambda: mark("one"))
        await ctx.sleep("nap-1", 0.3)
        two = await ctx.step("two", lambda: mark("two"))
        await ctx.sleep("nap-2", 0.3)
        three = await ctx.step("three", lambda: mark("three"))
        return [one, two, three]

    return app


async def test_a_third_release_never_takes_a_run_its_adopter_still_claims(
    database_url: str,
) -> None:
    """A retired; B adopts; when the run wakes again C's loop is not handed it, B finishes it."""
    executed: list[tuple[str, str]] = []
    app = naps_app(executed)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
        open_runtime(database_url, app, C) as rt_c,
    ):
        for release in (A, B, C):  # registered in release order, as their workers boot
            await client.activate_release(release, force=True)
        run = await client.submit("naps")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="nap-1 due")
            with structlog.testing.capture_logs() as logs:
                # B adopts at nap-1 and parks at nap-2.
                assert await work_until(rt_b, "parked", queue=QA) == ["parked"]
                await eventually(lambda: sleepers_due(conn, QA), what="nap-2 due")
                assert await work_once(rt_c, QA) == []  # skipped by C's claim
                assert await work_once(rt_b, QA) == ["completed"]
        finally:
            await conn.close()
        status = await client.status(run.run_id)
    assert status.status == "completed"
    assert status.adopted_release_id == B
    assert executed == [("one", A), ("two", B), ("three", B)]
    assert [(a.release_id, a.disposition, a.outcome) for a in status.attempts] == [
        (A, "own", "parked"),
        (B, "adopt", "parked"),
        (B, "own", "completed"),
    ]
    assert not [e for e in logs if e["event"] in ("lane.refused", "run.deferred")]


async def test_a_race_for_an_adopted_run_gives_it_back_quietly_at_once(database_url: str) -> None:
    """C claimed B's adopted run while B was retired; B claims again: C gives it back quietly."""
    executed: list[tuple[str, str]] = []
    app = naps_app(executed)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
        open_runtime(database_url, app, C) as rt_c,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await client.activate_release(C, force=True)
        run = await client.submit("naps")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await work_until(rt_b, "parked", queue=QA)  # adopted by B, parked at nap-2
        await client.retire_release(B, force=True)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="nap-2 due")
            batch = await rt_c.claim(QA, 1)  # allowed: B's lane is retired now
            assert len(batch.runs) == 1
            await client.activate_release(B, force=True)
            with structlog.testing.capture_logs() as logs:
                handled = await rt_c.handle(batch.runs[0])
            state = await conn.fetchrow(
                f"select state, attempt, available_at <= absurd.current_time() as due"
                f" from absurd.r_{QA} where run_id = $1",
                batch.runs[0].run_id,
            )
        finally:
            await conn.close()
        assert await work_once(rt_b, QA) == ["completed"]
        status = await client.status(run.run_id)
    assert (handled.disposition, handled.outcome) == ("defer", "deferred")
    assert dict(state) == {"state": "sleeping", "attempt": 1, "due": True}
    assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == []
    assert "run.left_to_adopter" in [e["event"] for e in logs]
    assert status.status == "completed"
    assert executed == [("one", A), ("two", B), ("three", B)]


async def test_the_adopt_filter_asks_the_store_rule(database_url: str) -> None:
    """The continuation filter hands out exactly the runs ``adoptable_by`` allows.

    The filter (engine contract claim_v1) always serves a store its own build
    migrated, so it asks the store's named rule (migration 0007) and keeps no
    spelled-out copy for older stores.
    """
    lanes_in_order = {"rel-old": "retired", "rel-d": "retired", "rel-b": "claiming",
                      "rel-e": "retired", "rel-c": "claiming"}  # fmt: skip
    q = {r: queue_of(r) for r in lanes_in_order}
    cases = {  # name: (store status, play, adopter release or None, handed to B?)
        "parked, nobody adopted it": ("waiting", "p", None, True),
        "parked, a play B lacks": ("waiting", "q", None, False),
        "not parked": ("queued", "p", None, False),
        "B's own adoptee, running": ("running", "p", "rel-b", True),
        "adopted by a claiming lane": ("waiting", "p", "rel-c", False),
        "adopted by an older retired lane": ("waiting", "p", "rel-d", True),
        "adopted by a newer retired lane": ("waiting", "p", "rel-e", False),
    }
    async with open_client(database_url, env_of("rel-old")) as client:
        ids = {name: (await client.submit(case[1], {})).run_id for name, case in cases.items()}
    conn = await connect(database_url)
    try:
        for n, (release, status) in enumerate(lanes_in_order.items()):
            await conn.execute(
                f"insert into {SCHEMA}.releases (queue, status, release_ids, created_at)"
                " values ($1, $2, array[$3], now() - make_interval(secs => 100 - $4))"
                " on conflict (queue) do update set status = excluded.status,"
                " created_at = excluded.created_at",
                q[release],
                status,
                release,
                n,
            )
        for name, (status, _, adopter, _) in cases.items():
            await conn.execute(
                f"update {SCHEMA}.runs set status = $2, adopted_queue = $3 where run_id = $1",
                ids[name],
                status,
                q[adopter] if adopter else None,
            )
        await conn.execute(f"update absurd.r_{q['rel-old']} set state = 'sleeping'")

        async def handed_to_b() -> set[str]:
            where = await conn.fetchval(
                "select lane_worker.lane_filter_v1('adopt', $1, $2, '$1', '$2')",
                SCHEMA,
                q["rel-old"],
            )
            rows = await conn.fetch(
                f"select s.run_id::text from absurd.r_{q['rel-old']} r"
                f" join {SCHEMA}.runs s on s.task_id = r.task_id where {where}",
                q["rel-b"],
                ["p"],
            )
            return {name for name, i in ids.items() if i in {r[0] for r in rows}}

        expected = {name for name, (*_, handed) in cases.items() if handed}
        assert await handed_to_b() == expected
    finally:
        await conn.close()
