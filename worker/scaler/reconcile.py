"""One reconcile pass of the scaler: observe, plan, act.

A pass reads the registry, the drain report and the backend's machines;
``observe.py`` turns them, with what this scaler watched, into the plan's
narrow state; ``plan.py`` decides purely what to do (its docstring has the
rules); this module performs the actions on the backend in order, records each
in the registry (``deployment_events``) and keeps what the pass saw and did per
release (``ReleaseSeen``, written to ``scaler_state``). What acting needs and
deciding does not stays here:

- the lock: ``guard`` is awaited before every action, so a scaler that lost its
  lock mid-pass stops acting at once;
- a backend error stops that release's actions for the pass (its word carries
  the error; the next pass tries again), and a release whose actions stopped
  before they were counted is not ready, so nothing is retired on its word;
  except a refused ``Destroy`` (of a machine the release no longer counts): it
  is said in the release's word beside what else the pass says, and the
  release's actions go on (a dead machine the backend will not remove, a 404
  pass after pass, must not keep its replacement from being created), unless
  the backend rate limits;
- a backend that refuses to list is asked again after 2, 4, ... 60 s, and one
  that is rate limited for longer than its client waits is left alone until
  then (``MAX_RETRY_AFTER_S`` at most), each pass saying so;
- the creates are remembered in the store (``scaler_creates``): each is written
  before it is sent (removed if the backend refuses it), what the listing shows
  of them is written after each listing, and the first pass of a scaler that
  became active (``reset``, or a new one) loads them, so the create bounds hold
  across activations.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from worker.db.pool import Database
from worker.db.store import Store
from worker.db.store.rows import Deployment
from worker.ops.releases import BOOT_CONFIG_EXITS, BOOT_FAILS_FINAL
from worker.ops.report import read_report
from worker.scaler import boot_record
from worker.scaler.actions import (
    Action,
    Backoff,
    Create,
    Destroy,
    Held,
    Note,
    Recovered,
    Retire,
    Say,
    Stop,
    Tally,
    Wait,
)
from worker.scaler.backend import MAX_RETRY_AFTER_S, Backend, BackendError, Machine
from worker.scaler.observe import CREATE_MEMORY_S, BootFailed, Watch, observe
from worker.scaler.plan import DEAD_AFTER_S, UNLISTED_AFTER_S, plan
from worker.scaler.strangers import Strangers

__all__ = ["DEAD_AFTER_S", "Reconciler", "ReleaseSeen"]

# A held registry's word on the ready current release (`releases`, rollout waits).
HELD_WORD = "held: retiring nothing it supersedes until `releases resume`"
MAX_BACKEND_BACKOFF_S = 60.0  # between listings of a backend that keeps refusing (a bad token)

log = structlog.get_logger("lane_worker.scaler")


async def _unguarded() -> None:
    return None


@dataclass
class ReleaseSeen:
    """What one pass saw and did for one release (written to ``scaler_state``)."""

    desired: int = 0
    image: str | None = None  # the image the pass reconciled against
    target: int = 0
    running: int = 0
    ready: int = 0  # machines on the release's image whose worker is ready
    outdated: int = 0  # running or stopping machines on an image the release no longer records
    stopping: int = 0  # machines whose stop was sent, still draining
    unlisted: int = 0  # machines this scaler created that the backend does not list
    actions: list[str] = field(default_factory=list)
    error: str | None = None
    boot_refused: str | None = None
    boot_failed: dict[str, Any] | None = None  # machines that refused to boot in a row
    # Its machines as the backend listed them: id, state, health port, where their logs are.
    machines: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "desired": self.desired,
            "image": self.image,
            "target": self.target,
            "running": self.running,
            "ready": self.ready,
            "outdated": self.outdated,
            "stopping": self.stopping,
            "unlisted": self.unlisted,
            "actions": self.actions,
            "error": self.error,
            "bootRefused": self.boot_refused,
            "bootFailed": self.boot_failed,
            "machines": self.machines,
        }


class Reconciler:
    """Reconciles the registry with one backend."""

    def __init__(self, db: Database, store: Store, backend: Backend, *, actor: str) -> None:
        self.db, self.store, self.backend, self.actor = db, store, backend, actor
        # Awaited before each action: a scaler that lost its lock mid-pass stops at once.
        self.guard: Callable[[], Awaitable[object]] = _unguarded
        self.watch = Watch()
        self.strangers = Strangers(backend)
        # The store's word on this scaler's creates is loaded at the next pass.
        self._recall = True
        # Masked in what is recorded of a machine's output (its last line).
        self.secrets: tuple[str, ...] = ()
        self._deployed: dict[str, str] = {}  # each release's deployed_at, as the pass read it
        # A backend that refuses to list (401, 404, an outage past its retries) is
        # asked again after 2, 4, ... 60 s, not every pass: one error line each time.
        self._backend_failures = 0
        self._backend_retry_at = 0.0
        self._backend_error = ""

    def reset(self) -> None:
        """Forget what was watched: called when this scaler becomes the active one."""
        self.watch.reset()
        self.strangers.reset()
        self._recall = True

    async def once(self) -> dict[str, ReleaseSeen]:
        """Run one pass; return what it saw and did per release."""
        if self._recall:
            creates = await self.db.run(
                lambda c: self.store.registry.creates_remembered(
                    c, unlisted_s=CREATE_MEMORY_S, unknown_s=UNLISTED_AFTER_S
                )
            )
            self.watch.remember(creates, time.monotonic())
            self._recall = False
        deployments = await self.db.run(self.store.registry.deployments)
        held = await self.db.run(self.store.registry.held) is not None
        views = {v.queue: v for v in await self.db.run(lambda c: read_report(c, self.store))}
        if time.monotonic() < self._backend_retry_at:
            return self._backend_down(deployments)
        try:
            listing = await self.backend.list()
        except BackendError as exc:
            self._backend_failures += 1
            wait_s = max(
                min(MAX_BACKEND_BACKOFF_S, 2.0**self._backend_failures), _retry_after_s(exc)
            )
            self._backend_retry_at = time.monotonic() + wait_s
            self._backend_error = str(exc)
            log.error("scaler.backend_failed", error=str(exc), retry_in_s=wait_s)
            return self._backend_down(deployments)
        self._backend_failures, self._backend_retry_at = 0, 0.0
        state, machines = observe(
            self.watch,
            deployments,
            views,
            listing,
            now=time.monotonic(),
            stop_deadline_s=self.backend.stop_deadline_s,
            where_logs=self.backend.where_logs,
            held=held,
        )
        self.strangers.note(deployments, listing, self.watch.created)
        await self._note_seen()
        return await self._perform(plan(state), deployments, machines)

    async def _note_seen(self) -> None:
        """Tell the store which created machines the listing now shows, or no longer does."""
        found, gone = self.watch.take_seen()
        if found or gone:
            await self.guard()
            await self.db.run(
                lambda c: self.store.registry.creates_seen(
                    c, listed=sorted(found), gone=sorted(gone)
                )
            )

    def _backend_down(self, deployments: list[Deployment]) -> dict[str, ReleaseSeen]:
        return {
            d.release_id: ReleaseSeen(desired=d.desired, image=d.image, error=self._backend_error)
            for d in deployments
        }

    async def _perform(
        self, actions: list[Action], deployments: list[Deployment], machines: dict[str, Machine]
    ) -> dict[str, ReleaseSeen]:
        """Perform ``actions`` in order; return what the pass saw and did per release."""
        self._deployed = {d.release_id: d.deployed_at.isoformat() for d in deployments}
        await boot_record.clear_booted(self.db, self.store, deployments)  # store 0047
        seen = {
            d.release_id: ReleaseSeen(
                desired=d.desired,
                image=d.image,
                boot_refused=self.watch.why_died.get((d.release_id, d.image)),
                boot_failed=self._boot_failed_now(d.release_id, d.image),
            )
            for d in deployments
        }
        for m in machines.values():
            if m.release_id in seen:
                seen[m.release_id].machines.append(
                    {
                        "id": m.machine_id,
                        "state": m.state,
                        "healthPort": m.health_port,
                        "logs": self.backend.where_logs(m.machine_id),
                    }
                )
        failed: set[str] = set()  # releases whose actions stopped at a backend error
        counted: set[str] = set()  # releases whose tally was taken
        for action in actions:
            if isinstance(action, Retire):
                # Not on the word of a release whose actions stopped before it was counted.
                if action.release_id in counted:
                    current = next(d for d in deployments if d.release_id == action.release_id)
                    await self._retire(current, action.ready)
                continue
            release_id = action.release_id
            if release_id in failed:
                continue
            said = seen.setdefault(release_id, ReleaseSeen())
            try:
                await self._do(action, said, machines)
            except BackendError as exc:
                if isinstance(action, Destroy) and not _retry_after_s(exc):
                    said.error = _also(said.error, str(exc))
                    log.error(
                        "scaler.action_failed",
                        release_id=release_id,
                        machine=action.machine_id,
                        error=str(exc),
                        action="replace" if action.replaced else "destroy",
                    )
                    continue
                failed.add(release_id)
                said.error = str(exc)
                log.error("scaler.backend_failed", release_id=release_id, error=str(exc))
                after_s = _retry_after_s(exc)
                if after_s:  # rate limited: the next passes leave the backend alone meanwhile
                    self._backend_retry_at = max(self._backend_retry_at, time.monotonic() + after_s)
                    self._backend_error = str(exc)
                continue
            if isinstance(action, Tally):
                counted.add(release_id)
        return seen

    async def _do(self, action: Action, seen: ReleaseSeen, machines: dict[str, Machine]) -> None:
        """Perform one action of a release, and say it in ``seen``."""
        watch = self.watch
        match action:
            case Tally():
                seen.target, seen.running, seen.ready = action.target, action.running, action.ready
                seen.outdated, seen.stopping = action.outdated, action.stopping
                seen.unlisted = action.unlisted
            case Say():
                if action.error is not None:
                    seen.error = _also(seen.error, action.error)
                if action.event is not None:
                    say = log.error if action.error is not None else log.warning
                    say(action.event, release_id=action.release_id, **dict(action.fields))
            case Wait():
                wait = f"waiting {action.wait_s:.0f} s before starting another machine"
                seen.actions.append(wait)
            case Held():
                seen.actions.append(HELD_WORD)
            case Note():
                seen.actions.append(action.text)
            case Backoff():
                key = (action.release_id, action.image)
                watch.died[key], watch.not_before[key] = action.died, action.until
                watch.why_died[key] = action.why
                watch.death_noted.add(action.machine_id)
                if action.current:  # an older image's death is not this deploy's
                    seen.boot_refused = action.why
                    await self._count_boot_failure(seen, action)
            case Recovered():
                key = (action.release_id, action.image)
                watch.died.pop(key, None)
                watch.not_before.pop(key, None)
                watch.why_died.pop(key, None)
                watch.boot_failed.pop(key, None)
                seen.boot_refused = seen.boot_failed = None
                await boot_record.clear_boot_failed(self.db, self.store, action.release_id)
            case Create():
                await self._create(seen, action)
            case Stop():
                await self._act(
                    seen,
                    action.release_id,
                    "stopped",
                    machines[action.machine_id],
                    action.reason,
                    stop=True,
                    destroy=False,
                )
            case Destroy():
                verb = "replaced" if action.replaced else "destroyed"
                await self._act(
                    seen,
                    action.release_id,
                    verb,
                    machines[action.machine_id],
                    action.reason,
                    stop=action.stop_first,
                    destroy=True,
                )

    def _boot_failed_now(self, release_id: str, image: str) -> dict[str, Any] | None:
        """The boot failures in a row of this deploy of the release's image, else None."""
        had = self.watch.boot_failed.get((release_id, image))
        if had is None or had.deployed_at != self._deployed.get(release_id):
            return None
        return had.as_json()

    async def _count_boot_failure(self, seen: ReleaseSeen, action: Backoff) -> None:
        """Count a machine of the deployed image that exited 78 or 2: the same code twice
        in a row for one deploy is a boot that will not succeed (recorded, and said)."""
        key = (action.release_id, action.image)
        code = action.exit_code
        if code is None or code not in BOOT_CONFIG_EXITS:  # a crash, not a refusal: apart
            if self.watch.boot_failed.pop(key, None) is not None:
                await boot_record.clear_boot_failed(self.db, self.store, action.release_id)
            seen.boot_failed = None
            return
        deployed = self._deployed.get(action.release_id, "")
        had = self.watch.boot_failed.get(key)
        again = had is not None and had.deployed_at == deployed and had.exit_code == code
        failed = BootFailed(
            deployed_at=deployed,
            in_a_row=had.in_a_row + 1 if had is not None and again else 1,
            exit_code=code,
            machine_id=action.machine_id,
            logs=self.backend.where_logs(action.machine_id),
            last_line=action.last_line,
        )
        self.watch.boot_failed[key] = failed
        seen.boot_failed = failed.as_json()
        if failed.in_a_row >= BOOT_FAILS_FINAL:
            await self.guard()
            # Kept on its row while it fails (a submit says so); logged once, below.
            said = await boot_record.record_boot_failed(
                self.db, self.store, action.release_id, failed, self.secrets
            )
        if failed.in_a_row == BOOT_FAILS_FINAL:
            await self._record(action.release_id, "boot_failed", said)
            log.error("scaler.boot_failed", release_id=action.release_id, **said)

    async def _create(self, seen: ReleaseSeen, action: Create) -> None:
        release_id, image, reason = action.release_id, action.image, action.reason
        await self.guard()
        # Remembered before it is sent: a scaler cut off mid-create still counts it.
        key = secrets.token_hex(8)
        registry = self.store.registry
        await self.db.run(
            lambda c: registry.create_sent(c, key=key, release_id=release_id, image=image)
        )
        try:
            made = await self.backend.create(release_id, image)
        except BackendError:
            # Refused: nothing was made (one whose answer was lost is found by the
            # backend's create itself, or counted by nobody, as before).
            await self.db.run(lambda c: registry.create_refused(c, key=key))
            raise
        self.watch.created[made.machine_id] = (release_id, image, time.monotonic())
        self.watch.made[made.machine_id] = (release_id, image)
        await self.db.run(lambda c: registry.create_made(c, key=key, machine_id=made.machine_id))
        seen.actions.append(f"created {made.machine_id}")
        detail = {"machine": made.machine_id, "image": image, "reason": reason}
        await self._record(release_id, "machine_created", detail)
        log.info(
            "scaler.machine_created",
            release_id=release_id,
            machine=made.machine_id,
            image=image,
            reason=reason,
        )

    async def _act(
        self,
        seen: ReleaseSeen,
        release_id: str,
        action: str,
        m: Machine,
        reason: str,
        *,
        stop: bool,
        destroy: bool,
    ) -> None:
        """Stop and/or destroy ``m``; record why."""
        await self.guard()
        if stop:
            self.watch.stop_sent[m.machine_id] = time.monotonic()
            await self.backend.stop(m)
        if destroy:
            await self.backend.destroy(m)
        seen.actions.append(f"{action} {m.machine_id}")
        await self._record(
            release_id,
            f"machine_{action}",
            {"machine": m.machine_id, "reason": reason, "exitCode": m.exit_code},
        )
        log.info(
            f"scaler.machine_{action}",
            release_id=release_id,
            machine=m.machine_id,
            reason=reason,
            exit_code=m.exit_code,
        )

    async def _record(self, release_id: str, action: str, detail: dict[str, Any]) -> None:
        await self.db.run(
            lambda c: self.store.registry.record(
                c, release_id=release_id, action=action, actor=self.actor, detail=detail
            )
        )

    async def _retire(self, current: Deployment, ready: int) -> None:
        await self.guard()
        retired = await self.db.run(
            lambda c: self.store.registry.retire_superseded(c, actor=self.actor, current=current)
        )
        if retired:
            log.info("scaler.retired", current=current.release_id, retired=retired, ready=ready)


def _also(said: str | None, more: str | None) -> str | None:
    """Two things a pass says of a release, in one error."""
    return f"{said}; {more}" if said and more else said or more


def _retry_after_s(exc: BaseException) -> float:
    """How long a backend that rate-limits asked to be left alone (capped), else 0."""
    after = getattr(exc, "retry_after_s", None)
    return min(MAX_RETRY_AFTER_S, float(after)) if isinstance(after, (int, float)) else 0.0
