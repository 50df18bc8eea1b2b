"""A fake of the app's runtime API: a real HTTP server in the test process, recording POSTs.

It deduplicates by ``Idempotency-Key`` as the app does: the first 2xx answer
for a key is the fact's acceptance; a repeat is answered 200 and not counted
again. ``respond`` scripts the answers (status, headers, a delay); ``stop`` and
``start`` take it down and bring it back on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from support.http import LocalServer


@dataclass(frozen=True)
class Received:
    """One request as the endpoint saw it."""

    path: str
    key: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Answer:
    """What the endpoint answers to one request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


Respond = Callable[[Received, int], Awaitable[Answer] | Answer]


class FakeRuntimeApi(LocalServer):
    """The endpoint; ``respond(request, n)`` is called with the n-th request (0-based)."""

    def __init__(self, respond: Respond | None = None) -> None:
        super().__init__()
        self.respond = respond
        self.requests: list[Received] = []
        self.accepted: dict[str, Received] = {}  # first 2xx per idempotency key, in order
        self.changed = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/app"

    async def __aenter__(self) -> FakeRuntimeApi:
        await self.start()
        return self

    async def handle(self, request: web.Request) -> web.Response:
        received = Received(
            path=request.path,
            key=request.headers.get("Idempotency-Key", ""),
            headers=dict(request.headers),
            body=json.loads(await request.read()),
        )
        n = len(self.requests)
        self.requests.append(received)
        answer = Answer()
        if self.respond is not None:
            made = self.respond(received, n)
            answer = await made if asyncio.iscoroutine(made) else made  # type: ignore[assignment]
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if 200 <= answer.status < 300 and received.key not in self.accepted:
            self.accepted[received.key] = received
        self.changed.set()
        return web.Response(status=answer.status, headers=answer.headers, text="{}")

    async def wait_until(
        self, check: Callable[[], bool], *, timeout_s: float = 30, what: str = "condition"
    ) -> None:
        """Wait until ``check()`` holds, re-checked after every request the endpoint answers."""
        async with asyncio.timeout(timeout_s):
            while not check():
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 1)
        if not check():  # pragma: no cover (the timeout raises first)
            raise AssertionError(f"timed out waiting for {what}")

    def accepted_of(self, run_id: str) -> list[str]:
        """The fact types of ``run_id`` in the order they were first accepted."""
        return [r.body["type"] for r in self.accepted.values() if r.body["runId"] == run_id]
