"""Ledger delivery (worker/daemon/relay.py) to a real HTTP endpoint in the test process.

Runs carry a runtime API context; a Runtime executes them (``run.started``, then
their terminal fact) and a Relay delivers the facts. The endpoint fails the first
tries, answers 500, 401 and 429, or is slow; every fact must be accepted exactly
once as the endpoint sees it (by idempotency key), in order per run, with the
token sent and never shown, and a refused fact recorded with its reason.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog

from support.db import sql
from support.runtime import (
    env_of,
    eventually,
    open_client,
    open_runtime,
    register_worker,
    work_once,
)
from support.runtime_api import Answer, FakeRuntimeApi, Received
from worker import App, TaskContext
from worker.daemon.relay import Relay, RelayConfig
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.metrics import Metrics

R = "rel-relay"
TOKEN = "relay-exec-token-0c7e"
BYPASS = "relay-bypass-token-41aa"
PATH = "/api/runtime/run-ledger"


def plain_app() -> App:
    app = App()

    @app.play("echo")
    async def echo(ctx: TaskContext, params: Any) -> Any:
        if params.get("fail"):
            raise RuntimeError("asked to fail")
        return await ctx.step("say", lambda: {"said": params.get("n")})

    return app


@asynccontextmanager
async def relaying(
    url: str, metrics: Metrics, *, timeout_s: float = 5.0, per_endpoint: int = 4
) -> AsyncIterator[Relay]:
    """A Relay on its own pool, running until the block ends."""
    db = await Database.open(PoolOptions(url=url, max_size=2, retry_for_s=5))
    relay = Relay(
        db, Store("runtime_scheduler"), worker_id="relay-test", metrics=metrics,
        wakeup=asyncio.Event(),
        config=RelayConfig(PATH, 8, per_endpoint, timeout_s, 3600.0),
    )  # fmt: skip
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await db.close()


async def submit_and_run(url: str, api: dict[str, Any], inputs: list[dict[str, Any]]) -> list[str]:
    """Submit one run per input with ``api``, and run them all to their end."""
    async with (
        open_client(url, env_of(R)) as client,
        open_runtime(url, plain_app(), R) as runtime,
    ):
        ids = [(await client.submit("echo", i, runtime_api=api)).run_id for i in inputs]

        async def ended() -> bool:
            await work_once(runtime)
            return all([(await client.status(i)).finished for i in ids])

        await eventually(ended, what="every run ended")
    return ids


async def nothing_pending(url: str) -> None:
    """Wait until no fact waits for delivery (each one recorded delivered or failed)."""

    async def none() -> bool:
        pending = await sql(
            url, "select count(*) from runtime_scheduler.ledger where delivery = 'pending'"
        )
        return bool(pending == 0)

    await eventually(none, timeout_s=30, what="no pending delivery")


def api_for(endpoint: FakeRuntimeApi, **extra: str) -> dict[str, Any]:
    return {"baseUrl": endpoint.base_url, "executorToken": TOKEN, **extra}


async def test_every_fact_is_accepted_once_in_order_through_failures_and_429(
    database_url: str,
) -> None:
    """503s, a dropped connection and a 429 with Retry-After: every fact once, in run order."""

    def respond(request: Received, n: int) -> Answer:
        if n < 3:
            return Answer(503)
        if n == 3:
            return Answer(429, {"Retry-After": "1"})
        if n == 4:
            return Answer(500)
        return Answer(200)

    metrics = Metrics()
    with structlog.testing.capture_logs() as logs:
        async with FakeRuntimeApi(respond) as endpoint:
            api = api_for(endpoint, vercelProtectionBypassToken=BYPASS,
                          runtimeTestFaultHeader="none")  # fmt: skip
            ids = await submit_and_run(database_url, api, [{"n": 1}, {"n": 2}, {"fail": True}])
            async with relaying(database_url, metrics):
                await endpoint.wait_until(lambda: len(endpoint.accepted) == 6, timeout_s=60)
                await nothing_pending(database_url)
    assert [endpoint.accepted_of(i) for i in ids] == [
        ["run.started", "run.completed"],
        ["run.started", "run.completed"],
        ["run.started", "run.failed"],
    ]
    completed = next(r for r in endpoint.accepted.values() if r.body["runId"] == ids[0]
                     and r.body["type"] == "run.completed")  # fmt: skip
    assert completed.body["result"] == {"said": 1}
    assert completed.body["source"] == "worker"
    assert completed.path == "/app" + PATH
    for request in endpoint.requests:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        assert request.headers["x-vercel-protection-bypass"] == BYPASS
        assert request.headers["x-runtime-test-fault"] == "none"
    # A retried fact kept its key: five failures, so five requests repeat a key.
    keys = [r.key for r in endpoint.requests]
    assert len(keys) == 11
    assert len(set(keys)) == 6
    assert metrics.ledger_delivered._value.get() == 6  # type: ignore[attr-defined]
    assert metrics.ledger_retries._value.get() == 5  # type: ignore[attr-defined]
    assert TOKEN not in repr(logs)
    assert BYPASS not in repr(logs)
    assert {e["event"] for e in logs} >= {"ledger.retry", "ledger.delivered"}


async def test_a_refused_fact_is_given_up_with_its_reason_and_the_next_one_still_goes(
    database_url: str,
) -> None:
    """A 401 gives that fact up (status shows why); the run's next fact is still delivered."""

    def respond(request: Received, n: int) -> Answer:
        return Answer(401) if request.body["type"] == "run.started" else Answer(200)

    metrics = Metrics()
    async with FakeRuntimeApi(respond) as endpoint:
        (run_id,) = await submit_and_run(database_url, api_for(endpoint), [{"n": 1}])
        async with relaying(database_url, metrics):
            await endpoint.wait_until(lambda: len(endpoint.accepted) == 1)
            await nothing_pending(database_url)
        async with open_client(database_url, env_of(R)) as client:
            facts = (await client.status(run_id)).as_json()["facts"]
    assert [(f["type"], f["delivery"]["state"]) for f in facts] == [
        ("run.started", "failed"),
        ("run.completed", "delivered"),
    ]
    assert facts[0]["delivery"]["error"]["status"] == 401
    assert facts[0]["delivery"]["error"]["reason"] == "refused by the endpoint"
    assert len(endpoint.requests) == 2  # a refusal is not retried
    assert metrics.ledger_given_up.labels("refused")._value.get() == 1  # type: ignore[attr-defined]


