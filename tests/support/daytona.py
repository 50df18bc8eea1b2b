"""A local fake of the parts of Daytona's API its Python SDK calls to delete a sandbox.

``GET /api/sandbox/{id}`` answers a sandbox (404 when unknown), ``DELETE
/api/sandbox/{id}`` deletes it. ``script`` scripts the n-th DELETE of a sandbox
(status, or ``hang``: never answer). Everything else (the SDK's event socket)
gets an empty 200.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from support.http import LocalServer

HANG = -1  # a scripted DELETE answer: never answer


def sandbox_json(sandbox_id: str) -> dict[str, Any]:
    """The fields the SDK's Sandbox model requires."""
    return {
        "id": sandbox_id, "organizationId": "org-test", "name": sandbox_id, "user": "daytona",
        "env": {}, "labels": {}, "public": False, "networkBlockAll": False, "kvm": False,
        "target": "us", "cpu": 1, "gpu": 0, "memory": 1, "disk": 1, "state": "started",
        "toolboxProxyUrl": "http://127.0.0.1:9/toolbox",
    }  # fmt: skip


class FakeDaytona(LocalServer):
    """Sandboxes by id; ``deleted`` lists each sandbox deleted, in order."""

    def __init__(self, script: Callable[[str, int], int] | None = None) -> None:
        super().__init__()
        self.sandboxes: set[str] = set()
        self.deleted: list[str] = []
        self.deletes: dict[str, int] = {}  # DELETE requests per sandbox
        self.auth: set[str] = set()
        self.script = script
        self.changed = asyncio.Event()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def env(self, key: str = "daytona-test-key-5e0f") -> dict[str, str]:
        return {"DAYTONA_API_KEY": key, "DAYTONA_API_URL": self.api_url, "DAYTONA_TARGET": "us"}

    async def __aenter__(self) -> FakeDaytona:
        await self.start()
        return self

    async def handle(self, request: web.Request) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        if len(parts) != 3 or parts[:2] != ["api", "sandbox"]:
            return web.json_response({})
        self.auth.add(request.headers.get("Authorization", ""))
        sandbox_id = parts[2]
        if sandbox_id not in self.sandboxes:
            return web.json_response({"message": "not found", "statusCode": 404}, status=404)
        if request.method == "GET":
            return web.json_response(sandbox_json(sandbox_id))
        if request.method != "DELETE":
            return web.json_response({"message": "no"}, status=405)
        n = self.deletes.get(sandbox_id, 0)
        self.deletes[sandbox_id] = n + 1
        self.changed.set()
        status = self.script(sandbox_id, n) if self.script else 200
        if status == HANG:
            await asyncio.sleep(3600)
        if status != 200:
            return web.json_response({"message": f"scripted {status}"}, status=status)
        self.sandboxes.discard(sandbox_id)
        self.deleted.append(sandbox_id)
        self.changed.set()
        return web.json_response({**sandbox_json(sandbox_id), "state": "destroying"})

    async def wait_for_delete(self, sandbox_id: str, count: int, timeout_s: float = 30) -> None:
        """Wait until ``sandbox_id`` has had ``count`` DELETE requests."""
        async with asyncio.timeout(timeout_s):
            while self.deletes.get(sandbox_id, 0) < count:
                self.changed.clear()
                await self.changed.wait()
