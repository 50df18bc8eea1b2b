"""A deploy gate with least roles, and a candidate that adopts nothing (store 0051).

The scaler's role may call no SQL API, yet drives a gate's runs: the store's gate
functions take only a candidate's gate keys and gate runs. The app's role may call
none of the gate's functions. A gating candidate's lane is older than nothing and
newer than nothing until it is promoted, so its machines adopt no parked run of a
draining release (its code is not proven yet).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import asyncpg
import pytest

from support.roles import Logins, deploy_gated, made_roles, sqlstate_of
from support.runtime import SCHEMA
from worker.db.store import Store

DENIED = "42501"
GATED, CURRENT = "rel-gated", "rel-now"
QG, QC = "runs_rel_gated", "runs_rel_now"

if TYPE_CHECKING:
    Conn = asyncpg.Connection[asyncpg.Record]


@pytest.fixture
def logins(database_url: str) -> Iterator[Logins]:
    with made_roles(database_url) as made:
        yield made


@pytest.fixture
async def owner(database_url: str) -> AsyncIterator[Conn]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def test_the_scaler_drives_only_a_candidate_s_gate_runs(logins: Logins, owner: Conn) -> None:
    await deploy_gated(owner, CURRENT, None)
    await deploy_gated(owner, GATED, [{"play": "smoke", "input": {}}])
    scaler = await asyncpg.connect(logins.urls["scaler"])
    app = await asyncpg.connect(logins.urls["app"])
    try:
        submit = f"select {SCHEMA}.gate_submit_run($1, $2, $3, $4)"
        at = await owner.fetchval(
            f"select deployed_at from {SCHEMA}.deployments where release_id = $1", GATED
        )
        # Not a gate key, or another release's key (the deployment's own gate otherwise).
        for key in ("my-own-key", f"lane-worker-gate:{CURRENT}:1:0:smoke"):
            assert await sqlstate_of(scaler, submit, GATED, at, 0, key) == DENIED, key
        key = f"lane-worker-gate:{GATED}:1:0:smoke"
        said = json.loads(await scaler.fetchval(submit, GATED, at, 0, key))
        again = json.loads(await scaler.fetchval(submit, GATED, at, 0, key))
        assert again == {**said, "created": False}
        run_id = uuid.UUID(said["runId"])
        assert (said["created"], said["queue"]) == (True, QG)
        status = json.loads(await scaler.fetchval(f"select {SCHEMA}.gate_run_status($1)", run_id))
        assert (status["status"], status["maxAttempts"]) == ("queued", 1)
        # Any other run is refused to it, through the gate's functions and the API.
        other = json.loads(
            await owner.fetchval(f"select {SCHEMA}.submit_run('work', '{{}}'::jsonb, $1)", CURRENT)
        )
        other_id = uuid.UUID(other["runId"])
        for sql in (
            f"select {SCHEMA}.gate_run_status($1)",
            f"select {SCHEMA}.gate_cancel_run($1, 'no')",
            f"select {SCHEMA}.run_status($1)",
        ):
            assert await sqlstate_of(scaler, sql, other_id) == DENIED, sql
        cancelled = await scaler.fetchval(f"select {SCHEMA}.gate_cancel_run($1, 'test')", run_id)
        assert cancelled is not None
        assert await owner.fetchval(
            f"select status from {SCHEMA}.runs where run_id = $1", run_id
        ) == "cancelled"  # fmt: skip
        # The app may call none of the gate's functions.
        for sql, args in (
            (submit, (GATED, at, 0, f"lane-worker-gate:{GATED}:2:0:smoke")),
            (f"select {SCHEMA}.gate_run_status($1)", (run_id,)),
            (f"select {SCHEMA}.gate_begun($1, now())", (GATED,)),
            (f"select {SCHEMA}.retire_candidate_lane($1, $2)", (GATED, QG)),
        ):
            assert await sqlstate_of(app, sql, *args) == DENIED, sql
    finally:
        await scaler.close()
        await app.close()


async def test_a_gating_candidate_adopts_nothing_until_it_is_promoted(owner: Conn) -> None:
    store = Store(SCHEMA)
    # An older release, retired (draining), then the current one, then the candidate.
    for release, queue in (("rel-old", "runs_rel_old"), (CURRENT, QC), (GATED, QG)):
        await store.lanes.register(owner, queue=queue, release_id=release)
    await store.lanes.set_status(
        owner, queue="runs_rel_old", status="retired", release_id="rel-old"
    )
    await deploy_gated(owner, CURRENT, None)
    await deploy_gated(owner, GATED, [{"play": "smoke", "input": {}}])

    async def older(a: str, b: str) -> bool:
        return bool(await owner.fetchval(f"select {SCHEMA}.lane_older($1, $2)", a, b))

    assert await older("runs_rel_old", QC)  # the current release adopts from it
    assert not await older("runs_rel_old", QG)  # the candidate does not
    offered = [lane.queue for lane in await store.lanes.registry(owner, own_queue=QG)
               if lane.older_than_mine]  # fmt: skip
    assert offered == []  # no continuation loop attaches
    # Promoted: it adopts as any release does.
    await owner.execute(
        f"update {SCHEMA}.deployments set role = 'previous' where release_id = $1", CURRENT
    )
    await owner.execute(
        f"update {SCHEMA}.deployments set role = 'current' where release_id = $1", GATED
    )
    assert await older("runs_rel_old", QG)
