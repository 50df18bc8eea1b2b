"""Each claim statement's begun attempts carry the claimer's release and worker id, not swapped.

A review of issue 30 item 8 (SQL parameters as frozen dataclasses, ``rows.args_of``):
``_ClaimNext`` and ``_OwnClaim`` each hold two adjacent ``str`` fields, the begun
attempts' release and worker id. ``test_sql_params`` holds only their count, and
swapping either pair left every claim test green (mutation run, 2026-12-07): the
attempts would name the worker as their release. Here each way the own loop
claims (the static statement; claim_next_v2 in mode 'own', as after it met a
foreign adoptee) begins an attempt, and its row is read back.
"""

from __future__ import annotations

import pytest

from support.runtime import SCHEMA, connect, open_client
from worker.db import engine

RELEASE = "rel-cp"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_cp"
BEGIN_RELEASE = "rel_cp"
BEGIN_WORKER = "claim-params-worker:own"


@pytest.mark.parametrize("mode", [None, engine.CLAIM_OWN])
async def test_a_begun_attempt_names_the_claimers_release_and_worker(
    database_url: str, mode: str | None
) -> None:
    async with open_client(database_url, ENV) as client:
        run = await client.submit("one", {"n": 1})
    conn = await connect(database_url)
    try:
        batch = await engine.claim(
            conn,
            QUEUE,
            BEGIN_WORKER,
            lease_s=30,
            qty=1,
            mode=mode,
            store_schema=SCHEMA,
            own_queue=QUEUE,
            plays=["one"],
            with_lanes=True,
            begin=engine.BeginOwn(BEGIN_RELEASE, BEGIN_WORKER, 2),
        )
        (claimed,) = batch.runs
        assert claimed.begun is not None
        row = await conn.fetchrow(
            f"select release_id, worker_id, disposition from {SCHEMA}.attempts"
            " where attempt_id = $1",
            claimed.begun.attempt_id,
        )
        assert row is not None
        assert dict(row) == {
            "release_id": BEGIN_RELEASE,
            "worker_id": BEGIN_WORKER,
            "disposition": "own",
        }, run.run_id
        lease = await conn.fetchval(
            f'select claimed_by from absurd."r_{QUEUE}" where run_id = $1', claimed.run_id
        )
        assert lease == BEGIN_WORKER
    finally:
        await conn.close()
