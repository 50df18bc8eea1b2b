"""The release registry (worker/ops/releases.py, store migration 0012) on real Postgres.

``deploy`` records the current release and demotes the former one to previous;
``retire_superseded`` (the scaler's step once the current release is ready)
retires, in one transaction, every previous release and every older claiming lane
deployed by hand, never a dev lane; a rollback makes a retired lane claim again.
"""

from __future__ import annotations

import asyncpg
import pytest

from support.db import fetch
from support.runtime import SCHEMA, env_of, open_client, queue_of
from worker.client import LaneClient
from worker.errors import InvalidRequestError, ReleasesHeldError
from worker.ops.lanes_text import lanes_table


async def test_deploy_then_retire_superseded_moves_the_roles_and_the_lanes(
    database_url: str,
) -> None:
    """A deployed; B deployed (A previous, still claiming); the scaler retires A and a hand lane."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.activate_release("by-hand", force=True)  # an older lane, deployed by hand
        await client.activate_release("dev-mine", force=True)  # a dev lane: never retired here
        a = await client.releases.deploy("rel-a", image="img:a", machines=2)
        assert (a["queue"], a["previous"]) == (queue_of("rel-a"), [])
        await client.activate_release("rel-a", force=True)  # its worker booted
        b = await client.releases.deploy("rel-b", image="img:b", machines=1)
        assert b["previous"] == ["rel-a"]
        views, _ = await client.releases.list()
        assert {v.release_id: v.role for v in views} == {"rel-a": "previous", "rel-b": "current"}
        await client.activate_release("rel-b", force=True)

        retired = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="test")
        )
        assert retired == ["by-hand", "rel-a"]
        lanes = {v.release_id: v.status for v in await client.lanes()}
        views, _ = await client.releases.list()
    assert lanes["rel-a"] == "drained"
    assert lanes["by-hand"] == "drained"
    assert lanes["dev-mine"] == "claiming"
    assert lanes["rel-b"] == "claiming"
    assert {v.release_id: v.role for v in views} == {"rel-a": "retired", "rel-b": "current"}
    events = await fetch(
        database_url,
        f"select release_id, action, actor from {SCHEMA}.deployment_events order by event_id",
    )
    assert [(e["release_id"], e["action"]) for e in events] == [
        ("rel-a", "deployed"), ("rel-b", "deployed"), ("by-hand", "retired"), ("rel-a", "retired"),
    ]  # fmt: skip
    assert all(e["actor"] for e in events)


async def _a_retired_for_b(client: LaneClient, *, machines_a: int) -> None:
    """rel-a deployed and booted, then rel-b; the scaler's step retired rel-a."""
    await client.releases.deploy("rel-a", image="img:a", machines=machines_a)
    await client.activate_release("rel-a", force=True)
    await client.releases.deploy("rel-b", image="img:b")
    await client.activate_release("rel-b", force=True)
    await client.db.run(lambda c: client.store.registry.retire_superseded(c, actor="t"))


