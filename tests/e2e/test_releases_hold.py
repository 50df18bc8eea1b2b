"""`lane-worker releases hold` / `resume` from the command line, as an operator runs them."""

from __future__ import annotations

from support.cli import lane_worker, lane_worker_json, one_error_line


async def test_hold_is_shown_refuses_a_deploy_in_one_line_and_resume_ends_it(
    database_url: str,
) -> None:
    held = await lane_worker_json(database_url, "releases", "hold", "--reason", "bad gate")
    assert (held["reason"], held["alreadyHeld"]) == ("bad gate", False)
    # Held again with another reason: said, and said that the new reason is not kept.
    twice = await lane_worker(database_url, "releases", "hold", "--reason", "another")
    assert twice.returncode == 0, twice.stderr
    assert "were already held by " in twice.stdout
    assert ": bad gate. Your reason was not kept" in twice.stdout
    listed = await lane_worker(database_url, "releases")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("HELD by "), listed.stdout
    assert ": bad gate (the scaler changes no current release;" in listed.stdout
    report = await lane_worker_json(database_url, "releases")
    assert report["hold"]["reason"] == "bad gate"
    refused = await lane_worker(database_url, "releases", "deploy", "rel-h", "--image", "img")
    assert refused.returncode == 1
    line = one_error_line(refused)
    assert "the deploy of rel-h refused: releases are held by " in line
    assert "`lane-worker releases resume` ends the hold, or pass --force." in line
    forced = await lane_worker_json(
        database_url, "releases", "deploy", "rel-h", "--image", "img", "--force"
    )
    assert forced["releaseId"] == "rel-h"
    assert (await lane_worker_json(database_url, "releases", "resume")) == {"resumed": True}
    assert (await lane_worker_json(database_url, "releases"))["hold"] is None
    again = await lane_worker(database_url, "releases", "resume")
    assert again.stdout.strip() == "the releases were not held: nothing to resume."


async def test_releases_text_during_a_hold_is_short_and_says_each_thing_once(
    database_url: str,
) -> None:
    """No pid on the hold; a superseded release says why it still claims under the table;
    a --wait that cannot roll out says why once (stderr), not on stdout too; JSON keeps
    its fields (status keeps its long form)."""
    for release in ("rel-a", "rel-b"):
        deployed = await lane_worker(database_url, "releases", "deploy", release, "--image", "i")
        assert deployed.returncode == 0, deployed.stderr
    held = await lane_worker_json(database_url, "releases", "hold", "--reason", "freeze")
    assert "(pid" not in held["heldBy"]
    listed = await lane_worker(database_url, "releases")
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"HELD by {held['heldBy']} since "), lines
    assert "(pid" not in listed.stdout
    (row,) = [line for line in lines if line.startswith("rel-a ")]
    assert row.split()[:2] == ["rel-a", "superseded"]
    assert (
        "rel-a: superseded, still claiming: the releases are held, so the scaler retires "
        "nothing until `lane-worker releases resume`"
    ) in lines
    report = await lane_worker_json(database_url, "releases")
    (old,) = [r for r in report["releases"] if r["releaseId"] == "rel-a"]
    assert old["status"] == "superseded (claims until the current release is ready)"

    waited = await lane_worker(
        database_url, "releases", "deploy", "rel-c", "--image", "i", "--force", "--wait",
        "--timeout", "0.5",
    )  # fmt: skip
    assert waited.returncode == 1
    assert waited.stdout.splitlines() == [
        "release rel-c is current (queue runs_rel_c, 1 machine); superseded: rel-b."
    ]
    assert one_error_line(waited).startswith("lane-worker: release rel-c did not roll out")
