"""The boundary between release lanes and dev lanes (a worktree's), on real Postgres.

A release id and a worktree suffix can name one queue (release ``foo``, suffix ``foo``:
``runs_foo``). Neither kind of worker registers a lane the other holds (decided under
the lane row's lock), `lanes retire` / `activate` never mix them either, and no retry or
move sends a run across: a release's run to a worktree's lane, or a worktree's run to a
release's lane.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from support.db import execute, run_row, sql
from support.plays import RemedyPlays, remedies_app
from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
)
from worker.daemon import page
from worker.daemon.boot import install_and_register
from worker.db.store import Store
from worker.errors import (
    InvalidRequestError,
    LaneConfigError,
    NoClaimingLaneError,
    exit_code_for,
)
from worker.ops.lanes_text import lanes_table

STORE = Store(SCHEMA)


def booting(release_id: str) -> Any:
    """What install_and_register reads of a worker's settings."""
    return SimpleNamespace(queue=queue_of(release_id), release_id=release_id)


async def release_ids(database_url: str, queue: str) -> list[str]:
    ids: list[str] = await sql(
        database_url, f"select release_ids from {SCHEMA}.releases where queue = $1", queue
    )
    return ids


@pytest.mark.parametrize(
    ("first", "second", "says"),
    [
        ("foo", "dev-foo", ("'foo'", "DEEPLINE_ABSURD_QUEUE_SUFFIX")),
        ("dev-foo", "foo", ("'dev-foo'", "another release id")),
        ("rel-d", "dev-rel_d", ("'rel-d'", "DEEPLINE_ABSURD_QUEUE_SUFFIX")),
    ],
)
async def test_a_worker_of_the_other_kind_is_refused_at_boot(
    database_url: str, first: str, second: str, says: tuple[str, ...]
) -> None:
    """The second kind's boot exits 78 naming the queue, the first's id and the remedy;
    the lane keeps only the first kind's spelling."""
    queue = queue_of(first)
    assert queue_of(second) == queue
    async with open_client(database_url) as client:
        assert await install_and_register(client.db, client.store, booting(first)) == "claiming"
        with pytest.raises(LaneConfigError) as refused:
            await install_and_register(client.db, client.store, booting(second))
    assert exit_code_for(refused.value) == 78
    said = str(refused.value)
    assert queue in said, said
    for words in says:
        assert words in said, said
    assert await release_ids(database_url, queue) == [first]


@pytest.mark.parametrize("first", ["foo", "dev-foo"])
async def test_two_kinds_registering_at_once_leave_one(database_url: str, first: str) -> None:
    """The first registration holds the new row uncommitted when the other kind's arrives:
    the second waits on the row and, once the first commits, is refused (no row back)."""
    second = "dev-foo" if first == "foo" else "foo"
    holding = await connect(database_url)
    racing = await connect(database_url)
    try:
        tx = holding.transaction()
        await tx.start()
        assert await STORE.lanes.register(holding, queue="runs_foo", release_id=first)
        late = asyncio.ensure_future(
            STORE.lanes.register(racing, queue="runs_foo", release_id=second)
        )
        await eventually(
            lambda: sql(
                database_url,
                "select count(*) > 0 from pg_stat_activity"
                " where wait_event_type = 'Lock' and query like '%releases%'",
            )
        )
        await tx.commit()
        assert await late is None
    finally:
        await holding.close()
        await racing.close()
    assert await release_ids(database_url, "runs_foo") == [first]