async def test_rollback_makes_the_older_lane_claim_again_with_its_recorded_image(
    database_url: str,
) -> None:
    """Roll back to A: A's lane claims again at once; B becomes previous until A is ready."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await _a_retired_for_b(client, machines_a=3)
        said = await client.releases.rollback("rel-a")
        assert (said["image"], said["desired"], said["previous"]) == ("img:a", 3, ["rel-b"])
        lanes = {v.release_id: v.status for v in await client.lanes()}
        assert lanes["rel-a"] == "claiming"
        with pytest.raises(InvalidRequestError, match="is the current release"):
            await client.releases.rollback("rel-a")
        with pytest.raises(InvalidRequestError, match="never deployed through the registry"):
            await client.releases.rollback("rel-zzz")
        state = await client.releases.rollout_state("rel-a")
    assert (state.done, state.reason) == (False, "no active scaler (start `lane-worker scaler`)")


@pytest.mark.parametrize(
    ("release", "image", "machines", "says"),
    [
        ("dev", "img", 1, "not a dev lane"),
        ("dev-x", "img", 1, "not a dev lane"),
        ("rel-a", " ", 1, "needs an image"),
        ("rel-a", "img", 1001, "0..1000 machines"),
        ("r" * 201, "img", 1, "at most 200 characters"),
    ],
)
async def test_a_bad_deploy_is_refused_and_records_nothing(
    database_url: str, release: str, image: str, machines: int, says: str
) -> None:
    async with open_client(database_url, env_of("rel-a")) as client:
        with pytest.raises(InvalidRequestError, match=says):
            await client.releases.deploy(release, image=image, machines=machines)
        views, _ = await client.releases.list()
    assert views == []


async def test_the_report_marks_the_current_release_and_never_says_retire_it(
    database_url: str,
) -> None:
    """The current release's lane: its role and machines shown, no "lanes retire" remedy."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.activate_release("rel-hand", force=True)  # deployed by hand
        await client.releases.deploy("rel-a", image="img:a", machines=2)
        await client.activate_release("rel-a", force=True)
        views = {v.release_id: v for v in await client.lanes()}
    current = views["rel-a"].as_json()
    assert current["release"] == {
        "role": "current", "machinesDesired": 2, "machinesLive": 0, "scaler": "no active scaler",
    }  # fmt: skip
    (claiming,) = current["blockedBy"]
    assert "is the current release" in claiming["remedy"]
    assert "lanes retire" not in claiming["remedy"]
    hand = views["rel-hand"].as_json()
    assert hand["release"]["role"] is None
    assert "lanes retire rel-hand" in hand["blockedBy"][0]["remedy"]


async def test_a_superseded_release_whose_lane_never_registered_is_retired_lane_and_all(
    database_url: str,
) -> None:
    """Its lane is created retired (a late machine cannot claim for ever), and it is recorded."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-slow", image="img:s")  # its machine never booted
        await client.releases.deploy("rel-b", image="img:b")
        await client.activate_release("rel-b", force=True)
        retired = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="t")
        )
        lanes = {v.release_id: v.status for v in await client.lanes(include_pruned=True)}
    assert retired == ["rel-slow"]
    assert lanes["rel-slow"] == "drained"
    events = await fetch(
        database_url,
        f"select action, detail from {SCHEMA}.deployment_events where release_id = 'rel-slow'",
    )
    assert [(e["action"], e["detail"].get("laneRegistered")) for e in events] == [
        ("deployed", None), ("retired", False),
    ]  # fmt: skip


async def test_a_preview_lane_is_never_deployed_over(database_url: str) -> None:
    """A release id whose queue a dev-<suffix> worker serves is refused; so is any DEV spelling."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.activate_release("dev-bob", force=True)
        with pytest.raises(InvalidRequestError, match="a dev or preview worker serves"):
            await client.releases.deploy("bob", image="img")
        with pytest.raises(InvalidRequestError, match="not a dev lane"):
            await client.releases.deploy("DEV", image="img")


async def test_a_rollback_to_a_pruned_lane_makes_it_claim_and_show_again(
    database_url: str,
) -> None:
    """A's lane retired and pruned (its history kept): `releases` says drained, not draining;
    a rollback to A clears the prune mark with the retirement, so the lane shows again and can
    be pruned again once retired."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await _a_retired_for_b(client, machines_a=1)
        await client.db.execute(
            f"update {SCHEMA}.releases set pruned_at = now() where queue = $1", queue_of("rel-a")
        )  # as `lanes prune` leaves it
        views, _ = await client.releases.list()
        assert {v.release_id: v.status for v in views}["rel-a"] == "drained"

        await client.releases.rollback("rel-a")
        lanes = {v.release_id: (v.status, v.pruned) for v in await client.lanes()}
    assert lanes["rel-a"] == ("claiming", False)
    [row] = await fetch(
        database_url,
        f"select status, pruned_at from {SCHEMA}.releases where queue = $1",
        queue_of("rel-a"),
    )
    assert (row["status"], row["pruned_at"]) == ("claiming", None)


async def test_waiting_for_a_rollout_that_cannot_finish_ends_at_once(database_url: str) -> None:
    """A deploy superseded by another, or one with 0 machines that supersedes a release: the
    wait says why at once instead of waiting out its timeout."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a")
        await client.releases.deploy("rel-b", image="img:b", machines=0)
        superseded = await client.releases.wait_rolled_out("rel-a", timeout_s=600)
        nothing = await client.releases.wait_rolled_out("rel-b", timeout_s=600)
    assert (superseded.done, superseded.final) == (False, True)
    assert superseded.reason == "release 'rel-a' is no longer the current release"
    assert (nothing.done, nothing.final) == (False, True)
    assert nothing.reason is not None
    assert "deployed with 0 machines" in nothing.reason