async def test_a_slow_endpoint_delays_no_other(database_url: str) -> None:
    """One endpoint answers after 30 s; the other's facts are all delivered meanwhile."""
    async with (
        FakeRuntimeApi(lambda r, n: Answer(200, delay_s=30)) as slow,
        FakeRuntimeApi() as fast,
    ):
        await submit_and_run(database_url, api_for(slow), [{"n": n} for n in range(6)])
        fast_ids = await submit_and_run(database_url, api_for(fast), [{"n": n} for n in range(6)])
        async with relaying(database_url, Metrics(), timeout_s=60, per_endpoint=2):
            # Well under the idle poll times the facts: a lost wake-up (a slot freed while a
            # pass was still in the database) would leave the relay asleep between them.
            await fast.wait_until(lambda: len(fast.accepted) == 12, timeout_s=8)
            assert len(slow.requests) <= 2  # at most its share of the slots
            assert not slow.accepted
    assert {r.body["runId"] for r in fast.accepted.values()} == set(fast_ids)


async def test_status_and_run_status_never_show_the_token(database_url: str) -> None:
    """The runtime API context reaches the relay only: nothing a user reads carries it."""
    async with FakeRuntimeApi() as endpoint:
        (run_id,) = await submit_and_run(
            database_url, api_for(endpoint, vercelProtectionBypassToken=BYPASS), [{"n": 1}]
        )
        async with open_client(database_url, env_of(R)) as client:
            shown = [
                repr((await client.status(run_id)).as_json()),
                repr(await client.runs()),
                repr(await client.lanes()),
            ]
    assert all(TOKEN not in s for s in shown)
    assert all(BYPASS not in s for s in shown)
    assert uuid.UUID(run_id)


