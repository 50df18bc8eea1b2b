"""Reading the drain report in assertions: its buckets, its blockers, their remedies.

The same helpers read ``LaneClient.lanes()`` (as ``as_json()``), ``lane-worker lanes
--json`` and a daemon's ``/lanes``: all three print one shape.
"""

from __future__ import annotations

import json
from typing import Any

from worker.client import LaneClient

# The bucket names, spelled out here so that a renamed key fails.
BUCKETS = ("inFlight", "fresh", "retrying", "handedBack", "parkedSleep", "parkedEvent")
AGES = ("oldestWaitSeconds", "oldestDeferralSeconds")
COUNT_KEYS = {*BUCKETS, "deferred", *AGES, "adoptedBy"}


def counts(lane: dict[str, Any]) -> dict[str, int]:
    """Return a lane's bucket counts and its deferred count."""
    assert set(lane["counts"]) == COUNT_KEYS, lane["counts"]
    return {key: lane["counts"][key] for key in (*BUCKETS, "deferred")}


def expected(**given: int) -> dict[str, int]:
    """Return the counts of a lane holding ``given`` (every other bucket 0)."""
    unknown = set(given) - {*BUCKETS, "deferred"}
    assert not unknown, unknown
    return {**dict.fromkeys((*BUCKETS, "deferred"), 0), **given}


def blockers(lane: dict[str, Any]) -> list[tuple[str, int, list[str]]]:
    """Return a lane's blockers as (reason, count, run ids)."""
    for blocker in lane["blockedBy"]:
        assert set(blocker) == {"reason", "count", "remedy", "runIds"}, blocker
    return [(b["reason"], b["count"], b["runIds"]) for b in lane["blockedBy"]]


def claiming_blockers(lane: dict[str, Any], runs: list[tuple[str, int, list[str]]]) -> None:
    """Assert a claiming lane is blocked by `claiming` first.

    What else it lists is not specified for a claiming lane (its own workers run
    everything on it); if it lists its runs, they must be exactly ``runs``.
    """
    found = blockers(lane)
    assert found[0] == ("claiming", 0, []), found
    assert found[1:] in ([], runs), found


def remedies(lane: dict[str, Any]) -> dict[str, str]:
    """Return a lane's remedies by reason."""
    return {b["reason"]: b["remedy"] for b in lane["blockedBy"]}


async def lanes_json(client: LaneClient) -> dict[str, dict[str, Any]]:
    """Return the report as `lane-worker lanes --json` prints it, by queue."""
    report = {view.queue: view.as_json() for view in await client.lanes()}
    # What the CLI and /lanes print must survive a JSON round trip unchanged.
    assert json.loads(json.dumps(report)) == report
    return report
