"""What one client can hold on the health port: its time without a request, and a slot.

A silent client, one that sends half a request or dribbles its headers, and one
that does not read its response are all disconnected within the bound; at the
cap a new connection takes the place of the one idle the longest, else of the
page request in progress the longest (a crowd of page viewers cannot lock a
health probe out), and only when every connection is a probe in progress is it
closed at once (one log line).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from worker.daemon import health
from worker.daemon.health import HealthServer
from worker.metrics import Metrics
from worker.ops.lane_view import LaneView

BOUND_S = 0.5  # the request-headers bound in these tests (5 s in the daemon)
# How much later than the bound a disconnect may be seen: room for a busy machine. The
# defects are far beyond it: no bound (keep-alive is made an hour below) never closes,
# a bound that the dribbling client extends holds for the whole dribble (250 s).
GRACE_S = 30.0
# What a connection that should go at once may take, on a busy machine; the defect
# (kept until a bound, made an hour in those tests) takes an hour.
AT_ONCE_S = 20.0


async def _ready() -> dict[str, Any]:
    return {"ready": True}


@contextlib.asynccontextmanager
async def serving(lanes: Any = None, ready: Any = _ready) -> AsyncIterator[HealthServer]:
    """A health server on a free port of 127.0.0.1, stopped afterwards."""
    server = HealthServer(0, Metrics(), ready, lanes, host="127.0.0.1")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def get_status(port: int, path: str = "/healthz") -> int:
    """GET ``path`` on a fresh connection; return the status."""
    timeout = aiohttp.ClientTimeout(total=5)
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        await response.read()
        return response.status


async def closed_after(reader: asyncio.StreamReader, timeout_s: float) -> float:
    """Return how long until the server closed the connection (reading and dropping data)."""
    started = time.monotonic()
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
    return time.monotonic() - started


async def wait_until(check: Any, timeout_s: float = 30.0) -> None:
    """Await until ``check()`` is true, or fail."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
