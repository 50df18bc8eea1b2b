"""The lane follower's claim policy in real daemons: retire, adoption, activate again.

A review of issue 30 item 4 (the claim policy a lane follower publishes): A's
worker must claim nothing its retired lane gave away (B adopts A's parked run
when it comes due), and `lanes activate A` makes A's worker claim its own
lane's new runs again, with no restart.
"""

from __future__ import annotations

import pytest

from support.cli import lane_worker_json
from support.daemon import Daemons, queue_of
from support.runtime import open_client

A, B = "pf-a", "pf-b"  # as deployed
# How the workers name their release: as deployed (issue 31 §1), not rel_a.
A_ID = A
B_ID = B
QA = queue_of(A)


@pytest.mark.timeout(240)
async def test_a_retired_lane_leaves_its_parked_run_to_the_adopter_and_claims_again_once_active(
    database_url: str,
) -> None:
    async with Daemons(database_url) as pool:
        a = pool.start(A, name="A")
        await a.ready()  # A's lane registers first: B is the newer release
        b = pool.start(B, name="B")
        await b.ready()
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A}) as client:
            # A runs the first step and parks for a few seconds.
            run = await client.submit("sleeper", {"seconds": 6})
            await a.wait_for("run.parked", run_id=run.run_id, timeout_s=60)

            retired = await lane_worker_json(database_url, "lanes", "retire", A)
            assert (retired["queue"], retired["status"]) == (QA, "retired")
            await b.wait_for("loop.attached", queue=QA, timeout_s=60)

            # When the sleep is over, B adopts the run; A claims nothing it gave away.
            await b.wait_for("run.completed", run_id=run.run_id, timeout_s=120)
            status = await client.status(run.run_id)
            assert [(x.release_id, x.disposition, x.outcome) for x in status.attempts] == [
                (A_ID, "own", "parked"),
                (B_ID, "adopt", "completed"),
            ]
            assert not a.events("run.started", run_id=run.run_id)[1:]

            # Active again: A's own loop claims its lane's new runs, no restart.
            activated = await lane_worker_json(database_url, "lanes", "activate", A)
            assert activated["status"] == "claiming", activated
            await a.wait_for("lane.activated", timeout_s=60)
            again = await client.submit("plain", {"n": 2})
            await a.wait_for("run.completed", run_id=again.run_id, timeout_s=60)
            status = await client.status(again.run_id)
            assert [(x.release_id, x.disposition) for x in status.attempts] == [(A_ID, "own")]
