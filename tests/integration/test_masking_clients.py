"""The one masking rule on every outbound client: an answer that echoes the token keeps none.

Auth layers and debugging proxies answer a refusal with the request's headers in
the body. The ledger relay (a 401 from the app's runtime API) and the sandbox
cleanup (Daytona's SDK against a fake that echoes) each keep a little of that
answer; neither the store nor what `status --json` and `run_status` print may
carry the executor token, the bypass token or the API key. (The Fly backend's
case is in test_scaler_fly_api.py and test_scaler_fly_faults.py.)
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any
from urllib.parse import quote

from aiohttp import web

from support.daytona import FakeDaytona
from support.db import sql
from support.runtime import (
    SCHEMA,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    work_once,
)
from support.runtime_api import FakeRuntimeApi
from worker import App, TaskContext
from worker.daemon.relay import Relay, RelayConfig
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.metrics import Metrics
from worker.run.sandbox import DaytonaDeleter

R = "rel-mask"
TOKEN = "exec-token-7d1e/aa+Q=="
BYPASS = "bypass-token-55c0"
KEY = "daytona-key-e3b1/zz+W"


def _echo(request: web.Request) -> str:
    """A refusal body that quotes the request's headers, as JSON and as header lines."""
    headers = dict(request.headers)
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return json.dumps({"error": "unauthorized", "headers": headers}) + "\n" + lines


class EchoingApi(FakeRuntimeApi):
    """A runtime API whose every answer is a 401 echoing the request's headers."""

    async def handle(self, request: web.Request) -> web.Response:
        await super().handle(request)
        return web.Response(status=401, text=_echo(request), content_type="application/json")


class EchoingDaytona(FakeDaytona):
    """Daytona refusing every DELETE with a 401 that echoes the request's headers."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            self.deletes[request.path] = self.deletes.get(request.path, 0) + 1
            body = {"message": _echo(request), "statusCode": 401}
            return web.json_response(body, status=401)
        return await super().handle(request)


def app() -> App:
    plays = App()

    @plays.play("echo")
    async def echo(ctx: TaskContext, params: Any) -> Any:
        return params

    @plays.play("sandboxed")
    async def sandboxed(ctx: TaskContext, params: Any) -> Any:
        await ctx.register_sandbox("sb-echo")
        return "ok"

    return plays


async def test_a_401_that_echoes_the_tokens_leaves_them_nowhere(database_url: str) -> None:
    """The relay gives the fact up with the endpoint's body as its reason, masked: the
    status the CLI prints and the store's row keep the 401 and none of either token."""
    async with EchoingApi() as endpoint:
        api = {"baseUrl": endpoint.base_url, "executorToken": TOKEN,
               "vercelProtectionBypassToken": BYPASS}  # fmt: skip
        async with (
            open_client(database_url, env_of(R)) as client,
            open_runtime(database_url, app(), R) as runtime,
        ):
            run_id = (await client.submit("echo", {"n": 1}, runtime_api=api)).run_id
            await work_once(runtime)
        db = await Database.open(PoolOptions(url=database_url, max_size=2, retry_for_s=5))
        relay = Relay(db, Store(SCHEMA), worker_id="mask-test", metrics=Metrics(),
                      wakeup=asyncio.Event(),
                      config=RelayConfig("/ledger", 4, 2, 5.0, 3600.0))  # fmt: skip
        task = asyncio.create_task(relay.run())
        try:

            async def given_up() -> bool:
                left = await sql(
                    database_url,
                    f"select count(*) from {SCHEMA}.ledger where delivery = 'pending'",
                )
                return bool(left == 0) and len(endpoint.requests) >= 2

            await eventually(given_up, timeout_s=30, what="every fact given up")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await db.close()
        async with open_client(database_url, env_of(R)) as client:
            shown = json.dumps((await client.status(run_id)).as_json())
            stored = await sql(database_url, f"select jsonb_agg(l)::text from {SCHEMA}.ledger l")
            by_sql = await sql(database_url, f"select {SCHEMA}.run_status($1::uuid)::text", run_id)
    assert endpoint.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert '"status": 401' in shown
    assert "unauthorized" in shown  # the reason is kept, masked
    for text in (shown, stored, str(by_sql)):
        for secret in (TOKEN, BYPASS, json.dumps(TOKEN)[1:-1], "exec-token-7d1e", "55c0"):
            assert secret not in text, (secret, text)


