"""Ledger delivery with real daemons: an endpoint that is down while its worker is SIGKILLed.

Release A's daemon runs three runs with a runtime API whose endpoint is down, so
their facts wait in the store (A logs its retries); A is SIGKILLed. The endpoint
comes back and a daemon of another release, B, delivers every fact: each accepted
once as the endpoint sees it, in order per run, and no token in any log.
"""

from __future__ import annotations

import json

from support.daemon import Daemons
from support.runtime import open_client
from support.runtime_api import FakeRuntimeApi

TOKEN = "e2e-exec-token-6b19"
FAST = {"LANE_WORKER_LEDGER_TIMEOUT": "1"}


async def test_facts_wait_out_a_dead_endpoint_and_a_killed_worker(database_url: str) -> None:
    """Down endpoint, SIGKILLed worker: another release's worker delivers every fact once."""
    endpoint = FakeRuntimeApi()
    await endpoint.start()
    await endpoint.stop()  # down: its port refuses connections
    api = {"baseUrl": endpoint.base_url, "executorToken": TOKEN}
    try:
        async with Daemons(database_url) as pool:
            a = pool.start("ledger-a", name="A", **FAST)
            await a.ready()
            env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "ledger-a"}
            async with open_client(database_url, env) as client:
                runs = [
                    (await client.submit("plain", {"n": n}, runtime_api=api)).run_id
                    for n in range(3)
                ]
                for run_id in runs:
                    assert (await client.wait(run_id, 30)).status == "completed"
            await a.wait_for("ledger.retry", timeout_s=30)
            a.kill()
            await a.wait_exit()
            assert not endpoint.accepted

            await endpoint.start()  # back, on the same port
            b = pool.start("ledger-b", name="B", **FAST)
            await b.ready()
            await endpoint.wait_until(lambda: len(endpoint.accepted) == 6, timeout_s=60)
            await b.wait_for("ledger.delivered", timeout_s=10)
            async with open_client(database_url, env) as client:
                for run_id in runs:
                    facts = (await client.status(run_id)).as_json()["facts"]
                    assert [f["delivery"]["state"] for f in facts] == ["delivered", "delivered"]
            logs = [json.dumps(d.records) + d.stderr for d in (a, b)]
    finally:
        await endpoint.stop()
    assert [endpoint.accepted_of(r) for r in runs] == [["run.started", "run.completed"]] * 3
    assert all(TOKEN not in log for log in logs)
