"""A local fake of the Fly Machines API the scaler calls; its machines are real processes.

``GET/POST /v1/apps/{app}/machines``, ``POST .../machines/{id}/stop`` and
``DELETE .../machines/{id}``, with the bearer token checked. A created machine
is a real ``lane-worker run`` process (the process backend underneath; the
``image`` is the app to serve, as for that backend). ``faults`` scripts HTTP
answers to the next calls (a 500, a 429 with ``Retry-After``); ``foreign``
machines (created by someone else, without the scaler's metadata) are listed
and must never be stopped or destroyed.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from support.http import LocalServer
from worker.scaler.backend import IMAGE_METADATA, RELEASE_METADATA, Machine
from worker.scaler.process import ProcessBackend


class FakeFly(LocalServer):
    """One Fly app; ``calls`` records (method, path) of every request."""

    def __init__(self, state_dir: Path, env: Mapping[str, str], token: str, app: str) -> None:
        super().__init__()
        self.machines = ProcessBackend(state_dir, env)
        self.machines.store_id = "fake-fly"  # the fake's own folder; Fly keeps metadata
        self.metadata: dict[str, dict[str, str]] = {}  # as each machine was created with
        self.token, self.app = token, app
        self.calls: list[tuple[str, str, int]] = []
        self.faults: list[tuple[int, dict[str, str]]] = []  # answers for the next calls
        self.foreign: dict[str, dict[str, Any]] = {}
        self.touched_foreign: list[str] = []
        self.bodies: list[Any] = []

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"LANE_WORKER_FLY_API_URL": self.api_url, "FLY_API_TOKEN": self.token,
                "FLY_APP_NAME": self.app, "FLY_REGION": "ams"}  # fmt: skip

    def add_foreign(self, machine_id: str) -> None:
        self.foreign[machine_id] = {"id": machine_id, "state": "started", "config": {
            "image": "someone/else:1", "metadata": {}}}  # fmt: skip

    async def handle(self, request: web.Request) -> web.StreamResponse:
        status, answer = await self._answer(request)
        self.calls.append((request.method, request.path, status))
        if isinstance(answer, web.StreamResponse):
            return answer
        return web.json_response(answer, status=status)

    async def _answer(self, request: web.Request) -> tuple[int, Any]:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"error": "unauthorized"}
        if self.faults:
            status, headers = self.faults.pop(0)
            return status, web.json_response({"error": "scripted"}, status=status, headers=headers)
        prefix = f"/v1/apps/{self.app}/machines"
        if not request.path.startswith(prefix):
            return 404, {"error": "not found"}
        rest = request.path[len(prefix) :].strip("/").split("/")
        if request.method == "GET" and rest == [""]:
            mine = [_fly_json(m, self.metadata.get(m.machine_id, {}))
                    for m in await self.machines.list()]  # fmt: skip
            return 200, [*mine, *self.foreign.values()]
        if request.method == "POST" and rest == [""]:
            body = await request.json()
            self.bodies.append(body)
            config = body["config"]
            release = config["metadata"][RELEASE_METADATA]
            assert config["env"]["DEEPLINE_RUNTIME_DEPLOY_VERSION"] == release
            made = await self.machines.create(release, config["image"])
            self.metadata[made.machine_id] = dict(config["metadata"])
            return 200, _fly_json(made, self.metadata[made.machine_id])
        machine_id = rest[0]
        if machine_id in self.foreign:
            self.touched_foreign.append(f"{request.method} {request.path}")
            return 200, {}
        found = {m.machine_id: m for m in await self.machines.list()}.get(machine_id)
        if found is None:
            return 404, {"error": "machine not found"}
        if request.method == "POST" and rest[1:] == ["stop"]:
            await self.machines.stop(found)
            return 200, {"ok": True}
        if request.method == "DELETE":
            await self.machines.destroy(found)
            return 200, {"ok": True}
        return 404, {"error": "no such endpoint"}


_FLY_STATES = {"started": "started", "starting": "starting", "stopping": "stopping",
               "failed": "failed"}  # fmt: skip


def _fly_json(m: Machine, metadata: dict[str, str]) -> dict[str, Any]:
    created = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=m.age_s)
    events = []
    if m.exit_code is not None:
        events.append({"type": "exit", "status": "stopped",
                       "request": {"exit_event": {"exit_code": m.exit_code}}})  # fmt: skip
    return {
        "id": m.machine_id,
        "state": _FLY_STATES.get(m.state, "stopped"),
        "region": "ams", "created_at": created.isoformat(), "events": events,
        # Fly lists an image as it resolved it, not as it was asked for.
        "config": {"image": f"registry.example/{m.image}@sha256:0",
                   "env": {"DEEPLINE_RUNTIME_DEPLOY_VERSION": m.release_id},
                   "metadata": {RELEASE_METADATA: m.release_id, IMAGE_METADATA: m.image,
                                **metadata}},
    }  # fmt: skip