LONG = "exec_" + "a1b2c3d4e5" * 30  # 305 characters: three raw copies outrun the 800-byte read
LONG_BYPASS = "byp_ZZ9yy8XX7ww6VV5uu4TT3ss2"


class OddEchoApi(FakeRuntimeApi):
    """A 400 echoing the tokens raw three times (the read cuts the third), upper-cased,
    and in base64, by the request's path."""

    async def handle(self, request: web.Request) -> web.Response:
        await super().handle(request)
        token = request.headers["Authorization"].split(" ", 1)[1]
        bypass = request.headers["x-vercel-protection-bypass"]
        if "/thrice/" in request.path:
            body = json.dumps({"token": token, "echo": token, "again": token})
        elif "/upper/" in request.path:
            body = f"bad bypass {bypass.upper()} and {token.upper()[:60]}"
        else:
            body = json.dumps({"debug": base64.b64encode(f"{token}|{bypass}".encode()).decode()})
        return web.Response(status=400, text=body)


async def test_a_token_echoed_thrice_upper_cased_or_in_base64_leaves_no_piece(
    database_url: str,
) -> None:
    """Review D5/D6: the relay keeps the 400's body as the reason; none of it may carry 8
    characters of either token in any case (the read's cut copy, upper case, base64)."""
    modes = ("thrice", "upper", "b64")
    async with OddEchoApi() as endpoint:
        async with (
            open_client(database_url, env_of(R)) as client,
            open_runtime(database_url, app(), R) as runtime,
        ):
            run_ids = []
            for mode in modes:
                api = {"baseUrl": f"{endpoint.base_url}/{mode}", "executorToken": LONG,
                       "vercelProtectionBypassToken": LONG_BYPASS}  # fmt: skip
                run_ids.append((await client.submit("echo", {"m": mode}, runtime_api=api)).run_id)
            while await work_once(runtime):
                pass
        db = await Database.open(PoolOptions(url=database_url, max_size=2, retry_for_s=5))
        relay = Relay(db, Store(SCHEMA), worker_id="mask-odd", metrics=Metrics(),
                      wakeup=asyncio.Event(),
                      config=RelayConfig("/ledger", 4, 2, 5.0, 3600.0))  # fmt: skip
        task = asyncio.create_task(relay.run())
        try:

            async def given_up() -> bool:
                left = await sql(
                    database_url,
                    f"select count(*) from {SCHEMA}.ledger where delivery = 'pending'",
                )
                return bool(left == 0)

            await eventually(given_up, timeout_s=30, what="every fact given up")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await db.close()
        async with open_client(database_url, env_of(R)) as client:
            shown = [json.dumps((await client.status(r)).as_json()) for r in run_ids]
            stored = await sql(database_url, f"select jsonb_agg(l)::text from {SCHEMA}.ledger l")
    assert all('"status": 400' in text for text in shown), shown
    assert '\\"token\\": \\"***' in shown[0], shown[0]  # the reason is kept, masked
    encoded = base64.b64encode(f"{LONG}|{LONG_BYPASS}".encode()).decode()
    for text in [*shown, str(stored)]:
        folded = text.lower()
        for secret in (LONG, LONG_BYPASS, encoded):
            for i in range(len(secret) - 7):
                assert secret[i : i + 8].lower() not in folded, (secret[i : i + 8], text)


UMLAUT = "tökén-sécret-ümlaut-0123456789"
_MOJIBAKE = UMLAUT.encode().decode("latin-1")
# What an endpoint in another encoding sends back of the token, by the request's path:
# the bytes in its body (the relay reads them as UTF-8, a bad byte as U+FFFD).
MISREAD_BODIES = {
    "latin1": UMLAUT.encode("latin-1"),  # read as UTF-8: "t\ufffdk\ufffdn-..."
    "mojibake": _MOJIBAKE.encode(),  # its UTF-8 was read as Latin-1: "tÃ¶kÃ©n-..."
    "percent": quote(UMLAUT, safe="").encode(),
    "json": json.dumps(UMLAUT)[1:-1].encode(),  # \u00f6 escapes
    "json-mojibake": json.dumps(_MOJIBAKE)[1:-1].encode(),  # a Python server's echo
    "html": UMLAUT.encode("ascii", "xmlcharrefreplace"),  # t&#246;k&#233;n-...
}