async def test_the_drain_report_counts_undelivered_facts_per_lane(database_url: str) -> None:
    """Facts waiting for a down endpoint show per lane; they never keep the lane draining."""
    endpoint = FakeRuntimeApi()
    await endpoint.start()
    await endpoint.stop()  # down
    await submit_and_run(database_url, api_for(endpoint), [{"n": 1}, {"fail": True}])
    async with open_client(database_url, env_of(R)) as client:
        await client.retire_release(R)
        (lane,) = [v for v in await client.lanes() if v.release_id == R]
    assert lane.as_json()["ledger"] == {"pending": 4, "failed": 0}
    assert lane.status == "drained"


async def test_a_context_that_cannot_be_sent_is_given_up_at_once_with_why(
    database_url: str,
) -> None:
    """A stored context no request can carry (an older build's, say): failed now, not retried."""
    async with FakeRuntimeApi() as endpoint:
        (run_id,) = await submit_and_run(database_url, api_for(endpoint), [{"n": 1}])
        await sql(
            database_url,
            "update runtime_scheduler.run_runtime_api"
            " set api = jsonb_set(api, '{executorToken}', to_jsonb(E'bad\\ntoken'::text))",
        )
        async with relaying(database_url, Metrics()):
            await nothing_pending(database_url)
        async with open_client(database_url, env_of(R)) as client:
            facts = (await client.status(run_id)).as_json()["facts"]
    assert [f["delivery"]["state"] for f in facts] == ["failed", "failed"]
    assert facts[0]["delivery"]["error"]["reason"] == "the runtime API context cannot be sent"
    assert endpoint.requests == []


async def test_endpoints_that_hang_take_one_slot_each_not_a_healthy_endpoint_s(
    database_url: str,
) -> None:
    """Five paths of one hanging host are one endpoint: at most its share, then one probe."""
    async with (
        FakeRuntimeApi(lambda r, n: Answer(200, delay_s=60)) as hanging,
        FakeRuntimeApi() as healthy,
    ):
        for path in range(5):
            api = {"baseUrl": f"http://127.0.0.1:{hanging.port}/p{path}", "executorToken": TOKEN}
            await submit_and_run(database_url, api, [{"n": n} for n in range(3)])
        ids = await submit_and_run(database_url, api_for(healthy), [{"n": n} for n in range(4)])
        async with relaying(database_url, Metrics(), timeout_s=60, per_endpoint=4):
            await healthy.wait_until(lambda: len(healthy.accepted) == 8, timeout_s=20)
            assert len(hanging.requests) <= 4  # the host's share, whatever its paths
    assert {r.body["runId"] for r in healthy.accepted.values()} == set(ids)


async def test_a_retry_s_facts_go_where_the_run_s_went(database_url: str) -> None:
    """`runs retry` of a failed run: the retry's run.started and run.completed are delivered."""
    async with FakeRuntimeApi() as endpoint:
        (run_id,) = await submit_and_run(database_url, api_for(endpoint), [{"fail": True}])
        async with (
            open_client(database_url, env_of(R)) as client,
            open_runtime(database_url, plain_app(), R) as runtime,
        ):
            await client.activate_release(R, force=True)
            await register_worker(runtime)
            retry = await client.retry_run(run_id)
            await sql(
                database_url,
                "update runtime_scheduler.runs set input = jsonb_build_object('n', 7)"
                " where run_id = $1::uuid",
                retry.run_id,
            )
            assert await work_once(runtime) == ["completed"]
        async with relaying(database_url, Metrics()):
            await endpoint.wait_until(lambda: len(endpoint.accepted) == 4)
    assert endpoint.accepted_of(run_id) == ["run.started", "run.failed"]
    assert endpoint.accepted_of(retry.run_id) == ["run.started", "run.completed"]


# Values Python's json cannot decode (issue 29 §3), written past the store's checks.
DEEP = "[" * 3000 + "]" * 3000
DIGITS = "1" * 5001


