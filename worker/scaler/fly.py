"""The Fly backend: machines are Fly Machines, through the Machines REST API.

``FLY_API_TOKEN`` (sent as ``Authorization: Bearer``; never logged, never given to a
machine), ``FLY_APP_NAME`` (or ``LANE_WORKER_FLY_APP``, which wins: the workers' app,
for a scaler running in an app of its own), ``FLY_REGION`` and
``LANE_WORKER_FLY_API_URL`` (the API's address without ``/v1``; default Fly's public
one). A machine is created with the release's image,
``DEEPLINE_RUNTIME_DEPLOY_VERSION`` set to the release in its env, the
``lane_worker_release`` metadata, an HTTP check on ``/readyz``, ``stop_config`` with
SIGTERM and a timeout above the worker's longest stop, and no restart policy (the
scaler replaces a machine that died). Secrets such as the database URL reach machines
as the app's own secrets (``fly secrets``). Calls are retried with tenacity on 429
(honouring ``Retry-After`` up to ``MAX_RETRY_WAIT_S``), 5xx and timeouts; a 429 asking
for a longer wait is ``RateLimited`` at once (the scaler leaves the API alone that
long, at most ``MAX_RETRY_AFTER_S``, and its passes go on saying so); a 401, 403 or
404 is one clear error (the pass records it and the next pass tries again), never a
crash. What is kept of an answer is masked (``worker.masking``): a refusal may echo
the token. A create is idempotent: it carries a name and a key of its own, and before
it is sent again (after a 5xx, a timeout, or a name already taken) the listing is
searched for it for ``_CREATE_FIND_S`` (a new machine may be listed seconds late, and
an API that does not keep names unique would make a twin). A listing is read page by
page when the API answers with a cursor, and a machine it names twice is one machine.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from worker.config.dburl import url_secrets
from worker.config.env import DATABASE_URL_ENV, FLY_APP_ENV
from worker.errors import LaneConfigError
from worker.masking import joined, mask_response, secret_forms
from worker.scaler.backend import (
    CREATE_METADATA,
    FAILED,
    IMAGE_METADATA,
    MAX_RETRY_AFTER_S,
    RELEASE_METADATA,
    STARTED,
    STARTING,
    STOPPED,
    STOPPING,
    STORE_METADATA,
    BackendError,
    Machine,
    machine_stop_s,
    one_per_id,
)

DEFAULT_API_URL = "https://api.machines.dev"
API_URL_ENV, TOKEN_ENV, APP_ENV, REGION_ENV = (
    "LANE_WORKER_FLY_API_URL",
    "FLY_API_TOKEN",
    "FLY_APP_NAME",
    "FLY_REGION",
)
# The workers' app, for a scaler that runs in an app of its own: Fly sets FLY_APP_NAME
# in every machine to the app it runs in, so the scaler's own app cannot name another.
WORKER_APP_ENV = FLY_APP_ENV
HEALTH_PORT = 8080  # the image's LANE_WORKER_HEALTH_PORT (Dockerfile, fly.toml)
_STATES = {
    "started": STARTED,
    "created": STARTING,
    "starting": STARTING,
    "replacing": STARTING,
    "updating": STARTING,
    "stopping": STOPPING,
    "stopped": STOPPED,
    "suspending": STOPPING,
    "suspended": STOPPED,
    "failed": FAILED,
}
# On its way out or gone: neither counted nor acted on (a replacement is started).
_GONE = frozenset({"destroying", "destroyed"})
_SHOWN_BODY = 200  # characters of a refusal's body kept in the error
_CREATE_TRIES = 5
_MAX_PAGES = 1000  # a cursor that never ends is an API fault, not a listing
# The longest Retry-After a call waits out between its tries; a longer one ends the
# call (RateLimited) so that no pass, and no stop of the scaler, waits on it.
MAX_RETRY_WAIT_S = 10.0
# After a create that got no answer, the listing is searched for its machine this
# long before the create is sent again (a machine is listed a few seconds late).
_CREATE_FIND_S = 12.0


class _Retryable(Exception):
    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Refused(BackendError):
    """The API answered a 4xx."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Unanswered(BackendError):
    """No answer the API meant (5xx, 429, a timeout) after every try."""


