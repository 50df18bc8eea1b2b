"""A real HTTP server in the test process, on 127.0.0.1, that can go down and come back."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class LocalServer:
    """Serves ``handle`` for every method and path; ``stop`` and ``start`` keep the port."""

    def __init__(self) -> None:
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # Handlers that never answer (a hanging endpoint) must not hold up a stop.
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
