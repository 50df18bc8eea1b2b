"""The health server's /lanes page when the lanes cannot be read."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from worker.client import LaneView
from worker.daemon import health
from worker.daemon.health import HealthServer
from worker.metrics import Metrics


async def _ready() -> dict[str, Any]:
    return {"ready": True}


async def _get(lanes: Any, path: str = "/lanes") -> tuple[int, Any]:
    server = HealthServer(0, Metrics(), _ready, lanes)
    port = await server.start()
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"http://127.0.0.1:{port}{path}") as response,
        ):
            return response.status, await response.json()
    finally:
        await server.stop()


async def test_lanes_page_answers_503_when_the_database_fails() -> None:
    """An error reading the lanes is a 503 naming the error type, not a crash."""

    async def failing() -> list[LaneView]:
        raise ConnectionRefusedError("no database")

    assert await _get(failing) == (503, {"error": "ConnectionRefusedError"})


async def test_lanes_page_answers_503_instead_of_waiting_out_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read that hangs (the pool retrying an absent database) is cut off with a 503."""
    monkeypatch.setattr(health, "LANES_TIMEOUT_S", 0.05)
    never = asyncio.Event()

    async def hanging() -> list[LaneView]:
        await never.wait()
        return []

    status, body = await _get(hanging)
    assert status == 503
    assert body["error"] == "TimeoutError"
