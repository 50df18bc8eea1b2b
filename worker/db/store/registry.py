"""Store queries of the release registry and the scaler (migrations 0012, 0013, 0026)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from worker.db.pool import Connection
from worker.db.store.api import refusals
from worker.db.store.base import Queries
from worker.db.store.rows import (
    Deployment,
    DeploymentEvent,
    ReleaseHold,
    ScalerCreate,
    ScalerState,
)
from worker.errors import ReleasesHeldError


class RegistryQueries(Queries):
    """``deployments``, ``deployment_events``, ``scaler_state`` and ``scaler_creates``."""

    FILE = "registry.sql"

    async def deploy(
        self,
        conn: Connection,
        *,
        release_id: str,
        image: str,
        desired: int,
        actor: str,
        action: str = "deployed",
        force: bool = False,
        gate: list[dict[str, Any]] | None = None,
        gate_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Record a release as current (its image, its machines); the former current is previous.

        With a ``gate`` the release is the candidate instead: the current release stays
        current until the scaler's gate runs pass (migration 0050).
        Refused (``ReleasesHeldError``) while the registry is held, unless ``force``.
        """
        try:
            said: dict[str, Any] = await refusals(
                self._value(
                    conn,
                    "deploy_release",
                    *(release_id, image, desired, actor, action, force, gate, gate_timeout_s),
                )
            )
        except asyncpg.ObjectNotInPrerequisiteStateError as exc:
            raise ReleasesHeldError(str(exc.message)) from None
        return said

    async def hold(self, conn: Connection, *, actor: str, reason: str | None) -> dict[str, Any]:
        """Hold the registry (again: the hold stays as it was); return the hold."""
        said: dict[str, Any] = await refusals(self._value(conn, "hold_releases", actor, reason))
        return said

    async def resume(self, conn: Connection, *, actor: str) -> bool:
        """End the hold; False when there was none."""
        return bool(await self._value(conn, "resume_releases", actor))

    async def held(self, conn: Connection) -> ReleaseHold | None:
        """The registry's hold, or None."""
        return await self._row(conn, ReleaseHold, "release_hold")

    async def retire_superseded(
        self, conn: Connection, *, actor: str, current: Deployment | None = None
    ) -> list[str]:
        """Retire every release the ready current one supersedes; return them.

        With ``current``, only while that release, as deployed then, is still current.
        """
        if current is None:
            return list(await self._value(conn, "retire_superseded", actor) or [])
        retired = await self._value(
            conn, "retire_superseded_by", actor, current.release_id, current.deployed_at
        )
        return list(retired or [])

    async def gate_begun(self, conn: Connection, d: Deployment) -> float | None:
        """Start the candidate ``d``'s gate clock (once); seconds since, or None when ``d``
        is no longer an undecided candidate or the registry is held."""
        age = await self._value(conn, "gate_begun", d.release_id, d.deployed_at)
        return None if age is None else float(age)

    async def gate_passed(
        self, conn: Connection, *, actor: str, d: Deployment, runs: list[str]
    ) -> bool:
        """Promote the candidate ``d`` (as deployed then); False when that changed."""
        return bool(
            await self._value(conn, "gate_passed", actor, d.release_id, d.deployed_at, runs)
        )

    async def gate_failed(
        self, conn: Connection, *, actor: str, d: Deployment, run_id: str, reason: str
    ) -> bool:
        """Retire the candidate ``d`` (as deployed then); False when that changed."""
        return bool(
            await self._value(
                conn, "gate_failed", actor, d.release_id, d.deployed_at, run_id, reason
            )
        )

    async def deployments(self, conn: Connection) -> list[Deployment]:
        return await self._rows(conn, Deployment, "deployments")

    async def events(
        self, conn: Connection, *, release_id: str | None = None, limit: int = 50
    ) -> list[DeploymentEvent]:
        return await self._rows(conn, DeploymentEvent, "deployment_events", release_id, limit)

    async def record(
        self, conn: Connection, *, release_id: str, action: str, actor: str, detail: dict[str, Any]
    ) -> None:
        await self._run(conn, "record_event", release_id, action, actor, detail)

    async def boot_failed(
        self,
        conn: Connection,
        *,
        release_id: str,
        failed: dict[str, Any] | None,
        deployed_at: datetime | None = None,
    ) -> None:
        """Record that the deploy of ``deployed_at`` cannot boot (``failed``: the
        scaler's masked word), or with None clear any record (migration 0047)."""
        if failed is None:
            await self._run(conn, "boot_failed_clear", release_id)
        else:
            await self._run(conn, "boot_failed_set", release_id, failed, deployed_at)

    async def scaler_beat(
        self, conn: Connection, *, holder: str, backend: str, releases: dict[str, Any]
    ) -> None:
        await self._run(conn, "scaler_beat", holder, backend, releases)

    async def store_id(self, conn: Connection) -> str:
        """This store's identity (migration 0013), which the scaler marks machines with."""
        return str(await self._value(conn, "store_id"))

    async def scaler_state(self, conn: Connection) -> ScalerState | None:
        return await self._row(conn, ScalerState, "scaler_state")

    async def create_sent(self, conn: Connection, *, key: str, release_id: str, image: str) -> None:
        """Remember a create before it is sent (a scaler cut off mid-create still counts it)."""
        await self._run(conn, "create_sent", key, release_id, image)

    async def create_made(self, conn: Connection, *, key: str, machine_id: str) -> None:
        await self._run(conn, "create_made", key, machine_id)

    async def create_refused(self, conn: Connection, *, key: str) -> None:
        await self._run(conn, "create_refused", key)

    async def creates_seen(self, conn: Connection, *, listed: list[str], gone: list[str]) -> None:
        """The created machines the backend now lists, and those it no longer lists."""
        await self._run(conn, "creates_seen", listed, gone)

    async def creates_remembered(
        self, conn: Connection, *, unlisted_s: float, unknown_s: float
    ) -> list[ScalerCreate]:
        """The creates to remember, once those older than ``unlisted_s`` (not listed) or
        ``unknown_s`` (no machine id), or of a release no longer deployed, are forgotten."""
        return await self._rows(conn, ScalerCreate, "creates_remembered", unlisted_s, unknown_s)

    async def gate_submit_run(
        self, conn: Connection, *, d: Deployment, index: int, key: str
    ) -> dict[str, Any]:
        """Submit gate run ``index`` of the candidate ``d`` (store 0051: its own gate's play
        and input only; the run is remembered as a gate run); submit_run's answer."""
        said: dict[str, Any] = await refusals(
            self._value(conn, "gate_submit_run", d.release_id, d.deployed_at, index, key)
        )
        return said

    async def gate_run_status(self, conn: Connection, *, run_id: str) -> dict[str, Any]:
        """A gate run's run_status (store 0051)."""
        said: dict[str, Any] = await refusals(
            self._value(conn, "gate_run_status", uuid.UUID(run_id))
        )
        return said

    async def gate_cancel_run(self, conn: Connection, *, run_id: str, reason: str) -> None:
        """Cancel a gate run (store 0051); a run already ended stays as it is."""
        await refusals(self._value(conn, "gate_cancel_run", uuid.UUID(run_id), reason))