async def test_a_deployed_release_with_no_worker_yet_is_reported(database_url: str) -> None:
    """B deployed but none of its machines booted: the report lists its lane as the current
    release, claiming, 0 of 1 machines live, not safe to stop; A stays listed too."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a")
        await client.activate_release("rel-a", force=True)
        await client.releases.deploy("rel-b", image="img:b")
        views = {v.release_id: v for v in await client.lanes()}
    b = views["rel-b"]
    assert (b.queue, b.status, b.role) == (queue_of("rel-b"), "claiming", "current")
    assert (b.machines_live, b.machines_desired, b.live_workers) == (0, 1, 0)
    assert not b.safe_to_stop
    assert views["rel-a"].role == "previous"


async def test_a_deploy_during_a_pass_keeps_what_it_supersedes_claiming(
    database_url: str,
) -> None:
    """The scaler saw B current and ready; C is deployed before it retires: nothing is
    retired on B's word (C has no machine), and B's word on its own deploy still counts."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a")
        await client.activate_release("rel-a", force=True)
        await client.releases.deploy("rel-b", image="img:b")
        await client.activate_release("rel-b", force=True)
        seen = await client.db.run(client.store.registry.deployments)
        b = next(d for d in seen if d.release_id == "rel-b")
        await client.releases.deploy("rel-c", image="img:broken")
        stale = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="t", current=b)
        )
        await client.releases.deploy("rel-b", image="img:b2")  # B again: a new deploy of it
        again = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="t", current=b)
        )
        lanes = {v.release_id: v.status for v in await client.lanes()}
    assert stale == []
    assert again == []
    assert lanes["rel-a"] == "claiming"
    assert lanes["rel-b"] == "claiming"


