"""HTTP: /healthz, /readyz, /metrics (Prometheus), /lanes (the drain report), / (its page)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker import page
from worker.client import LaneView, lanes_table
from worker.errors import HealthPortError
from worker.metrics import Metrics

LANES_TIMEOUT_S = 5.0
# A bad request's logged reason is cut to this many characters: it quotes the client's bytes.
BAD_REQUEST_REASON_CHARS = 100

ReadinessCheck = Callable[[], Awaitable[dict[str, Any]]]
LanesReport = Callable[[], Awaitable[list[LaneView]]]

log = structlog.get_logger("lane_worker.health")


class NotBootedError(Exception):
    """A lanes report asked for before the worker has booted (/lanes answers 503)."""


class _RequestErrors(logging.Handler):
    """Turns aiohttp's report of a malformed request into one ``health.bad_request`` line.

    aiohttp answers a request it cannot parse (garbage, a bad request line, method
    or header, an over-long line) with 400, and logs the parser's exception with a
    traceback to stderr, or, for a bad method on a fresh connection, at debug (not
    at all). Every other record goes on to ``aiohttp.server`` unchanged.
    """

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
            log.warning(
                "health.bad_request",
                status=exc.code,
                error=type(exc).__name__,
                reason=_short_reason(exc.message),
                remote=None if remote is None else str(remote),
            )
        elif server_logger.isEnabledFor(record.levelno):
            record.name = server_logger.name
            server_logger.handle(record)


def _short_reason(message: str) -> str:
    """Return the parser's message on one line, without its caret line, cut short."""
    text = " ".join(p for p in (line.strip() for line in message.splitlines()) if p.strip("^ "))
    if len(text) <= BAD_REQUEST_REASON_CHARS:
        return text
    return text[: BAD_REQUEST_REASON_CHARS - 3] + "..."


# The request handlers' logger (aiohttp's ``logger`` argument, `aiohttp.server` by default).
# Level DEBUG: aiohttp reports a bad method on a fresh connection at debug.
_request_log = logging.getLogger("lane_worker.health.requests")
_request_log.setLevel(logging.DEBUG)
_request_log.propagate = False
if not _request_log.handlers:
    _request_log.addHandler(_RequestErrors())


class HealthServer:
    """The daemon's HTTP endpoints on one port (0 picks a free one)."""

    def __init__(
        self,
        port: int,
        metrics: Metrics,
        readiness: ReadinessCheck,
        lanes: LanesReport | None = None,
        *,
        host: str = "0.0.0.0",  # noqa: S104 (a container's health port)
    ) -> None:
        self._host = host
        self._port = port
        self._metrics = metrics
        self._readiness = readiness
        self._lanes = lanes
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        """Start listening; return the port actually bound."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_page)
        if self._lanes is not None:
            app.router.add_get("/lanes", self._lanes_page)
            app.router.add_get("/", self._html_page)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, logger=_request_log
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self._host, port=self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            # Left as a bare OSError it would read as "the database is unreachable".
            raise HealthPortError(
                f"cannot listen on health port {self._port} of {self._host} "
                f"({exc.strerror or exc}); set LANE_WORKER_HEALTH_PORT to a free port (0 picks "
                "one), or LANE_WORKER_HEALTH_HOST to an address of this machine."
            ) from exc
        server = site._server  # aiohttp exposes the bound port only through the server
        assert isinstance(server, asyncio.Server)
        self.port = int(server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        report = await self._readiness()
        return web.json_response(report, status=200 if report.get("ready") else 503)

    async def _report(self) -> list[LaneView] | str:
        """The drain report, or the error's type when it cannot be read now."""
        assert self._lanes is not None
        try:
            # The pool retries an absent database for a minute; a page must answer sooner.
            with anyio.fail_after(LANES_TIMEOUT_S):
                return await self._lanes()
        except Exception as exc:  # the database is away: say so, do not crash the page
            return type(exc).__name__

    async def _html_page(self, _request: web.Request) -> web.Response:
        views = await self._report()
        if isinstance(views, str):
            return web.Response(text=page.render_error(views), content_type="text/html", status=503)
        return web.Response(text=page.render(views), content_type="text/html")

    async def _lanes_page(self, request: web.Request) -> web.Response:
        """The `lane-worker lanes` view: JSON, or the CLI's table with ``?format=text``."""
        views = await self._report()
        if isinstance(views, str):
            return web.json_response({"error": views}, status=503)
        if request.query.get("format") == "text":
            return web.Response(text="\n".join(lanes_table(views)) + "\n")
        return web.json_response({"lanes": [v.as_json() for v in views]})

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
