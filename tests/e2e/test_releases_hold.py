"""`lane-worker releases hold` / `resume` from the command line, as an operator runs them."""

from __future__ import annotations

from support.cli import lane_worker, lane_worker_json, one_error_line


async def test_hold_is_shown_refuses_a_deploy_in_one_line_and_resume_ends_it(
    database_url: str,
) -> None:
    held = await lane_worker_json(database_url, "releases", "hold", "--reason", "bad gate")
    assert (held["reason"], held["alreadyHeld"]) == ("bad gate", False)
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
