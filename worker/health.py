"""HTTP: /healthz (alive), /readyz (ready to work), /metrics (Prometheus), /lanes (the lanes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker.client import LaneView, lanes_table
from worker.errors import HealthPortError
from worker.metrics import Metrics

LANES_TIMEOUT_S = 5.0

ReadinessCheck = Callable[[], Awaitable[dict[str, Any]]]
LanesReport = Callable[[], Awaitable[list[LaneView]]]


class HealthServer:
    """The daemon's HTTP endpoints on one port (0 picks a free one)."""

    def __init__(
        self,
        port: int,
        metrics: Metrics,
        readiness: ReadinessCheck,
        lanes: LanesReport | None = None,
    ) -> None:
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
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host="0.0.0.0", port=self._port)  # noqa: S104 (a container's health port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            # Left as a bare OSError it would read as "the database is unreachable".
            raise HealthPortError(
                f"cannot listen on health port {self._port} ({exc.strerror or exc}); set "
                "LANE_WORKER_HEALTH_PORT to a free port, or to 0 to pick one."
            ) from exc
        server = site._server  # aiohttp exposes the bound port only through the server
        assert isinstance(server, asyncio.Server)
        self.port = int(server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        report = await self._readiness()
        return web.json_response(report, status=200 if report.get("ready") else 503)

    async def _lanes_page(self, request: web.Request) -> web.Response:
        """The `lane-worker lanes` view: JSON, or the CLI's table with ``?format=text``."""
        assert self._lanes is not None
        try:
            # The pool retries an absent database for a minute; a page must answer sooner.
            with anyio.fail_after(LANES_TIMEOUT_S):
                views = await self._lanes()
        except Exception as exc:  # the database is away: say so, do not crash the page
            return web.json_response({"error": type(exc).__name__}, status=503)
        if request.query.get("format") == "text":
            return web.Response(text="\n".join(lanes_table(views)) + "\n")
        return web.json_response({"lanes": [v.as_json() for v in views]})

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
