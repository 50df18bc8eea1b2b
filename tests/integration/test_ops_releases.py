"""The release registry (worker/ops/releases.py, store migration 0012) on real Postgres.

``deploy`` records the current release and demotes the former one to previous;
``retire_superseded`` (the scaler's step once the current release is ready)
retires, in one transaction, every previous release and every older claiming lane
deployed by hand, never a dev lane; a rollback makes a retired lane claim again.
"""

from __future__ import annotations

import pytest

from support.db import fetch
from support.runtime import SCHEMA, env_of, open_client, queue_of
from worker.errors import InvalidRequestError


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


async def test_rollback_makes_the_older_lane_claim_again_with_its_recorded_image(
    database_url: str,
) -> None:
    """Roll back to A: A's lane claims again at once; B becomes previous until A is ready."""
    async with open_client(database_url, env_of("rel-a")) as client:
        await client.releases.deploy("rel-a", image="img:a", machines=3)
        await client.activate_release("rel-a", force=True)
        await client.releases.deploy("rel-b", image="img:b")
        await client.activate_release("rel-b", force=True)
        await client.db.run(lambda c: client.store.registry.retire_superseded(c, actor="t"))
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