async def test_a_current_release_without_workers_that_holds_runs_is_stranded(
    database_url: str,
) -> None:
    """Rolled back to (or scaled to 0) with no machine running it: its lane claims, so
    nothing newer adopts its runs; the report calls it stranded and says what to do."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a", machines=0)
        await client.activate_release("rel-a", force=True)  # its lane claims (a rollback)
        await client.submit("plain", {"n": 1})
        [a] = [v for v in await client.lanes() if v.release_id == "rel-a"]
        table = "\n".join(lanes_table([a]))
    assert (a.status, a.live_workers, a.stranded) == ("claiming", 0, True)
    assert [b.reason for b in a.blocked_by] == ["fresh"]
    assert "no live worker of rel-a: start one of its machines" in a.blocked_by[0].remedy
    assert "rel-a: blocked by fresh (1)" in table, table


async def test_a_hold_refuses_deploys_and_rollbacks_and_stops_retirement_until_resumed(
    database_url: str,
) -> None:
    """`releases hold`: a deploy or rollback is refused (one sentence naming the way out),
    forced ones go; the scaler's retirement retires nothing; resume undoes all of it."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a")
        await client.activate_release("rel-a", force=True)
        held = await client.releases.hold("incident 42")
        assert (held["heldBy"], held["reason"], held["already"]) == (
            held["heldBy"], "incident 42", False,
        )  # fmt: skip
        again = await client.releases.hold("another reason")
        assert (again["reason"], again["already"]) == ("incident 42", True)
        with pytest.raises(ReleasesHeldError) as refused:
            await client.releases.deploy("rel-b", image="img:b")
        said = str(refused.value)
        assert said.startswith("the deploy of rel-b refused: releases are held by ")
        assert "reason: incident 42" in said
        assert "releases resume" in said
        assert "--force" in said
        views, _ = await client.releases.list()
        assert [v.release_id for v in views] == ["rel-a"]  # nothing recorded
        forced = await client.releases.deploy("rel-b", image="img:b", force=True)
        assert forced["previous"] == ["rel-a"]
        # The timeline says the hold was overridden, and whose it was (store 0040).
        events = await client.db.run(lambda c: client.store.registry.events(c, release_id=None))
        deployed = {e.release_id: e.detail for e in events if e.action == "deployed"}
        assert deployed["rel-b"]["forcedThroughHold"] == {
            "heldBy": held["heldBy"], "reason": "incident 42",
        }  # fmt: skip
        assert "forcedThroughHold" not in deployed["rel-a"]
        await client.activate_release("rel-b", force=True)
        b = next(d for d in await client.db.run(client.store.registry.deployments)
                 if d.release_id == "rel-b")  # fmt: skip
        retired = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="t", current=b)
        )
        assert retired == []
        state = await client.releases.rollout_state("rel-b")
        assert not state.done
        assert "held by" in str(state.reason)
        with pytest.raises(ReleasesHeldError, match="the rollback to rel-a refused"):
            await client.releases.rollback("rel-a")
        assert await client.releases.resume()
        assert not await client.releases.resume()
        assert await client.releases.held() is None
        retired = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="t", current=b)
        )
        lanes = {v.release_id: v.status for v in await client.lanes()}
    assert retired == ["rel-a"]
    assert lanes["rel-a"] == "drained"
    events = await fetch(
        database_url,
        f"select release_id, action from {SCHEMA}.deployment_events order by event_id",
    )
    assert [(e["release_id"], e["action"]) for e in events] == [
        ("rel-a", "deployed"), ("", "held"), ("rel-b", "deployed"), ("", "resumed"),
        ("rel-a", "retired"),
    ]  # fmt: skip


async def test_a_blank_hold_reason_is_kept_as_none_and_a_reason_trimmed(database_url: str) -> None:
    """`releases hold --reason '  '` keeps no reason, not spaces `releases` would show."""
    async with open_client(database_url, env_of("rel-a")) as client:
        assert (await client.releases.hold("  \t "))["reason"] is None
        held = await client.releases.held()
        assert held is not None
        assert held.reason is None
        assert await client.releases.resume()
        assert (await client.releases.hold("  incident 7 "))["reason"] == "incident 7"


async def test_a_hold_holds_an_older_builds_deploys_and_retirements_too(database_url: str) -> None:
    """What `releases deploy` and the scaler of 0.2.1 call (deploy_release, retire_superseded)
    is refused while held (55000): a hold holds whoever's build acts."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a")
        await client.activate_release("rel-a", force=True)
        await client.releases.deploy("rel-b", image="img:b")
        await client.releases.hold("freeze")
        for older in (
            f"select {SCHEMA}.deploy_release('rel-x', 'img', 1, 'old-cli', 'deployed')",
            f"select {SCHEMA}.retire_superseded('old-scaler')",
        ):
            with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="held by"):
                await client.db.run(lambda c, q=older: c.fetchval(q))  # type: ignore[misc]
        views, _ = await client.releases.list()
        assert {v.release_id: v.role for v in views} == {"rel-a": "previous", "rel-b": "current"}
        forced = await client.releases.deploy("rel-c", image="img:c", force=True)
        assert forced["previous"] == ["rel-b"]
        # Forced once, not for the rest of the transaction: the next write is held again.
        with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError):
            await client.db.transaction(
                lambda c: c.fetchval(
                    f"select {SCHEMA}.deploy_release_checked('rel-d', 'img', 1, 'a', "
                    f"'deployed', true), {SCHEMA}.retire_superseded('old-scaler')"
                )
            )
