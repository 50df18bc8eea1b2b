"""A hotfix (the current release deployed again) says what it does, not "superseded: none"
(issue 31): it supersedes nothing; its machines on the old image are replaced."""

from __future__ import annotations

import json

from support.cli import lane_worker


async def deploy(database_url: str, *args: str) -> str:
    done = await lane_worker(database_url, "releases", "deploy", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_current_release_deployed_again_says_what_changes(database_url: str) -> None:
    first = await deploy(database_url, "rel-h", "--image", "i:1")
    assert "superseded: none." in first, first

    hotfix = await deploy(database_url, "rel-h", "--image", "i:2")
    assert "superseded: none" not in hotfix, hotfix
    assert "same release, new image; its machines on i:1 are replaced" in hotfix, hotfix

    scaled = await deploy(database_url, "rel-h", "--image", "i:2", "--machines", "3")
    assert "only its machine count changed (was 1)" in scaled, scaled

    again = await deploy(database_url, "rel-h", "--image", "i:2", "--machines", "3")
    assert "nothing changes" in again, again

    said = json.loads(await deploy(database_url, "rel-h", "--image", "i:3", "--json"))
    assert said["redeployedFrom"] == {"image": "i:2", "desired": 3}
    assert said["previous"] == []

    other = json.loads(await deploy(database_url, "rel-j", "--image", "j:1", "--json"))
    assert other["redeployedFrom"] is None
    assert other["previous"] == ["rel-h"]
