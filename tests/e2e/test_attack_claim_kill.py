"""Attack: daemons killed while they claim a big backlog (claims now run in their own
short transaction with SET LOCAL plan_cache_mode), then every run counted in the database.

Three rounds: a daemon with a short lease and many slots starts on a backlog of
chaos runs (two steps, the first lingers), and is SIGKILLed or SIGTERMed as soon as
it has started runs, i.e. while its claim loop is still claiming the backlog. A last
daemon finishes the rest. Judged from the tables: every run completed, none spent
more attempts than it was killed in, and no committed step ran again (step ``a``
executed after step ``b`` of the same run began: ``b`` only begins once ``a`` is
committed).
"""

from __future__ import annotations

import asyncpg
import pytest

from support.apps.chaos import EXEC_TABLE_SQL
from support.daemon import Daemons
from support.db import all_ended, fetch
from support.runtime import SCHEMA, open_client

REL = "atk-claimkill"
CHAOS_APP = "support.apps.chaos:app"
RUNS = 240


@pytest.mark.timeout(240)
async def test_killed_while_claiming_a_backlog_loses_nothing_and_reruns_no_committed_step(
    database_url: str,
) -> None:
    setup = await asyncpg.connect(database_url)
    try:
        await setup.execute(EXEC_TABLE_SQL)
    finally:
        await setup.close()
    plan = [
        {"op": "step", "name": "a", "linger_s": 0.3},
        {"op": "step", "name": "b"},
    ]
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": REL}) as client:
        ids = [(await client.submit("chaos", {"plan": plan, "n": i})).run_id for i in range(RUNS)]
    env = {"LANE_WORKER_CLAIM_TIMEOUT": "5", "LANE_WORKER_CONCURRENCY": "64",
           "LANE_WORKER_DRAIN_SECONDS": "0"}  # fmt: skip
    async with Daemons(database_url) as pool:
        for round_ in range(3):
            d = pool.start(REL, name=f"K{round_}", app=CHAOS_APP, **env)
            await d.ready()
            await d.wait_for("run.started", timeout_s=60)
            if round_ == 1:
                d.terminate()
            else:
                d.kill()
            await d.wait_exit()
        last = pool.start(REL, name="L", app=CHAOS_APP, **env)
        await last.ready()
        await all_ended(database_url, ids, timeout_s=180)
    rows = await fetch(
        database_url,
        f"select status, attempts, max_attempts from {SCHEMA}.runs where run_id = any($1::uuid[])",
        ids,
    )
    bad = [dict(r) for r in rows if r["status"] != "completed"]
    assert bad == [], bad[:5]
    # A run is cut at most once per killed daemon (3): more is an attempt spent on nothing.
    spent = sorted((r["attempts"] for r in rows), reverse=True)
    assert spent[0] <= 4, spent[:10]
    rerun = await fetch(
        database_url,
        "select a.run_id from chaos_exec a join chaos_exec b"
        " on b.run_id = a.run_id and b.step = 'b' and a.step = 'a' and a.at > b.at",
    )
    assert rerun == [], f"{len(rerun)} committed steps ran again"