async def test_a_fact_that_cannot_be_read_is_given_up_and_the_run_s_next_fact_goes(
    database_url: str,
) -> None:
    """A run.started nested 3,000 deep, another with a 5,001-digit number: each given up
    at once saying why (status, metric, log), and each run's run.completed delivered."""
    metrics = Metrics()
    with structlog.testing.capture_logs() as logs:
        async with FakeRuntimeApi() as endpoint:
            ids = await submit_and_run(database_url, api_for(endpoint), [{"n": 1}, {"n": 2}])
            for run_id, text in zip(ids, (DEEP, DIGITS), strict=True):
                await sql(
                    database_url,
                    "update runtime_scheduler.ledger set fact = $2::text::jsonb"
                    " where run_id = $1::uuid and type = 'run.started'",
                    run_id,
                    '{"type": "run.started", "v": ' + text + "}",
                )
            async with relaying(database_url, metrics):
                await nothing_pending(database_url)
            async with open_client(database_url, env_of(R)) as client:
                facts = [(await client.status(i)).as_json()["facts"] for i in ids]
    assert [endpoint.accepted_of(i) for i in ids] == [["run.completed"], ["run.completed"]]
    for run_facts, said in zip(facts, ("nested too deeply", "more than 4300 digits"), strict=True):
        assert [(f["type"], f["delivery"]["state"]) for f in run_facts] == [
            ("run.started", "failed"),
            ("run.completed", "delivered"),
        ]
        error = run_facts[0]["delivery"]["error"]
        assert error["reason"] == "the fact cannot be read"
        assert said in error["detail"]
        assert error["tries"] == 1
    assert len(endpoint.requests) == 2  # nothing was sent for the unreadable facts
    assert metrics.ledger_given_up.labels("unreadable")._value.get() == 2  # type: ignore[attr-defined]
    given_up = [e for e in logs if e["event"] == "ledger.given_up"]
    assert [e["reason"] for e in given_up] == ["the fact cannot be read"] * 2
    assert TOKEN not in repr(logs)


async def test_a_context_that_cannot_be_read_or_used_fails_only_its_own_run_s_facts(
    database_url: str,
) -> None:
    """Runs whose stored runtime API context Python cannot decode, is not an object, or
    lacks its token: each of their facts is given up saying why; a healthy run beside them
    on the same endpoint has its facts delivered."""
    with structlog.testing.capture_logs() as logs:
        async with FakeRuntimeApi() as endpoint:
            api = api_for(endpoint)
            deep, digits, listed, tokenless, healthy = await submit_and_run(
                database_url, api, [{"n": n} for n in range(5)]
            )
            for run_id, text in (
                (deep, '{"baseUrl": "' + endpoint.base_url + '", "x": ' + DEEP + "}"),
                (digits, '{"baseUrl": "' + endpoint.base_url + '", "x": ' + DIGITS + "}"),
                (listed, '["' + TOKEN + '"]'),
                (tokenless, '{"baseUrl": "' + endpoint.base_url + '"}'),
            ):
                await sql(
                    database_url,
                    "update runtime_scheduler.run_runtime_api set api = $2::text::jsonb"
                    " where run_id = $1::uuid",
                    run_id,
                    text,
                )
            metrics = Metrics()
            async with relaying(database_url, metrics):
                await nothing_pending(database_url)
            async with open_client(database_url, env_of(R)) as client:
                shown = {i: (await client.status(i)).as_json()["facts"]
                         for i in (deep, digits, listed, tokenless, healthy)}  # fmt: skip
    assert endpoint.accepted_of(healthy) == ["run.started", "run.completed"]
    assert {r.body["runId"] for r in endpoint.requests} == {healthy}
    for run_id, reason, said in (
        (deep, "the runtime API context cannot be read", "nested too deeply"),
        (digits, "the runtime API context cannot be read", "more than 4300 digits"),
        (listed, "the runtime API context cannot be sent", "not a JSON object"),
        (tokenless, "the runtime API context cannot be sent", "executorToken"),
    ):
        assert [f["delivery"]["state"] for f in shown[run_id]] == ["failed", "failed"], run_id
        for fact in shown[run_id]:
            assert fact["delivery"]["error"]["reason"] == reason
            assert said in fact["delivery"]["error"]["detail"]
    assert metrics.ledger_given_up.labels("unreadable")._value.get() == 4  # type: ignore[attr-defined]
    assert metrics.ledger_given_up.labels("refused")._value.get() == 4  # type: ignore[attr-defined]
    assert TOKEN not in repr(logs)
    assert TOKEN not in repr(shown)