async def test_lanes_retire_and_activate_never_mix_the_kinds(database_url: str) -> None:
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.db.run(lambda c: STORE.lanes.register(c, queue="runs_foo", release_id="foo"))
        for change in (client.activate_release, client.retire_release):
            with pytest.raises(InvalidRequestError, match="already belongs to release 'foo'"):
                await change("dev-foo")
        assert await release_ids(database_url, "runs_foo") == ["foo"]

        await client.db.run(
            lambda c: STORE.lanes.register(c, queue="runs_bar", release_id="dev-bar")
        )
        with pytest.raises(InvalidRequestError, match="already belongs to worktree lane"):
            await client.activate_release("bar", force=True)
        with pytest.raises(InvalidRequestError, match="a dev or preview worker serves"):
            await client.releases.deploy("bar", image="img")  # 0012 refuses it already
        assert await release_ids(database_url, "runs_bar") == ["dev-bar"]

        # A lane an older build mixed: retired by a spelling it has, never activated.
        await execute(
            database_url,
            f"update {SCHEMA}.releases set release_ids = release_ids || 'dev-foo'::text"
            " where queue = 'runs_foo'",
        )
        assert await client.retire_release("foo") == "runs_foo"
        with pytest.raises(InvalidRequestError, match="already belongs to worktree lane 'dev-foo'"):
            await client.activate_release("foo")
        status = await sql(
            database_url, f"select status from {SCHEMA}.releases where queue = 'runs_foo'"
        )
        assert status == "retired"
        with pytest.raises(LaneConfigError, match="already belongs to"):
            await install_and_register(client.db, client.store, booting("foo"))
        with pytest.raises(LaneConfigError, match="already belongs to"):
            await install_and_register(client.db, client.store, booting("dev-foo"))
        view = {v.queue: v for v in await client.lanes()}["runs_foo"]
        assert view.mixed
        assert view.as_json()["mixed"] is True
        assert any("mixed lane:" in line for line in lanes_table([view]))
        assert 'data-field="mixed"' in page.render([view])  # the lanes page too


REL = "rel-a"
WT = "dev-wt"


async def boot(runtime: Any) -> None:
    await runtime.db.run(
        lambda c: STORE.lanes.register(c, queue=runtime.queue, release_id=runtime.release_id)
    )
    await register_worker(runtime)