class MisreadEchoApi(FakeRuntimeApi):
    """A 401 giving the token back in another encoding, by the request's path."""

    async def handle(self, request: web.Request) -> web.Response:
        await super().handle(request)
        [mode] = [m for m in MISREAD_BODIES if f"/{m}/" in request.path]
        body = b'{"error": "bad token", "token": "' + MISREAD_BODIES[mode] + b'"}'
        return web.Response(status=401, body=body)


async def test_a_non_ascii_token_echoed_in_another_encoding_is_kept_nowhere(
    database_url: str,
) -> None:
    """Issue 29: the relay keeps each 401's body as the fact's delivery error: the token,
    in whichever form the endpoint wrote it, is masked whole."""
    async with MisreadEchoApi() as endpoint:
        async with (
            open_client(database_url, env_of(R)) as client,
            open_runtime(database_url, app(), R) as runtime,
        ):
            for mode in MISREAD_BODIES:
                api = {"baseUrl": f"{endpoint.base_url}/{mode}", "executorToken": UMLAUT}
                await client.submit("echo", {"m": mode}, runtime_api=api)
            while await work_once(runtime):
                pass
        db = await Database.open(PoolOptions(url=database_url, max_size=2, retry_for_s=5))
        relay = Relay(db, Store(SCHEMA), worker_id="mask-misread", metrics=Metrics(),
                      wakeup=asyncio.Event(),
                      config=RelayConfig("/ledger", 4, 2, 5.0, 3600.0))  # fmt: skip
        task = asyncio.create_task(relay.run())
        try:

            async def given_up() -> bool:
                left = await sql(
                    database_url,
                    f"select count(*) from {SCHEMA}.ledger where delivery = 'pending'",
                )
                return bool(left == 0)

            await eventually(given_up, timeout_s=30, what="every fact given up")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await db.close()
        kept = await sql(
            database_url,
            f"select jsonb_agg(delivery_error ->> 'body') from {SCHEMA}.ledger",
        )
    assert {r.headers["Authorization"] for r in endpoint.requests} == {f"Bearer {UMLAUT}"}
    assert len(kept) == len(MISREAD_BODIES) * 2  # each run's started and completed facts
    assert all(body == '{"error": "bad token", "token": "***"}' for body in kept), kept


async def test_a_sandbox_delete_refused_with_the_key_echoed_keeps_none_of_it(
    database_url: str,
) -> None:
    """Daytona's SDK raises with the echoing body in its message: the cleanup's stored error
    keeps the refusal and none of the API key."""
    async with (
        EchoingDaytona() as fake,
        open_client(database_url, env_of(R)) as client,
        open_runtime(database_url, app(), R) as rt,
    ):
        fake.sandboxes.add("sb-echo")
        await client.submit("sandboxed", {})
        assert await work_once(rt) == ["completed"]
        deleter, why_not = DaytonaDeleter.from_env(fake.env(KEY))
        assert why_not is None
        rt.cleanups.deleter = deleter
        rt.cleanups.call_timeout_s = 2.0
        assert await work_once(rt) == ["retrying"]
        stored = await sql(database_url, f"select jsonb_agg(s)::text from {SCHEMA}.run_sandboxes s")
        tasks = await sql(database_url, f"select jsonb_agg(r)::text from absurd.r_{queue_of(R)} r")
    assert fake.deletes, "the SDK never sent its DELETE"
    assert "401" in str(stored) or "unauthorized" in str(stored), stored
    for text in (str(stored), str(tasks)):
        for secret in (KEY, json.dumps(KEY)[1:-1], "e3b1/zz"):
            assert secret not in text, (secret, text)
