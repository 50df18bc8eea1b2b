"""The scaler connecting as its own least role (issue 33), end to end, process backend.

The owner migrates, applies ``lane-worker roles`` and records deploys (``releases
deploy`` is the operator's); the scaler (a real process) connects as a login member
of the scaler role, which reads the registry and the drain report but no run's
input. Its machines connect as the worker role's login
(``LANE_WORKER_MACHINE_POSTGRES``). Release A's machine comes up; B is deployed: the
scaler starts B's, retires A once B is ready and removes A's machine once A is
drained (read through the report's owner-rights functions, store 0049).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from support.machines import destroy_all, store_backend
from support.roles import Logins, made_roles
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import events, start_scaler
from worker.client import LaneClient

APP = "support.apps.basic:app"


@pytest.fixture
def logins(database_url: str) -> Iterator[Logins]:
    with made_roles(database_url) as made:
        yield made


async def _ready(client: LaneClient, release: str) -> bool:
    views, _ = await client.releases.list()
    return any(v.release_id == release and v.ready_workers >= 1 for v in views)


async def test_a_scaler_role_deploys_and_stops_a_drained_release(
    database_url: str, logins: Logins, tmp_path: Path
) -> None:
    state, log = tmp_path / "machines", tmp_path / "scaler.log"
    scaler = start_scaler(
        logins.urls["scaler"],
        state,
        log,
        LANE_WORKER_MACHINE_POSTGRES=logins.urls["worker"],
    )
    owner = await asyncpg.connect(database_url)
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "least-a"}) as c:
            backend = await store_backend(database_url, state)
            await c.releases.deploy("least-a", image=APP, machines=1)
            await eventually(lambda: _ready(c, "least-a"), timeout_s=90, what="A's machine")
            run_id = (await c.submit("sleeper", {"seconds": 1})).run_id
            assert (await c.wait(run_id, 60)).status == "completed"
            # The machine's worker connected as the worker's login, the scaler as its own.
            users = await owner.fetch(
                "select distinct usename from pg_stat_activity where usename like $1",
                f"{logins.prefix}%",
            )
            assert sorted(r[0] for r in users) == [
                f"{logins.prefix}_scaler_login",
                f"{logins.prefix}_worker_login",
            ]
            await c.releases.deploy("least-b", image=APP, machines=1)
            rolled = await c.releases.wait_rolled_out("least-b", timeout_s=90)
            assert rolled.done, rolled.reason

            async def a_removed() -> bool:
                return not [m for m in await backend.list() if m.release_id == "least-a"]

            await eventually(a_removed, timeout_s=90, what="A's machine removed once drained")
        steps = [
            (r["release_id"], r["action"])
            for r in await owner.fetch(
                f"select release_id, action from {SCHEMA}.deployment_events order by event_id"
            )
        ]
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await destroy_all(state)
        await owner.close()
    assert ("least-a", "retired") in steps
    assert ("least-a", "machine_stopped") in steps
    said = events(log)
    refused = [e for e in said if "permission denied" in str(e)]
    assert refused == [], refused[:3]
