"""The health port as the daemon's first act, and its answer to hostile requests.

The port is bound before the database is touched: a busy port exits 1 having
touched nothing, and the probes answer (503, booting) while the daemon is still
connecting. A malformed request is answered 400 and logged as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import signal
import socket
import time
from typing import Any

import aiohttp
import asyncpg
from aiohttp import http_exceptions

from support.daemon import Daemons, base_env, one_sentence, queue_of
from support.runtime import eventually, open_client
from worker import lanes

RELEASE = "rel-hb"
LONG = 20_000  # well over aiohttp's 8190-byte line limit
REASON_CHARS = 100  # a logged reason quotes at most this much of what the client sent

# (what, raw bytes sent on a fresh connection, the HTTP statuses answered in order); a
# list of chunks is sent one at a time, each after the answer to the one before.
MALFORMED: list[tuple[str, bytes | list[bytes], list[int]]] = [
    (
        "TLS handshake on the plain port",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\r\n\r\n",
        [400],
    ),
    ("binary garbage", b"\x00\xff\xfe\x7f garbage \x01\x02\r\n\r\n", [400]),
    ("request line with a trailing word", b"GET /healthz HTTP/1.1 extra\r\n\r\n", [400]),
    ("unknown HTTP version", b"GET /healthz HTTP/9.9x\r\nHost: x\r\n\r\n", [400]),
    ("invalid method", b"G(T /healthz HTTP/1.1\r\nHost: x\r\n\r\n", [400]),
    ("space in a header name", b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", [400]),
    ("header without a colon", b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", [400]),
    (
        "over-long header",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * LONG + b"\r\n\r\n",
        [400],
    ),
    ("over-long URL", b"GET /" + b"b" * LONG + b" HTTP/1.1\r\nHost: x\r\n\r\n", [400]),
    (
        "invalid method after a good request on one connection",
        [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n"],
        [200, 400],
    ),
]
STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
CONTENT_LENGTH = re.compile(rb"(?im)^content-length: *(\d+)")
PARSER_ERRORS = {
    name
    for name, value in vars(http_exceptions).items()
    if isinstance(value, type) and issubclass(value, http_exceptions.HttpProcessingError)
}


def free_port() -> int:
    """Return a port nobody listens on right now (the daemon binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # noqa: S104 (the daemon binds all interfaces too)
        return int(probe.getsockname()[1])


async def http_get(port: int, path: str) -> tuple[int, Any]:
    """GET ``path`` on the health port; return the status and the body (JSON when it is)."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        text = await response.text()
        body = json.loads(text) if response.content_type == "application/json" else text
        return response.status, body


async def send_raw(port: int, data: bytes | list[bytes]) -> bytes:
    """Send ``data`` on a fresh connection; return everything answered until the server closes.

    With a list, each chunk but the last is sent after the answer to the one before
    (one keep-alive response, read by its Content-Length).
    """
    chunks = data if isinstance(data, list) else [data]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answered = b""
    try:
        for chunk in chunks[:-1]:
            writer.write(chunk)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            length = CONTENT_LENGTH.search(head)
            assert length, head
            answered += head + await reader.readexactly(int(length[1]))
        writer.write(chunks[-1])
        await writer.drain()
        return answered + await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
        await writer.wait_closed()


def statuses(answer: bytes) -> list[int]:
    """Return the status of each response in ``answer``, stepping over bodies by Content-Length."""
    found = []
    while answer:
        head, _, rest = answer.partition(b"\r\n\r\n")
        status = STATUS_LINE.match(head)
        length = CONTENT_LENGTH.search(head)
        assert status, f"not an HTTP response: {answer[:300]!r}"
        assert length, f"no Content-Length: {answer[:300]!r}"
        found.append(int(status[1]))
        answer = rest[int(length[1]) :]
    return found


async def database_snapshot(url: str, queue: str, schema: str) -> dict[str, Any]:
    """Return every schema and relation, the engine's queues, and what names this lane."""
    conn = await asyncpg.connect(url)
    try:
        relations = await conn.fetch(
            "select n.nspname, c.relname from pg_class c"
            " join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname not in ('pg_catalog', 'information_schema')"
            " and n.nspname not like 'pg_toast%' order by 1, 2"
        )
        return {
            "schemas": [
                r[0] for r in await conn.fetch("select nspname from pg_namespace order by 1")
            ],
            "relations": [tuple(r) for r in relations],
            "queues": [
                r[0] for r in await conn.fetch("select queue_name from absurd.queues order by 1")
            ],
            "store_schema": await conn.fetchval("select to_regnamespace($1)::text", schema),
            "lane_queue": await conn.fetchval(
                "select queue_name from absurd.queues where queue_name = $1", queue
            ),
        }
    finally:
        await conn.close()


async def test_busy_health_port_exits_1_leaving_the_database_unchanged(database_url: str) -> None:
    """A busy health port: exit 1 naming the variable; no schema, no lane queue, no rows."""
    suffix = f"hb_{secrets.token_hex(4)}"
    schema = f"hb_store_{secrets.token_hex(4)}"
    queue = lanes.runs_queue_for_suffix(suffix)
    # The engine schema exists (as on any shared server), so a queue would have somewhere to go.
    async with open_client(database_url):
        pass
    before = await database_snapshot(database_url, queue, schema)
    assert before["store_schema"] is None
    assert before["lane_queue"] is None
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 (the daemon binds all interfaces too)
        holder.listen()
        port = holder.getsockname()[1]
        async with Daemons(database_url) as pool:
            daemon = pool.start(
                RELEASE,
                LANE_WORKER_HEALTH_PORT=str(port),
                DEEPLINE_RUNTIME_SCHEDULER_SCHEMA=schema,
                DEEPLINE_ABSURD_QUEUE_SUFFIX=suffix,
            )
            code = await daemon.wait_exit(timeout_s=30)
            assert code == 1, daemon.tail()
            sentence = one_sentence(daemon.stderr)
            assert "LANE_WORKER_HEALTH_PORT" in sentence
            assert str(port) in sentence
            assert not daemon.events("worker.ready")
            assert not daemon.events("db.retry")
    after = await database_snapshot(database_url, queue, schema)
    assert after == before


async def test_busy_health_port_exits_before_any_database_connection(database_url: str) -> None:
    """A busy health port: the daemon exits 1 at once, and the database never saw a connection."""
    connections: list[object] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer.get_extra_info("peername"))  # never answers: a client hangs

    fake_db = await asyncio.start_server(accept, "127.0.0.1", 0)
    db_port = fake_db.sockets[0].getsockname()[1]
    try:
        with socket.socket() as holder:
            holder.bind(("0.0.0.0", 0))  # noqa: S104 (the daemon binds all interfaces too)
            holder.listen()
            port = holder.getsockname()[1]
            env = {
                **base_env(f"postgresql://lane@127.0.0.1:{db_port}/runtime", RELEASE),
                "LANE_WORKER_HEALTH_PORT": str(port),
                # An hour of boot retry: a daemon that tried the database first shows.
                "LANE_WORKER_BOOT_RETRY": "3600",
            }
            async with Daemons(database_url) as pool:
                started = time.monotonic()
                daemon = pool.start_raw("busy-port-fake-db", env)
                code = await daemon.wait_exit(timeout_s=90)
                elapsed = time.monotonic() - started
                assert code == 1, daemon.tail()
                assert "LANE_WORKER_HEALTH_PORT" in one_sentence(daemon.stderr)
                # Generous: the defect (the database's boot retry first) takes an hour;
                # a busy machine only seconds.
                assert elapsed < 45, f"took {elapsed:.1f} s"
    finally:
        fake_db.close()
        await fake_db.wait_closed()
    assert connections == [], "the daemon connected to the database before binding its port"


