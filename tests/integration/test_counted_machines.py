"""Counts of machines read as English: "1 machine", "2 machines" (issue 31: "1 machines")."""

from __future__ import annotations

from support.cli import lane_worker
from worker.errors import counted


def test_counted_is_singular_only_for_one() -> None:
    assert [counted(n, "machine") for n in (0, 1, 2)] == ["0 machines", "1 machine", "2 machines"]


async def test_deploy_says_one_machine(database_url: str) -> None:
    one = await lane_worker(database_url, "releases", "deploy", "rel-one", "--image", "i:1")
    assert one.returncode == 0, one.stderr
    assert "(queue runs_rel_one, 1 machine); superseded: none." in one.stdout, one.stdout
    two = await lane_worker(
        database_url, "releases", "deploy", "rel-two", "--image", "i:2", "--machines", "2"
    )
    assert two.returncode == 0, two.stderr
    assert "(queue runs_rel_two, 2 machines); superseded: rel-one." in two.stdout, two.stdout
