"""One reconcile pass of the scaler: what each release needs, against what the backend runs.

Stateless: every pass reads the registry, the drain report and the backend's
machines, and acts on the difference, so a scaler that restarts (or a standby
that takes over) converges to the same end. The rules:

- the current release runs its desired count (up or down);
- a superseded release (``previous``: its lane still claims) keeps its machines;
- a retired release that is draining keeps its recorded count: a machine that
  died (stopped, failed, or no live worker of it past ``DEAD_AFTER_S``) is
  replaced from the release's image;
- a retired release that is drained has its machines stopped, then destroyed;
- a live machine of a release that is not drained is never stopped or destroyed,
  except the current release's surplus when its count goes down;
- once the current release has its desired count ready, what it supersedes is
  retired (``retire_superseded``: one transaction, recorded).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from worker.db.pool import Database
from worker.db.store import Store
from worker.db.store.rows import Deployment
from worker.ops.report import read_report
from worker.scaler.backend import Backend, BackendError, Machine

# A machine whose worker has not registered live this long after it was created
# (or has stopped beating since) is dead: a boot takes seconds.
DEAD_AFTER_S = 60.0
EXIT_CONFIG = 78  # a worker that refused its configuration
MAX_RESTART_BACKOFF_S = 300.0  # between machines of a release whose machines keep dying

log = structlog.get_logger("lane_worker.scaler")


@dataclass
class ReleaseSeen:
    """What one pass saw and did for one release (written to ``scaler_state``)."""

    desired: int = 0
    target: int = 0
    running: int = 0
    ready: int = 0
    actions: list[str] = field(default_factory=list)
    error: str | None = None
    boot_refused: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "desired": self.desired, "target": self.target, "running": self.running,
            "ready": self.ready, "actions": self.actions, "error": self.error,
            "bootRefused": self.boot_refused,
        }  # fmt: skip


class Reconciler:
    """Reconciles the registry with one backend."""

    def __init__(self, db: Database, store: Store, backend: Backend, *, actor: str) -> None:
        self.db, self.store, self.backend, self.actor = db, store, backend, actor
        # Per release: machines that died young in a row, and when the next may be created.
        # A release whose workers cannot boot is not recreated every pass (kept in memory:
        # a restarted scaler starts over, which is safe, only faster).
        self._died: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._why_died: dict[str, str] = {}  # the last one's exit, until one is ready

    async def once(self) -> dict[str, ReleaseSeen]:
        """Run one pass; return what it saw and did per release."""
        deployments = await self.db.run(self.store.registry.deployments)
        views = await self.db.run(lambda c: read_report(c, self.store))
        drained = {v.queue for v in views if v.status == "drained"}
        known_lanes = {v.queue for v in views}
        try:
            machines = await self.backend.list()
        except BackendError as exc:
            log.error("scaler.backend_failed", error=str(exc))
            return {d.release_id: ReleaseSeen(desired=d.desired, error=str(exc))
                    for d in deployments}  # fmt: skip
        by_release: dict[str, list[Machine]] = {}
        for m in machines:
            by_release.setdefault(m.release_id, []).append(m)
        seen: dict[str, ReleaseSeen] = {}
        for d in deployments:
            lane_drained = d.role == "retired" and (
                d.queue in drained or d.queue not in known_lanes
            )
            seen[d.release_id] = await self._release(d, by_release.pop(d.release_id, []),
                                                     lane_drained)  # fmt: skip
        # Machines carrying the mark of a release the registry does not have: left
        # alone (their lane may still hold work), and shown.
        for release_id, orphans in by_release.items():
            seen[release_id] = ReleaseSeen(running=sum(m.running for m in orphans),
                                           error="not in the registry: left alone")  # fmt: skip
        await self._maybe_retire(deployments, seen)
        return seen

    async def _release(self, d: Deployment, mine: list[Machine], drained: bool) -> ReleaseSeen:
        seen = ReleaseSeen(desired=d.desired, boot_refused=self._why_died.get(d.release_id))
        live = set(d.live_machines)
        ready = set(d.ready_machines)
        release_id = d.release_id
        try:
            alive: list[Machine] = []
            for m in mine:
                if not m.running:
                    if m.exit_code not in (None, 0):
                        self._note_death(release_id)
                    if m.exit_code == EXIT_CONFIG:
                        seen.boot_refused = (
                            f"machine {m.machine_id} exited 78 (its worker refused the "
                            "configuration; see its log)"
                        )
                    elif m.exit_code not in (None, 0):
                        seen.boot_refused = (
                            f"machine {m.machine_id} exited {m.exit_code} (its worker could not "
                            "start or crashed; see its log)"
                        )
                    if seen.boot_refused:
                        self._why_died[release_id] = seen.boot_refused
                    await self._act(seen, release_id, "destroyed", m, "it is not running")
                    continue
                if m.machine_id not in live and m.age_s > DEAD_AFTER_S and not drained:
                    why = f"no live worker on it {DEAD_AFTER_S:g} s after it started"
                    await self._act(seen, release_id, "replaced", m, why)
                    continue
                alive.append(m)
            seen.running = len(alive)
            seen.ready = sum(1 for m in alive if m.machine_id in ready)
            if seen.ready:
                self._died.pop(release_id, None)
                self._not_before.pop(release_id, None)
                self._why_died.pop(release_id, None)
                seen.boot_refused = None
            if drained:
                seen.target = 0
                for m in alive:
                    await self._act(seen, release_id, "stopped", m, "its lane is drained")
                return seen
            seen.target = d.desired
            wait_s = self._not_before.get(release_id, 0.0) - time.monotonic()
            if d.desired > len(alive) and wait_s > 0:
                seen.actions.append(f"waiting {wait_s:.0f} s before starting another machine")
                return seen
            for _ in range(d.desired - len(alive)):
                made = await self.backend.create(d.release_id, d.image)
                seen.actions.append(f"created {made.machine_id}")
                await self._record(d.release_id, "machine_created",
                                   {"machine": made.machine_id, "image": d.image,
                                    "reason": f"{len(alive)} of {d.desired} running"})  # fmt: skip
                log.info("scaler.machine_created", release_id=d.release_id,
                         machine=made.machine_id, image=d.image)  # fmt: skip
            if d.role == "current" and len(alive) > d.desired:
                # Scaling the current release down: machines without a live worker first.
                surplus = sorted(alive, key=lambda m: (m.machine_id in live, -m.age_s))
                for m in surplus[: len(alive) - d.desired]:
                    await self._act(seen, release_id, "stopped", m, "above the desired count")
        except BackendError as exc:
            seen.error = str(exc)
            log.error("scaler.backend_failed", release_id=release_id, error=str(exc))
        return seen

    def _note_death(self, release_id: str) -> None:
        """A machine of the release exited with an error: back off before the next one."""
        died = self._died.get(release_id, 0) + 1
        self._died[release_id] = died
        self._not_before[release_id] = time.monotonic() + min(MAX_RESTART_BACKOFF_S, 2.0**died)

    async def _act(
        self, seen: ReleaseSeen, release_id: str, action: str, m: Machine, reason: str
    ) -> None:
        """Stop (and, for a machine that is not running, destroy) ``m``; record why."""
        if m.running:
            await self.backend.stop(m)
        if action in ("destroyed", "replaced") or not m.running:
            await self.backend.destroy(m)
        seen.actions.append(f"{action} {m.machine_id}")
        await self._record(release_id, f"machine_{action}",
                           {"machine": m.machine_id, "reason": reason,
                            "exitCode": m.exit_code})  # fmt: skip
        log.info(f"scaler.machine_{action}", release_id=release_id, machine=m.machine_id,
                 reason=reason, exit_code=m.exit_code)  # fmt: skip

    async def _record(self, release_id: str, action: str, detail: dict[str, Any]) -> None:
        await self.db.run(
            lambda c: self.store.registry.record(
                c, release_id=release_id, action=action, actor=self.actor, detail=detail
            )
        )

    async def _maybe_retire(
        self, deployments: list[Deployment], seen: dict[str, ReleaseSeen]
    ) -> None:
        current = next((d for d in deployments if d.role == "current"), None)
        if current is None or not any(d.role == "previous" for d in deployments):
            return
        ready = seen.get(current.release_id, ReleaseSeen()).ready
        # A current release that runs no machine takes nothing over: the superseded
        # ones keep claiming (no lane would otherwise take new runs).
        if current.desired == 0 or ready < current.desired:
            return
        retired = await self.db.run(
            lambda c: self.store.registry.retire_superseded(c, actor=self.actor)
        )
        if retired:
            log.info("scaler.retired", current=current.release_id, retired=retired, ready=ready)
