"""Adversarial review of issue 34 item 5: a retired lane without LISTEN, woken by its clock.

The shipped test wakes A's parked runs with an event; here they wake on their own (a
durable sleep that ends after the retirement), while A, in PgBouncer mode, has not yet
refreshed its lanes. `lanes wait A` must agree with the claims: once it exits 0, no run
is left for A, and A starts none of them again.
"""

from __future__ import annotations

import pytest

from support.cli import lane_worker
from support.daemon import Daemons
from support.db import all_ended, attempt_rows, statuses
from support.runtime import eventually, open_client

A, B = "lw-atk-wake-a", "lw-atk-wake-b"
# How the workers name their release: as deployed (issue 31 §1), not rel_a.
A_ID = A
B_ID = B
NO_LISTEN = {"LANE_WORKER_PGBOUNCER": "1", "LANE_WORKER_POLL_INTERVAL": "0.2"}
SLEEPERS = 4


@pytest.mark.parametrize(
    ("play", "params"), [("sleeper", {"seconds": 4}), ("short-waiter", {"timeout": 4})]
)
async def test_runs_that_wake_after_a_retirement_without_listen_go_to_the_newer(
    database_url: str, play: str, params: dict[str, float]
) -> None:
    """A durable sleep, or an event wait's timeout, ends after `lanes retire A` (A has not
    refreshed its lanes): each run's next attempt is B's, and `lanes wait A` said drained."""
    async with Daemons(database_url) as pool:
        a = pool.start(A, name="A", **NO_LISTEN)
        await a.ready()
        b = pool.start(B, name="B", **NO_LISTEN)
        await b.ready()
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A}) as client:
            runs = [(await client.submit(play, params)).run_id
                    for _ in range(SLEEPERS)]  # fmt: skip

        async def all_parked() -> bool:
            found = await statuses(database_url, runs)
            return bool(found) and set(found.values()) <= {"waiting", "sleeping"}

        await eventually(all_parked, what="A's sleepers to park")
        retired = await lane_worker(database_url, "lanes", "retire", A)
        assert retired.returncode == 0, retired.stderr
        waited = await lane_worker(database_url, "lanes", "wait", A, "--timeout", "30")
        assert waited.returncode == 0, waited.stderr
        await all_ended(database_url, runs)
        for run_id in runs:
            rows = await attempt_rows(database_url, run_id)
            got = [(r["release_id"], r["disposition"], r["outcome"]) for r in rows]
            assert got[0][0] == A_ID, (run_id, got)
            assert all(r[0] == B_ID for r in got[1:]), (run_id, got)
            assert got[-1][2] == "completed", (run_id, got)
        assert not a.events("loop.claim_failed")
        assert not b.events("loop.claim_failed")
