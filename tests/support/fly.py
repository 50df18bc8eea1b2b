"""A local fake of the Fly Machines API the scaler calls, which misbehaves on demand.

``GET/POST /v1/apps/{app}/machines``, ``POST .../machines/{id}/stop`` and
``DELETE .../machines/{id}``, with the bearer token checked. With a state
folder, a created machine is a real ``lane-worker run`` process (the process
backend underneath; the ``image`` is the app to serve, as for that backend);
without one, machines are records only, in any Fly state a test sets
(``states``), for tests of the scaler's pass against the real HTTP client.

Misbehaviour on demand, as real APIs do: ``faults`` scripts HTTP answers to the
next calls (a 500, a 429 with ``Retry-After``); ``fail_after_create`` makes the
next creates make their machine, then answer 500; ``duplicate_listing`` lists
every machine twice; ``page_size`` answers the listing in pages (with a
``next_cursor``) that overlap by one machine; ``without_metadata`` lists
machines without their metadata; ``echo_auth`` makes a 401 echo the request's
``Authorization`` header in its body (as JSON and as header text);
``stuck_stopping`` machines stay ``stopping`` after a stop; ``listing_lag``
leaves a new machine out of that many listings after its create. A machine name
is unique per app (a second create with a taken name answers 409) unless
``unique_names`` is False. ``foreign``
machines (created by someone else, without the scaler's metadata) are listed
and must never be stopped or destroyed.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from support.http import LocalServer
from worker.scaler.backend import IMAGE_METADATA, RELEASE_METADATA, Machine
from worker.scaler.process import ProcessBackend

# Every state a Fly machine passes through, as the Machines API names it.
FLY_STATES = ("created", "starting", "started", "stopping", "stopped", "suspended",
              "destroying", "destroyed", "replacing")  # fmt: skip


class FakeFly(LocalServer):
    """One Fly app; ``calls`` records (method, path, status) of every request."""

    def __init__(
        self, state_dir: Path | None, env: Mapping[str, str], token: str, app: str
    ) -> None:
        super().__init__()
        self.machines = ProcessBackend(state_dir, env) if state_dir is not None else None
        if self.machines is not None:
            self.machines.store_id = "fake-fly"  # the fake's own folder; Fly keeps metadata
        self.records: dict[str, dict[str, Any]] = {}  # machines without a process
        self.metadata: dict[str, dict[str, str]] = {}  # as each machine was created with
        self.names: dict[str, str] = {}  # machine name -> id
        self.token, self.app = token, app
        self.calls: list[tuple[str, str, int]] = []
        self.faults: list[tuple[int, dict[str, str]]] = []  # answers for the next calls
        self.fail_after_create = 0
        self.duplicate_listing = False
        self.page_size: int | None = None
        self.without_metadata = False
        self.echo_auth = False
        self.stuck_stopping: set[str] = set()
        self.states: dict[str, str] = {}  # machine id -> the state it is listed in
        self.foreign: dict[str, dict[str, Any]] = {}
        self.touched_foreign: list[str] = []
        self.bodies: list[Any] = []
        self.answers: list[str] = []  # every body the fake answered, as text
        self.unique_names = True  # False: a name already taken makes another machine
        self.listing_lag = 0  # a new machine is left out of this many listings after its create
        self._lagging: dict[str, int] = {}
        # Machines a DELETE or stop answers with this status for (an API whose listing
        # still shows a machine its own endpoints no longer find: 404).
        self.refuse_acts: dict[str, int] = {}
        # The next creates make their machine and answer 200 with this body (text):
        # garbage JSON, or JSON without an id.
        self.garbage_after_create: list[str] = []
        # Machine id -> the release its listing names (metadata of another release).
        self.listed_release: dict[str, str] = {}
        # Release -> another: the next machine created for the first is listed as the
        # second's (once per entry).
        self.mislabel_next: dict[str, str] = {}

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, token: str | None = None) -> dict[str, str]:
        return {"LANE_WORKER_FLY_API_URL": self.api_url, "FLY_API_TOKEN": token or self.token,
                "FLY_APP_NAME": self.app, "FLY_REGION": "ams"}  # fmt: skip

    def add_foreign(self, machine_id: str) -> None:
        self.foreign[machine_id] = {"id": machine_id, "state": "started", "config": {
            "image": "someone/else:1", "metadata": {}}}  # fmt: skip

    def creates(self) -> int:
        """How many machines were made (whatever the API answered)."""
        return len(self.metadata)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        status, answer = await self._answer(request)
        self.calls.append((request.method, request.raw_path, status))  # as sent
        if isinstance(answer, web.Response):
            self.answers.append(answer.text or "")
            return answer
        self.answers.append(json.dumps(answer))
        return web.json_response(answer, status=status)

    def _refusal(self, request: web.Request) -> web.Response:
        said = request.headers.get("Authorization", "")
        body = json.dumps(
            {"error": "unauthorized", "request": {"headers": {"Authorization": said}}}
        )
        text = f"{body}\nAuthorization: {said}\n" if self.echo_auth else '{"error":"unauthorized"}'
        return web.Response(status=401, text=text, content_type="application/json")

    async def _answer(self, request: web.Request) -> tuple[int, Any]:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, self._refusal(request)
        if self.faults:
            status, headers = self.faults.pop(0)
            return status, web.json_response({"error": "scripted"}, status=status, headers=headers)
        prefix = f"/v1/apps/{self.app}/machines"
        if not request.path.startswith(prefix):
            return 404, {"error": "not found"}
        rest = request.path[len(prefix) :].strip("/").split("/")
        if request.method == "GET" and rest == [""]:
            return 200, self._page(await self._listed(), request.query.get("cursor"))
        if request.method == "POST" and rest == [""]:
            return await self._create(await request.json())
        machine_id = rest[0]
        if machine_id in self.foreign:
            self.touched_foreign.append(f"{request.method} {request.path}")
            return 200, {}
        return await self._act(request.method, machine_id, rest[1:], request.query)

    async def _listed(self) -> list[dict[str, Any]]:
        listed = [*self.records.values()]
        if self.machines is not None:
            ids = {v: k for k, v in self.names.items()}
            listed += [{**_fly_json(m, self.metadata.get(m.machine_id, {})),
                        "name": ids.get(m.machine_id, m.machine_id)}
                       for m in await self.machines.list()]  # fmt: skip
        listed = [{**m, "state": self.states.get(m["id"], m["state"])} for m in listed]
        if self.without_metadata:
            listed = [{**m, "config": {k: v for k, v in m["config"].items() if k != "metadata"}}
                      for m in listed]  # fmt: skip
        if self.listed_release:
            listed = [{**m, "config": {**m["config"], "metadata": {
                **(m["config"].get("metadata") or {}),
                RELEASE_METADATA: self.listed_release[m["id"]]}}}
                if m["id"] in self.listed_release and "metadata" in m["config"] else m
                for m in listed]  # fmt: skip
        if self.duplicate_listing:
            listed = [m for m in listed for _ in range(2)]
        if self._lagging:
            late = {i for i, left in self._lagging.items() if left > 0}
            self._lagging = {i: left - 1 for i, left in self._lagging.items() if left > 1}
            listed = [m for m in listed if m["id"] not in late]
        return [*listed, *self.foreign.values()]

    def _page(self, listed: list[dict[str, Any]], cursor: str | None) -> Any:
        if self.page_size is None:
            return listed
        assert self.page_size > 1, "pages of one cannot overlap"
        start = int(cursor or 0)
        page = listed[start : start + self.page_size]
        # The next page starts one machine early: pages that overlap, as they may
        # when the list changes between two requests.
        more = start + self.page_size < len(listed)
        return {"machines": page, "next_cursor": str(start + self.page_size - 1) if more else None}

    async def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        self.bodies.append(body)
        name = body.get("name")
        if name and self.unique_names and name in self.names:
            return 409, {"error": f"a machine named {name} already exists"}
        config = body["config"]
        release = config["metadata"][RELEASE_METADATA]
        assert config["env"]["DEEPLINE_RUNTIME_DEPLOY_VERSION"] == release
        if self.machines is not None:
            made = await self.machines.create(release, config["image"])
            machine_id, shown = made.machine_id, _fly_json(made, dict(config["metadata"]))
        else:
            machine_id = f"fm-{len(self.metadata) + 1}"
            shown = {"id": machine_id, "state": "created", "region": "ams", "events": [],
                     "created_at": _now(0).isoformat(), "config": config}  # fmt: skip
            self.records[machine_id] = shown
        shown["name"] = name or machine_id
        self.metadata[machine_id] = dict(config["metadata"])
        if release in self.mislabel_next:
            self.listed_release[machine_id] = self.mislabel_next.pop(release)
        if self.listing_lag:
            self._lagging[machine_id] = self.listing_lag
        if name:
            self.names[name] = machine_id
        if self.garbage_after_create:
            text = self.garbage_after_create.pop(0)
            return 200, web.Response(status=200, text=text, content_type="application/json")
        if self.fail_after_create > 0:
            self.fail_after_create -= 1
            return 500, {"error": "internal error (the machine was created)"}
        return 200, shown

    async def _act(
        self, method: str, machine_id: str, rest: list[str], query: Mapping[str, str]
    ) -> tuple[int, Any]:
        if machine_id in self.refuse_acts:
            status = self.refuse_acts[machine_id]
            return status, {"error": f"machine {machine_id}: HTTP {status}"}
        if machine_id in self.records:
            record = self.records[machine_id]
            if method == "POST" and rest == ["stop"]:
                stuck = machine_id in self.stuck_stopping
                self.states.pop(machine_id, None)
                record["state"] = "stopping" if stuck else "stopped"
                return 200, {"ok": True}
            if method == "DELETE":
                listed = self.states.get(machine_id, record["state"])
                if listed in _ACTIVE and query.get("force") != "true":
                    return 412, {"error": f"machine is {listed}: refusing to delete it unforced"}
                self.states.pop(machine_id, None)
                record["state"] = "destroyed"  # listed a while longer, as Fly does
                return 200, {"ok": True}
            return 404, {"error": "no such endpoint"}
        if self.machines is None:
            return 404, {"error": "machine not found"}
        machine = {m.machine_id: m for m in await self.machines.list()}.get(machine_id)
        if machine is None:
            return 404, {"error": "machine not found"}
        if method == "POST" and rest == ["stop"]:
            await self.machines.stop(machine)
            return 200, {"ok": True}
        if method == "DELETE":
            await self.machines.destroy(machine)
            return 200, {"ok": True}
        return 404, {"error": "no such endpoint"}


def _now(age_s: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=age_s)


# A machine in these states is removed only with force=true, as Fly does.
_ACTIVE = frozenset({"started", "starting", "stopping", "replacing", "created"})

_FLY_STATES = {"started": "started", "starting": "starting", "stopping": "stopping",
               "failed": "failed"}  # fmt: skip


def _fly_json(m: Machine, metadata: dict[str, str]) -> dict[str, Any]:
    events = []
    if m.exit_code is not None:
        events.append({"type": "exit", "status": "stopped",
                       "request": {"exit_event": {"exit_code": m.exit_code}}})  # fmt: skip
    return {
        "id": m.machine_id,
        "state": _FLY_STATES.get(m.state, "stopped"),
        "region": "ams", "created_at": _now(m.age_s).isoformat(), "events": events,
        # Fly lists an image as it resolved it, not as it was asked for.
        "config": {"image": f"registry.example/{m.image}@sha256:0",
                   "env": {"DEEPLINE_RUNTIME_DEPLOY_VERSION": m.release_id},
                   "metadata": {RELEASE_METADATA: m.release_id, IMAGE_METADATA: m.image,
                                **metadata}},
    }  # fmt: skip
