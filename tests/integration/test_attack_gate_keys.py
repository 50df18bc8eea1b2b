"""Attack on the deploy gate's owner-rights functions (store 0051), as the scaler role.

Found by the attack round of 2026-12-07 and fixed in 0051 before it landed:
gate_run_status and gate_cancel_run took any run whose idempotency key starts with
``lane-worker-gate:``, which the app (or an end user whose key the app passes on) may
choose for an ordinary run; gate_submit_run took any play and input on a candidate's
lane, not only the deployment's gate runs; a failed gate run's error was copied into
``deployments.gate_reason``, which the viewer reads.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import asyncpg
import pytest

from support.roles import Logins, deploy_gated, made_roles, sqlstate_of
from support.runtime import SCHEMA, open_client
from worker.scaler.gate import Gates

DENIED = "42501"
GATED, CURRENT = "rel-gated", "rel-now"

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


async def test_the_scaler_cannot_reach_an_app_run_keyed_like_a_gate_run(
    logins: Logins, owner: Conn
) -> None:
    await deploy_gated(owner, CURRENT, None)
    await deploy_gated(owner, GATED, [{"play": "smoke", "input": {}}])
    app = await asyncpg.connect(logins.urls["app"])
    scaler = await asyncpg.connect(logins.urls["scaler"])
    try:
        said = json.loads(
            await app.fetchval(
                f"select {SCHEMA}.submit_run('payroll', '{{\"secret\": 1}}'::jsonb, $1, $2)",
                CURRENT,
                "lane-worker-gate:user-chosen-key",
            )
        )
        run_id = uuid.UUID(said["runId"])
        for sql in (
            f"select {SCHEMA}.gate_run_status($1)",
            f"select {SCHEMA}.gate_cancel_run($1, 'scaler')",
        ):
            assert await sqlstate_of(scaler, sql, run_id) == DENIED, sql
        status = await owner.fetchval(f"select status from {SCHEMA}.runs where run_id = $1", run_id)
        assert status == "queued"
    finally:
        await app.close()
        await scaler.close()


async def test_the_scaler_submits_only_the_deployment_s_gate_runs(
    logins: Logins, owner: Conn
) -> None:
    await deploy_gated(owner, CURRENT, None)
    await deploy_gated(owner, GATED, [{"play": "smoke", "input": {}}])
    scaler = await asyncpg.connect(logins.urls["scaler"])
    try:
        submit = f"select {SCHEMA}.gate_submit_run($1, $2, $3, $4)"
        deployed = {
            r["release_id"]: r["deployed_at"]
            for r in await owner.fetch(f"select release_id, deployed_at from {SCHEMA}.deployments")
        }
        at = deployed[GATED]
        key = f"lane-worker-gate:{GATED}:x:0:smoke"
        for release, when, index, chosen in (
            (GATED, at, 1, key),  # no such gate run
            (GATED, at, -1, key),
            (GATED, at, 0, f"lane-worker-gate:{CURRENT}:x:0:smoke"),  # another release's key
            (GATED, at, 0, "my-own-key"),
            (GATED, deployed[CURRENT], 0, key),  # not this deployment
            (CURRENT, deployed[CURRENT], 0, f"lane-worker-gate:{CURRENT}:x:0:smoke"),
        ):
            assert await sqlstate_of(scaler, submit, release, when, index, chosen) == DENIED, chosen
        assert await owner.fetchval(f"select count(*) from {SCHEMA}.runs") == 0
    finally:
        await scaler.close()


async def test_the_viewer_reads_no_gate_run_s_error(logins: Logins, owner: Conn) -> None:
    await deploy_gated(owner, CURRENT, None)
    await deploy_gated(owner, GATED, [{"play": "smoke", "input": {}}])
    # A ready machine of the candidate, as its worker records it, so the gate begins.
    await owner.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid, concurrency,"
        " plays, ready_at) values ('w-gate', $1, 'runs_rel_gated', 'h', 1, 1, '{smoke}', now())",
        GATED,
    )

    async def no_guard() -> None:
        return None

    async with open_client(logins.urls["scaler"], {}) as client:
        gates = Gates(client, actor="test", guard=no_guard)
        await gates.once()  # submits the gate run
        secret = "password=hunter2-in-an-exception"
        await owner.execute(
            f"update {SCHEMA}.runs set status = 'failed', finished_at = now(),"
            " error = jsonb_build_object('name', 'RuntimeError', 'message', $1::text)"
            " where idempotency_key like 'lane-worker-gate:%'",
            secret,
        )
        await gates.once()  # the gate fails
    viewer = await asyncpg.connect(logins.urls["viewer"])
    try:
        outcome, reason = await viewer.fetchrow(
            f"select gate_outcome, gate_reason from {SCHEMA}.deployments where release_id = $1",
            GATED,
        )
    finally:
        await viewer.close()
    assert outcome == "failed"
    assert "hunter2" not in (reason or ""), reason