async def test_probes_answer_503_booting_while_the_database_is_unreachable(
    database_url: str,
) -> None:
    """During the connect retry: /healthz 200, /readyz 503 booting, /lanes 503; SIGTERM ends it."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))  # bound, never listening: every connect is refused
        db_port = hole.getsockname()[1]
        port = free_port()
        env = {
            **base_env(f"postgresql://lane@127.0.0.1:{db_port}/runtime", RELEASE),
            "LANE_WORKER_HEALTH_PORT": str(port),
        }
        async with Daemons(database_url) as pool:
            daemon = pool.start_raw("unreachable-db", env)

            async def readyz() -> tuple[int, Any] | None:
                assert daemon.running, daemon.tail()
                try:
                    return await http_get(port, "/readyz")
                except (aiohttp.ClientError, OSError, TimeoutError):
                    return None

            status, body = await eventually(readyz, what="/readyz to answer during boot")
            print(f"/readyz while connecting: {status} {body}")
            assert status == 503
            assert body["ready"] is False
            assert body["booting"] is True
            assert body["database"] is False
            assert body["ownLoop"] == "stopped"
            assert body["lane"] is None
            assert body["queue"] == queue_of(RELEASE)
            assert await http_get(port, "/healthz") == (200, {"status": "alive"})
            assert await http_get(port, "/lanes") == (503, {"error": "NotBootedError"})
            status, _ = await http_get(port, "/metrics")
            assert status == 200
            await daemon.wait_for("db.retry", timeout_s=60)  # it is in its connect retry
            assert not daemon.events("worker.ready")

            signalled = time.monotonic()
            daemon.terminate()
            code = await daemon.wait_exit(timeout_s=60)
            took = time.monotonic() - signalled
            print(f"SIGTERM during the connect retry: exit {code} after {took:.2f} s")
            # Before the daemon serves, signals get Python's default handling (no drain):
            # killed by the signal itself, so at once (no bound on wall time needed); a
            # daemon that ignored it would end its retry and exit 1, not by the signal.
            assert code == -signal.SIGTERM, daemon.tail()
            assert "Traceback" not in daemon.stderr


async def test_malformed_requests_get_400_and_one_json_line_each(database_url: str) -> None:
    """Each malformed request: a 400, one `health.bad_request` line, no traceback; still serving."""
    async with Daemons(database_url) as pool:
        daemon = pool.start(RELEASE)
        await daemon.ready()
        port = daemon.health_port
        for what, data, expected in MALFORMED:
            answer = await send_raw(port, data)
            assert statuses(answer) == expected, f"{what}: answered {answer[:300]!r}"
        assert await http_get(port, "/healthz") == (200, {"status": "alive"})

        async def all_logged() -> list[dict[str, Any]]:
            found = daemon.events("health.bad_request")
            return found if len(found) >= len(MALFORMED) else []

        logged = await eventually(all_logged, what="a health.bad_request line per request")
        for record in logged:
            print(f"health.bad_request: {record['error']}: {record['reason']}")
            assert record["level"] == "warning"
            assert record["status"] == 400
            assert record["error"] in PARSER_ERRORS, record
            assert 0 < len(record["reason"]) <= REASON_CHARS, record
            assert "\n" not in record["reason"]
            assert record["remote"] == "127.0.0.1"
        assert await http_get(port, "/healthz") == (200, {"status": "alive"})

        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=15) == 0
    assert len(daemon.events("health.bad_request")) == len(MALFORMED)
    assert "Traceback" not in daemon.stderr
    assert "aiohttp" not in daemon.stderr, daemon.stderr
    assert daemon.malformed_lines() == []
    out = "\n".join(json.dumps(r) for r in daemon.records)
    assert "a" * (REASON_CHARS + 1) not in out
    assert "b" * (REASON_CHARS + 1) not in out