def short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the request-headers bound 0.5 s (and keep-alive an hour: only that bound ends)."""
    monkeypatch.setattr(health, "REQUEST_HEADERS_TIMEOUT_S", BOUND_S)
    monkeypatch.setattr(health, "KEEPALIVE_TIMEOUT_S", 3600.0)


@pytest.mark.usefixtures("short_bound")
@pytest.mark.parametrize(
    ("what", "sent"),
    [
        ("silent", b""),
        ("half a request line", b"GET /hea"),
        ("headers without their end", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"),
    ],
)
async def test_a_client_that_sends_no_whole_request_is_dropped_within_the_bound(
    what: str, sent: bytes
) -> None:
    """Connect, send ``sent`` and nothing more: the server closes the connection at the bound."""
    async with serving() as server:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(sent)
            await writer.drain()
            took = await closed_after(reader, BOUND_S + GRACE_S)
        finally:
            writer.close()
        print(f"{what}: closed after {took:.2f} s")
        assert BOUND_S * 0.8 <= took < BOUND_S + GRACE_S
        await wait_until(lambda: server.open_connections == 0)


@pytest.mark.usefixtures("short_bound")
async def test_headers_dribbled_a_byte_at_a_time_do_not_extend_the_bound() -> None:
    """A slow-loris client keeps sending, but never a whole request: dropped at the bound."""
    async with serving() as server:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        started = time.monotonic()

        async def dribble() -> None:
            with contextlib.suppress(ConnectionError):
                for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 5000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)

        dribbler = asyncio.create_task(dribble())
        try:
            took = await closed_after(reader, BOUND_S + GRACE_S)
        finally:
            dribbler.cancel()
            writer.close()
        assert time.monotonic() - started < BOUND_S + GRACE_S
        assert took >= BOUND_S * 0.8
        await wait_until(lambda: server.open_connections == 0)


@pytest.mark.usefixtures("short_bound")
async def test_a_client_that_does_not_read_its_response_is_dropped() -> None:
    """A response far larger than the socket buffers, never read: the connection is aborted."""
    lane = {"status": "claiming", "live_workers": 1, "queued": 0, "running": 0, "waiting": 0}
    many = [
        LaneView(release_id=f"r{i}", queue=f"runs_r{i}", adoptable=0, **lane) for i in range(40_000)
    ]

    async def lanes() -> list[LaneView]:
        return many

    async with serving(lanes) as server:
        assert server.port is not None
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
        try:
            sock.send(b"GET /lanes HTTP/1.1\r\nHost: x\r\n\r\n")
            await wait_until(lambda: server.open_connections == 1)
            # Never read: the handler's answer is several MB, the buffers hold far less.
            await wait_until(lambda: server.open_connections == 0, timeout_s=BOUND_S + GRACE_S)
        finally:
            sock.close()
        assert await get_status(server.port) == 200


async def test_a_normal_keep_alive_client_is_served_again_and_again(
    short_bound: None,
) -> None:
    """Requests on one connection, each soon after the last: the bound never cuts them off."""
    async with (
        serving() as server,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
    ):
        for _ in range(6):
            async with session.get(f"http://127.0.0.1:{server.port}/healthz") as response:
                assert response.status == 200
            await asyncio.sleep(BOUND_S / 3)
        assert server.open_connections == 1


async def test_at_the_cap_a_new_connection_takes_the_place_of_the_longest_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle keep-alive connections fill the cap: a probe still gets in, the oldest idle goes."""
    monkeypatch.setattr(health, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(health, "REQUEST_HEADERS_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(health, "KEEPALIVE_TIMEOUT_S", 3600.0)
    async with serving() as server:
        assert server.port is not None
        held = []
        for _ in range(3):
            held.append(await asyncio.open_connection("127.0.0.1", server.port))
            await wait_until(lambda: server.open_connections == len(held))
        with capture_logs() as lines:
            for _ in range(5):  # each a probe, each served
                assert await get_status(server.port, "/readyz") == 200
                assert await get_status(server.port) == 200
        assert not [line for line in lines if line["event"] == "health.too_many_connections"]
        oldest_reader, _ = held[0]
        # Dropped for the first probe (so long ago; kept, it would stay an hour).
        assert await closed_after(oldest_reader, AT_ONCE_S) < AT_ONCE_S
        for _, writer in held:
            writer.close()
        await wait_until(lambda: server.open_connections == 0)


def slowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap of 3 and bounds long enough that only the test's gate ends a request."""
    monkeypatch.setattr(health, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(health, "REQUEST_HEADERS_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(health, "KEEPALIVE_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(health, "LANES_TIMEOUT_S", 3600.0)


async def hold(server: HealthServer, path: str) -> list[Any]:
    """Fill the cap with requests of ``path`` in progress; return their connections."""
    assert server.port is not None
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
    for _, writer in held:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await wait_until(lambda: server.open_connections == 3)
    await wait_until(lambda: all(h.idle_since is None for h in server._bounds.handlers))
    return held


async def test_at_a_cap_of_busy_page_requests_a_probe_takes_the_place_of_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Page viewers hold every slot with a request in progress: probes are still served."""
    slowed(monkeypatch)
    gate = asyncio.Event()

    async def slow_lanes() -> list[LaneView]:
        await gate.wait()
        return []

    async with serving(slow_lanes) as server:
        assert server.port is not None
        held = await hold(server, "/lanes")
        assert await get_status(server.port, "/healthz") == 200
        assert await get_status(server.port, "/readyz") == 200
        assert await get_status(server.port, "/healthz") == 200
        # The first probe took a page request's place; the rest found its slot free.
        assert server._bounds.pages_dropped == 1
        assert server.open_connections <= 3
        gate.set()
        for _, writer in held:
            writer.close()
        await wait_until(lambda: server.open_connections == 0)


async def test_connections_beyond_a_cap_of_busy_probes_are_closed_and_logged_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only probes are in progress (none is ever dropped): new connections are closed."""
    slowed(monkeypatch)
    gate = asyncio.Event()

    async def slow_ready() -> dict[str, Any]:
        await gate.wait()
        return {"ready": True}

    async with serving(ready=slow_ready) as server:
        assert server.port is not None
        held = await hold(server, "/readyz")
        with capture_logs() as lines:
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                took = await closed_after(reader, AT_ONCE_S)
                writer.close()
                assert took < AT_ONCE_S
            with pytest.raises(aiohttp.ClientError):
                await get_status(server.port)
        assert [line["event"] for line in lines] == ["health.too_many_connections"]
        assert lines[0]["limit"] == 3
        assert lines[0]["log_level"] == "warning"
        assert server.open_connections == 3

        gate.set()  # the requests finish; their connections are idle again
        assert await get_status(server.port) == 200
        assert await get_status(server.port, "/readyz") == 200
        for _, writer in held:
            writer.close()
        await wait_until(lambda: server.open_connections == 0)