async def test_a_retry_never_crosses_between_a_release_and_a_worktree(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    app = remedies_app(remedy_plays)
    async with (
        open_client(database_url, env_of(REL)) as rel_client,
        open_client(database_url, {"DEEPLINE_ABSURD_QUEUE_SUFFIX": "wt"}) as wt_client,
        open_runtime(database_url, app, REL) as rt_rel,
        open_runtime(database_url, app, WT) as rt_wt,
    ):
        for runtime in (rt_rel, rt_wt):
            await boot(runtime)
            await rel_client.activate_release(runtime.release_id)  # its engine queue
        released = await rel_client.submit("plain", {"k": 1})
        worktree = await wt_client.submit("plain", {"k": 2})
        for run in (released, worktree):
            assert await rel_client.fail_run(run.run_id, "try again")

        with pytest.raises(InvalidRequestError, match="never goes to dev lane runs_wt"):
            await rel_client.retry_run(released.run_id, to_release=WT)
        with pytest.raises(InvalidRequestError, match="never goes to release lane runs_rel_a"):
            await rel_client.retry_run(worktree.run_id, to_release=REL)
        # The page's preview of a bulk retry "to release" says the same, per run.
        plans = await rel_client.remedies.plan_retries([uuid.UUID(released.run_id)], to_release=WT)
        assert "never goes to dev lane" in (plans[uuid.UUID(released.run_id)].refused or "")
        for run in (released, worktree):
            assert (await run_row(database_url, run.run_id))["retried_by"] is None
        count = await sql(database_url, f"select count(*) from {SCHEMA}.runs")
        assert count == 2

        # Without --to, each goes where it belongs.
        assert (await rel_client.retry_run(released.run_id)).queue == "runs_rel_a"
        assert (await rel_client.retry_run(worktree.run_id)).queue == "runs_wt"


async def test_a_move_never_crosses_between_a_release_and_a_worktree(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    app = remedies_app(remedy_plays)
    async with (
        open_client(database_url, env_of(REL)) as rel_client,
        open_client(database_url, {"DEEPLINE_ABSURD_QUEUE_SUFFIX": "wt"}) as wt_client,
        open_runtime(database_url, app, REL) as rt_rel,
        open_runtime(database_url, app, WT) as rt_wt,
    ):
        for runtime in (rt_rel, rt_wt):
            await boot(runtime)
            await rel_client.activate_release(runtime.release_id)
        released = await rel_client.submit("plain", {"k": 1})
        worktree = await wt_client.submit("plain", {"k": 2})
        before = {r.run_id: await run_row(database_url, r.run_id) for r in (released, worktree)}

        with pytest.raises(InvalidRequestError, match="restart that worktree's worker, or cancel"):
            await rel_client.move_lane(WT, REL)
        with pytest.raises(InvalidRequestError, match="never goes to dev lane"):
            await rel_client.move_lane(REL, WT)
        # The page's bulk move "to release": refused run by run, with the reason.
        report = await rel_client.remedies.move_runs([uuid.UUID(worktree.run_id)], REL)
        assert report.moved == ()
        assert "never goes to release lane" in dict(report.refused)[worktree.run_id]
        report = await rel_client.remedies.move_runs([uuid.UUID(released.run_id)], WT)
        assert "never goes to dev lane" in dict(report.refused)[released.run_id]
        for run_id, row in before.items():
            assert await run_row(database_url, run_id) == row


async def test_a_dev_lane_s_stuck_runs_are_never_sent_to_a_release(database_url: str) -> None:
    """A worktree's lane with fresh runs and no live worker: the remedy is its worker or
    cancelling them, never `lanes move ... --to RELEASE`."""
    async with open_client(database_url, {"DEEPLINE_ABSURD_QUEUE_SUFFIX": "wt"}) as client:
        await client.db.run(lambda c: STORE.lanes.register(c, queue="runs_wt", release_id=WT))
        await client.activate_release(WT)
        await client.submit("plain", {"k": 1})
        view = {v.queue: v for v in await client.lanes()}["runs_wt"]
        remedies = [b.remedy for b in view.blocked_by]
        assert remedies, view
        assert not any("lanes move" in r for r in remedies), remedies
        assert any("lane-worker cancel RUN_ID" in r for r in remedies), remedies
        assert not any("lanes move" in line for line in lanes_table([view]))


async def test_a_retry_never_goes_to_a_mixed_lane(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """A lane an older build let a release and a worktree share is no target for either."""
    app = remedies_app(remedy_plays)
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, app, REL) as rt_rel,
        open_runtime(database_url, app, "foo") as rt_foo,
    ):
        for runtime in (rt_rel, rt_foo):
            await boot(runtime)
            await client.activate_release(runtime.release_id)
        await execute(
            database_url,
            f"update {SCHEMA}.releases set release_ids = release_ids || 'dev-foo'::text"
            " where queue = 'runs_foo'",
        )
        run = await client.submit("plain", {"k": 1})
        assert await client.fail_run(run.run_id, "try again")
        with pytest.raises(InvalidRequestError, match="lane runs_foo is mixed"):
            await client.retry_run(run.run_id, to_release="foo")
        with pytest.raises(InvalidRequestError, match="lane runs_foo is mixed"):
            await client.move_lane(REL, "foo")
        assert (await client.retry_run(run.run_id)).queue == "runs_rel_a"


async def test_a_dev_run_on_a_mixed_lane_is_not_retried_there(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    app = remedies_app(remedy_plays)
    async with (
        open_client(database_url, {"DEEPLINE_ABSURD_QUEUE_SUFFIX": "foo"}) as client,
        open_runtime(database_url, app, "dev-foo") as rt_wt,
    ):
        await boot(rt_wt)
        await client.activate_release("dev-foo")
        run = await client.submit("plain", {"k": 1})
        assert await client.fail_run(run.run_id, "try again")
        await execute(
            database_url,
            f"update {SCHEMA}.releases set release_ids = release_ids || 'foo'::text"
            " where queue = 'runs_foo'",
        )
        with pytest.raises(NoClaimingLaneError, match="lane runs_foo is mixed"):
            await client.retry_run(run.run_id)


async def test_a_worktree_never_takes_a_queue_deployed_to_a_release(database_url: str) -> None:
    """`releases deploy foo` before any machine of foo booted: a worktree with suffix foo
    is refused at boot (naming foo) and by `lanes activate`, and foo's machine boots."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("foo", image="img")
        with pytest.raises(LaneConfigError, match="already belongs to release 'foo'"):
            await install_and_register(client.db, client.store, booting("dev-foo"))
        with pytest.raises(InvalidRequestError, match="already belongs to release 'foo'"):
            await client.activate_release("dev-foo", force=True)
        assert await sql(database_url, f"select count(*) from {SCHEMA}.releases") == 0
        assert await install_and_register(client.db, client.store, booting("foo")) == "claiming"
        assert await release_ids(database_url, "runs_foo") == ["foo"]