class UnreadableReply(BackendError):
    """A 2xx whose body is not what the call answers (not JSON, or no machine in it)."""


class RateLimited(Unanswered):
    """A 429 whose ``Retry-After`` is above ``MAX_RETRY_WAIT_S``: not waited out here."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class FlyBackend:
    """Fly Machines of one app, in one region."""

    name = "fly"

    def __init__(
        self,
        *,
        api_url: str,
        token: str,
        app: str,
        region: str | None,
        stop_s: float = 60.0,
        also_secret: Sequence[str] = (),
    ) -> None:
        self.api_url = api_url.rstrip("/")
        # Fly's stop timeout (then it kills the machine): above the worker's longest stop.
        self.stop_timeout_s = math.ceil(stop_s)
        self.stop_deadline_s = self.stop_timeout_s + 30.0
        self._token = token
        self.app = app
        self.region = region
        self.store_id = ""  # the scaler sets it before its first call
        # Masked in whatever is kept of an answer: the token in every spelling, and
        # the database's passwords (the scaler's own secrets).
        self.secrets = joined(secret_forms(token), also_secret)

    def __repr__(self) -> str:  # the token stays out of every repr
        return f"FlyBackend(api_url={self.api_url!r}, app={self.app!r}, region={self.region!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str], region: str | None = None) -> FlyBackend:
        token = (env.get(TOKEN_ENV) or "").strip()
        app_env = WORKER_APP_ENV if (env.get(WORKER_APP_ENV) or "").strip() else APP_ENV
        app = (env.get(app_env) or "").strip()
        for name, value in ((TOKEN_ENV, token), (app_env, app)):
            if not value:
                raise LaneConfigError(
                    f"{name} is not set: the fly backend needs it (`fly tokens create deploy`, "
                    "and the app's name).",
                    variable=name,
                )
            if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
                # A header cannot carry it: every call would fail, pass after pass. The
                # value itself is never shown.
                raise LaneConfigError(
                    f"{name} holds a control character (a line break where it was pasted?): "
                    "set it to the value on one line.",
                    variable=name,
                )
        return cls(
            api_url=(env.get(API_URL_ENV) or "").strip() or DEFAULT_API_URL,
            token=token,
            app=app,
            region=region or (env.get(REGION_ENV) or "").strip() or None,
            # The machines' drain window is the scaler's LANE_WORKER_DRAIN_SECONDS
            # (25 s by default): set it alike for both. 60 s at least, as before.
            stop_s=max(60.0, machine_stop_s(env) + 15.0),
            also_secret=url_secrets((env.get(DATABASE_URL_ENV) or "").strip()),
        )

    async def _call(self, method: str, path: str, body: Any = None, *, tries: int = 5) -> Any:
        """One API call, retried on 429, 5xx and timeouts; a refusal raises BackendError."""
        url = f"{self.api_url}/v1/apps/{self.app}{path}"
        headers = {"Authorization": f"Bearer {self._token}"}

        async def once() -> Any:
            timeout = aiohttp.ClientTimeout(total=30)
            try:
                async with (
                    aiohttp.ClientSession(timeout=timeout) as http,
                    http.request(method, url, json=body, headers=headers) as response,
                ):
                    text = await response.text()
                    if response.status == 429 or response.status >= 500:
                        after = response.headers.get("Retry-After")
                        wait_s = float(after) if after and after.isdigit() else None
                        if wait_s is not None and wait_s > MAX_RETRY_WAIT_S:
                            left_s = min(wait_s, MAX_RETRY_AFTER_S)
                            at = datetime.now(UTC) + timedelta(seconds=left_s)
                            raise RateLimited(
                                f"Fly Machines API {method} {path}: HTTP {response.status}, rate "
                                f"limited by the Machines API (Retry-After: {wait_s:g} s); the "
                                f"scaler calls it again at {at:%Y-%m-%d %H:%M:%S} UTC",
                                left_s,
                            )
                        raise _Retryable(f"HTTP {response.status}", wait_s)
                    if response.status >= 400:
                        said = mask_response(text.strip(), self.secrets, _SHOWN_BODY)
                        raise Refused(
                            f"Fly Machines API {method} {path}: HTTP {response.status} "
                            f"({said or 'no body'})",
                            response.status,
                        )
                    try:
                        return await response.json(content_type=None) if text else None
                    except ValueError:
                        raise UnreadableReply(
                            f"Fly Machines API {method} {path}: HTTP {response.status} with a "
                            "body that is not JSON"
                        ) from None
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                raise _Retryable(type(exc).__name__) from exc

        def wait(state: Any) -> float:
            exc = state.outcome.exception() if state.outcome else None
            base = float(wait_exponential_jitter(multiplier=0.5, max=10)(state))
            after = getattr(exc, "retry_after_s", None)
            return max(base, after) if after is not None else base

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
                stop=stop_after_attempt(tries),
                wait=wait,
                reraise=True,
            ):
                with attempt:
                    return await once()
        except _Retryable as exc:
            raise Unanswered(
                f"Fly Machines API {method} {path}: {exc} (gave up after {tries} tries)"
            ) from None
        return None  # pragma: no cover (AsyncRetrying returns or raises)

    async def _listing(self) -> list[dict[str, Any]]:
        """Every machine the API lists, following its cursor when it pages the answer."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        seen_cursors: set[str] = set()
        for _ in range(_MAX_PAGES):
            path = "/machines" + (f"?cursor={quote(cursor, safe='')}" if cursor else "")
            page = await self._call("GET", path)
            if page is None or isinstance(page, list):
                return [*found, *(m for m in page or [] if isinstance(m, dict))]
            items = page.get("machines") if isinstance(page, dict) else None
            if not isinstance(items, list):
                raise BackendError(
                    "Fly Machines API GET /machines answered neither a list nor a page of machines"
                )
            found += [m for m in items if isinstance(m, dict)]
            cursor = page.get("next_cursor") or page.get("nextCursor") or None
            if not cursor:
                return found
            if cursor in seen_cursors:
                raise BackendError(
                    "Fly Machines API GET /machines: its cursor went round in a loop"
                )
            seen_cursors.add(str(cursor))
            cursor = str(cursor)
        raise BackendError(f"Fly Machines API GET /machines: more than {_MAX_PAGES} pages")

    async def list(self) -> list[Machine]:
        machines: list[Machine] = []
        for m in await self._listing():
            config = _object(m.get("config"))
            metadata = _object(config.get("metadata"))
            release = metadata.get(RELEASE_METADATA)
            if not release or m.get("id") is None or m.get("state") in _GONE:
                continue  # not the scaler's (or on its way out): never touched
            if metadata.get(STORE_METADATA) != self.store_id:
                continue  # a scaler of another database shares this app: its machines
            machines.append(_machine(m, str(release), metadata, config))
        # Listed twice (pages that overlap, eventual consistency): one machine.
        return one_per_id(machines)

    async def create(self, release_id: str, image: str) -> Machine:
        if not self.store_id:
            raise BackendError("the fly backend has no store id yet: nothing is created")
        # This create's own key and name: a try after an answer that was lost (a 5xx
        # after the machine was made, a timeout) finds the machine instead of a twin.
        key = secrets.token_hex(8)
        config = {
            "image": image,
            "env": {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release_id},
            "metadata": {
                RELEASE_METADATA: release_id,
                IMAGE_METADATA: image,
                STORE_METADATA: self.store_id,
                CREATE_METADATA: key,
            },
            "checks": {
                "readyz": {
                    "type": "http",
                    "port": HEALTH_PORT,
                    "path": "/readyz",
                    "interval": "10s",
                    "timeout": "2s",
                }
            },
            "stop_config": {"signal": "SIGTERM", "timeout": f"{self.stop_timeout_s}s"},
            "restart": {"policy": "no"},
        }
        body: dict[str, Any] = {"name": f"lane-worker-{key}", "config": config}
        if self.region:
            body["region"] = self.region
        last = ""
        # No pause between tries: each follows a search of the listing that lasts
        # _CREATE_FIND_S when it finds nothing.
        for _ in range(_CREATE_TRIES):
            try:
                made = await self._call("POST", "/machines", body, tries=1)
            except RateLimited:
                raise
            except Unanswered as exc:
                last = str(exc)
            except Refused as exc:
                if exc.status not in (409, 422):  # not "that name is taken": a refusal
                    raise
                last = str(exc)
            except UnreadableReply as exc:
                last = str(exc)  # a 2xx: it made the machine and the answer is lost
            else:
                if isinstance(made, dict) and made.get("id") not in (None, ""):
                    return Machine(
                        machine_id=str(made["id"]),
                        release_id=release_id,
                        image=image,
                        state=_STATES.get(str(made.get("state")), STARTING),
                        age_s=0.0,
                    )
                # A 2xx without a machine id made its machine: an answer that is lost
                # (forgetting it would let every pass create again).
                last = "Fly Machines API POST /machines answered without a machine id"
            found = await self._find_made(key)
            if found is not None:
                return found
        raise BackendError(
            f"{last}; no machine of this create is listed (gave up after {_CREATE_TRIES} tries)"
        )

    async def _find_made(self, key: str) -> Machine | None:
        """The machine a create with ``key`` made, searched for ``_CREATE_FIND_S`` (a
        listing may show a new machine seconds late: sending the create again at once
        would make a twin where the API does not keep names unique)."""
        with anyio.move_on_after(_CREATE_FIND_S):
            while True:
                found = await self._made_by(key)
                if found is not None:
                    return found
                await anyio.sleep(2.0)
        return None

    async def _made_by(self, key: str) -> Machine | None:
        """The machine a create with ``key`` made, if the listing shows it."""
        for m in await self._listing():
            config = _object(m.get("config"))
            metadata = _object(config.get("metadata"))
            if m.get("name") == f"lane-worker-{key}" or metadata.get(CREATE_METADATA) == key:
                if m.get("id") is None or m.get("state") in _GONE:
                    continue
                release = str(metadata.get(RELEASE_METADATA) or "")
                return _machine(m, release, metadata, config)
        return None

    async def stop(self, machine: Machine) -> None:
        await self._call("POST", f"/machines/{_segment(machine.machine_id)}/stop", {})

    async def destroy(self, machine: Machine) -> None:
        # Forced for any machine that is not stopped (a dead one, or one stuck stopping:
        # the API refuses to remove an active machine without it).
        force = "false" if machine.state == STOPPED else "true"
        await self._call("DELETE", f"/machines/{_segment(machine.machine_id)}?force={force}")

    def where_logs(self, machine_id: str) -> str:
        return f"fly logs --app {self.app} --machine {machine_id}"


