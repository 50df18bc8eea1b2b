"""Sandbox cleanup: the engine task ``daytona-sandbox-cleanup`` deletes a sandbox a run left.

When a run that registered sandboxes (``ctx.register_sandbox``) ends, the store
spawns one such task per sandbox on its lane queue (migration 0011). Any worker
that claims one deletes the sandbox with Daytona's Python SDK (the optional
extra ``lane-worker[daytona]``, configured by ``DAYTONA_API_KEY``,
``DAYTONA_API_URL`` and ``DAYTONA_TARGET``). A sandbox already gone counts as
cleaned. A failure is retried by the engine (20 attempts, 2 s doubling to at
most 10 minutes apart); the last one gives the cleanup up, and the drain report
names the sandbox. Every SDK call is bounded well inside the claim, so a
cleanup cut off by a SIGKILL is claimed again when its lease ends. A worker
without the SDK or the API key puts the task back (30 s, no attempt spent) and
says so once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from worker.config.dburl import url_secrets
from worker.db import engine
from worker.db.pool import Database
from worker.db.store import Store
from worker.masking import joined, mask_response, secret_forms
from worker.states import Outcome

SANDBOX_CLEANUP_TASK = "daytona-sandbox-cleanup"
NOT_CONFIGURED_RETRY_S = 30.0
API_KEY_ENV, API_URL_ENV, TARGET_ENV = "DAYTONA_API_KEY", "DAYTONA_API_URL", "DAYTONA_TARGET"

log = structlog.get_logger("lane_worker.sandbox")


class SandboxDeleter(Protocol):
    """Deletes one sandbox; says ``deleted`` or ``gone`` (already deleted), else raises."""

    async def delete(self, sandbox_id: str, *, timeout_s: float) -> str: ...


@dataclass(frozen=True)
class DaytonaDeleter:
    """Deletes sandboxes with Daytona's official Python SDK (``AsyncDaytona``)."""

    api_key: str = ""  # a secret: never logged (the dataclass repr hides it)
    api_url: str | None = None
    target: str | None = None

    def __repr__(self) -> str:
        return f"DaytonaDeleter(api_url={self.api_url!r}, target={self.target!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> tuple[DaytonaDeleter | None, str | None]:
        """Return a deleter, or None and why this worker cannot delete sandboxes."""
        key = (env.get(API_KEY_ENV) or "").strip()
        try:
            import daytona  # noqa: F401 (the optional extra)
        except ImportError:
            return None, "the Daytona SDK is not installed (pip install 'lane-worker[daytona]')"
        if not key:
            return None, f"{API_KEY_ENV} is not set"
        url = (env.get(API_URL_ENV) or "").strip() or None
        target = (env.get(TARGET_ENV) or "").strip() or None
        return cls(key, url, target), None

    async def delete(self, sandbox_id: str, *, timeout_s: float) -> str:
        from daytona import AsyncDaytona, DaytonaConfig, DaytonaNotFoundError

        config = DaytonaConfig(api_key=self.api_key, api_url=self.api_url, target=self.target)
        # Each SDK call has its own request timeout; the whole is bounded too
        # (a connection that hangs before the request is sent).
        async with asyncio.timeout(timeout_s * 2 + 1), AsyncDaytona(config) as client:
            try:
                sandbox = await client.get(sandbox_id, request_timeout=timeout_s)
                await client.delete(sandbox, timeout=timeout_s)
            except DaytonaNotFoundError:
                return "gone"
        return "deleted"


def cleanup_params(params: Any) -> tuple[uuid.UUID, str] | None:
    """Return the task's (run id, sandbox id), or None when its params are not that."""
    if not isinstance(params, dict):
        return None
    sandbox_id = params.get("sandboxId")
    try:
        run_id = uuid.UUID(str(params.get("runId")))
    except ValueError:
        return None
    if not isinstance(sandbox_id, str) or not sandbox_id.strip():
        return None
    return run_id, sandbox_id


class SandboxCleanups:
    """Executes claimed ``daytona-sandbox-cleanup`` tasks (no play code, no launch row)."""

    def __init__(
        self,
        db: Database,
        store: Store,
        *,
        deleter: SandboxDeleter | None,
        why_not: str | None,
        lease_s: int,
    ) -> None:
        self.db, self.store, self.deleter = db, store, deleter
        self.why_not = why_not
        # Well inside the lease: two calls and the store writes fit in it.
        self.call_timeout_s = max(1.0, lease_s / 4)
        self._said_why_not = False
        self._db_secrets = url_secrets(db.options.url)

    def _secrets(self) -> tuple[str, ...]:
        """What an SDK error may echo and must not keep: the API key, the database password."""
        key = getattr(self.deleter, "api_key", "")
        return joined(secret_forms(key) if isinstance(key, str) else (), self._db_secrets)

    async def handle(self, claimed: engine.ClaimedRun) -> Outcome:
        """Delete the task's sandbox and settle the task; return how its attempt ended."""
        q, run = claimed.queue, claimed.run_id
        found = cleanup_params(claimed.params)
        bound = log.bind(queue=q, task_id=str(claimed.task_id))
        if found is None:
            await self.db.run(lambda c: engine.cancel(c, q, claimed.task_id))
            bound.error("sandbox.cleanup_bad_params")
            return Outcome.CANCELLED
        run_id, sandbox_id = found
        bound = bound.bind(run_id=str(run_id), sandbox_id=sandbox_id)
        if self.deleter is None:
            if not self._said_why_not:
                self._said_why_not = True
                bound.warning(
                    "sandbox.cleanup_unavailable",
                    reason=self.why_not,
                    detail="this worker leaves sandbox cleanups queued for a worker that can",
                )
            await self.db.run(lambda c: engine.schedule_in(c, q, run, NOT_CONFIGURED_RETRY_S))
            return Outcome.DEFERRED
        try:
            how = await self.deleter.delete(sandbox_id, timeout_s=self.call_timeout_s)
        except Exception as exc:
            return await self._failed(claimed, run_id, sandbox_id, exc, bound)

        async def done(conn: Any) -> None:
            await engine.complete(conn, q, run, {"sandboxId": sandbox_id, "result": how})
            await self.store.sandboxes.done(conn, run_id=run_id, sandbox_id=sandbox_id)

        await self.db.transaction(done)
        bound.info("sandbox.cleaned", result=how, attempt=claimed.attempt)
        return Outcome.COMPLETED

    async def _failed(
        self,
        claimed: engine.ClaimedRun,
        run_id: uuid.UUID,
        sandbox_id: str,
        exc: Exception,
        bound: Any,
    ) -> Outcome:
        # The class and the SDK's sentence, masked (an echoed request carries the key).
        error = {
            "name": type(exc).__name__,
            "message": mask_response(str(exc), self._secrets(), 500),
        }
        last = claimed.max_attempts is not None and claimed.attempt >= claimed.max_attempts
        q, run = claimed.queue, claimed.run_id

        async def record(conn: Any) -> None:
            await engine.fail(conn, q, run, error)  # the engine's retry policy decides when
            await self.store.sandboxes.failed_try(
                conn, run_id=run_id, sandbox_id=sandbox_id, error=error, last=last
            )

        await self.db.transaction(record)
        if last:
            bound.error("sandbox.cleanup_given_up", attempt=claimed.attempt, **error)
            return Outcome.FAILED
        bound.warning("sandbox.cleanup_retry", attempt=claimed.attempt, **error)
        return Outcome.RETRYING
