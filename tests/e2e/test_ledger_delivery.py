"""Ledger delivery with real daemons: an endpoint that is down while its worker is SIGKILLed.

Release A's daemon runs three runs with a runtime API whose endpoint is down, so
their facts wait in the store (A logs its retries); A is SIGKILLed. The endpoint
comes back and a daemon of another release, B, delivers every fact: each accepted
once as the endpoint sees it, in order per run, and no token in any log.
"""

from __future__ import annotations

import json

from support.daemon import Daemons
from support.db import execute
from support.runtime import SCHEMA, eventually, open_client
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


DEEP = "[" * 3000 + "]" * 3000


async def test_facts_no_request_can_carry_are_given_up_by_a_daemon_alone(
    database_url: str,
) -> None:
    """A run.started nested 3,000 deep, and a run whose context is: a real daemon's relay
    gives those facts up (ledger.given_up, the reason in status), delivers the first run's
    run.completed and a healthy run's facts, and its relay never fails."""
    endpoint = FakeRuntimeApi()
    await endpoint.start()
    await endpoint.stop()  # down while the runs run: their facts wait in the store
    api = {"baseUrl": endpoint.base_url, "executorToken": TOKEN}
    env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "ledger-u"}
    try:
        async with Daemons(database_url) as pool:
            a = pool.start("ledger-u", name="A", **FAST)
            await a.ready()
            async with open_client(database_url, env) as client:
                bad_fact, bad_context, healthy = [
                    (await client.submit("plain", {"n": n}, runtime_api=api)).run_id
                    for n in range(3)
                ]
                for run_id in (bad_fact, bad_context, healthy):
                    assert (await client.wait(run_id, 30)).status == "completed"
            a.terminate()
            assert await a.wait_exit() == 0
            await execute(
                database_url,
                f"update {SCHEMA}.ledger set fact = $2::text::jsonb"
                " where run_id = $1::uuid and type = 'run.started'",
                bad_fact,
                '{"type": "run.started", "v": ' + DEEP + "}",
            )
            await execute(
                database_url,
                f"update {SCHEMA}.run_runtime_api set api = $2::text::jsonb"
                " where run_id = $1::uuid",
                bad_context,
                '{"baseUrl": "' + endpoint.base_url + '", "x": ' + DEEP + "}",
            )

            await endpoint.start()  # back, on the same port
            b = pool.start("ledger-u", name="B", **FAST)
            await b.ready()
            await endpoint.wait_until(lambda: len(endpoint.accepted) == 3, timeout_s=60)

            async def all_given_up() -> bool:
                return len(b.events("ledger.given_up")) == 3

            await eventually(all_given_up, what="three facts given up")
            async with open_client(database_url, env) as client:
                shown = {r: (await client.status(r)).as_json()["facts"]
                         for r in (bad_fact, bad_context)}  # fmt: skip
            logs = [json.dumps(d.records) + d.stderr for d in (a, b)]
            assert b.events("ledger.relay_failed") == []
            assert b.events("ledger.record_failed") == []
    finally:
        await endpoint.stop()
    assert endpoint.accepted_of(bad_fact) == ["run.completed"]
    assert endpoint.accepted_of(healthy) == ["run.started", "run.completed"]
    assert endpoint.accepted_of(bad_context) == []
    assert [(f["type"], f["delivery"]["state"]) for f in shown[bad_fact]] == [
        ("run.started", "failed"),
        ("run.completed", "delivered"),
    ]
    assert shown[bad_fact][0]["delivery"]["error"]["reason"] == "the fact cannot be read"
    assert [f["delivery"]["error"]["reason"] for f in shown[bad_context]] == [
        "the runtime API context cannot be read"
    ] * 2
    assert all(TOKEN not in log for log in logs)