def _machine(
    m: Mapping[str, Any], release: str, metadata: Mapping[str, Any], config: Mapping[str, Any]
) -> Machine:
    return Machine(
        machine_id=str(m["id"]),
        release_id=release,
        image=str(metadata.get(IMAGE_METADATA) or config.get("image") or ""),
        state=_STATES.get(str(m.get("state")), STARTING),
        age_s=_age_s(m.get("created_at")),
        exit_code=_exit_code(m),
    )


def _segment(machine_id: str) -> str:
    """A machine id as one path segment: an id with `/`, `..`, `?` or `#` in it (as a
    listing may hold) must not reach another app's machine, or force a removal."""
    return quote(machine_id, safe="")


def _object(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one: a machine of another tool in
    the app's listing may have any shape, and must not make every pass fail."""
    return value if isinstance(value, dict) else {}


def _age_s(created_at: Any) -> float:
    try:
        return max(0.0, time.time() - datetime.fromisoformat(str(created_at)).timestamp())
    except ValueError:
        return 0.0


def _exit_code(machine: Mapping[str, Any]) -> int | None:
    """The exit code of the machine's last exit event, if it has one."""
    events = machine.get("events")
    for event in events if isinstance(events, list) else []:
        if isinstance(event, dict) and event.get("type") == "exit":
            code = _object(_object(event.get("request")).get("exit_event")).get("exit_code")
            if isinstance(code, int):
                return code
    return None
