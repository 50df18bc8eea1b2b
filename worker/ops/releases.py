"""The release registry as an operator uses it: deploy, roll back, list, wait for a rollout.

``deploy`` only records what should run (store migration 0012); the scaler
(``lane-worker scaler``) starts the machines and, once the new release has its
machines ready, retires what it supersedes. ``wait_rolled_out`` waits for that,
and otherwise says why not: no active scaler, machines not ready, a machine
that refused to boot, the backend's error.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from worker.config import settings
from worker.db.pool import Database
from worker.db.store import Store
from worker.db.store.rows import Deployment, ReleaseHold, ScalerState
from worker.errors import (
    EXIT_CONFIG,
    EXIT_USAGE,
    InvalidRequestError,
    RunNotFoundError,
    counted,
    shown,
)
from worker.masking import mask_value
from worker.ops.report import SCALER_STALE_S, read_report
from worker.ops.workers import NO_VERSION

# How long a deploy's gate runs have, together, to complete (`--gate-timeout`).
GATE_TIMEOUT_S = 300.0

# A machine whose worker exits 78 (it refused its configuration) or 2 (its --app
# does not load) will not boot by being started again: once this many machines of
# one deploy's image exit so in a row with the same code, the scaler says the boot
# failed and `releases deploy --wait` ends with that, not after its timeout.
BOOT_CONFIG_EXITS = (EXIT_CONFIG, EXIT_USAGE)
BOOT_FAILS_FINAL = 2


def actor(*, pid: bool = True) -> str:
    """Who is acting, for the registry's record: user@host (pid), or user@host alone.

    A hold is a person's, and its CLI process is gone the moment it answers: its pid
    would only be noise in every line that names the hold.
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    who = f"{user}@{socket.gethostname()}"
    return f"{who} (pid {os.getpid()})" if pid else who


@dataclass(frozen=True)
class ReleaseView:
    """A release as ``lane-worker releases`` shows it."""

    release_id: str
    queue: str
    image: str
    role: str  # current, previous, retired
    status: str  # current, rolling out, draining, drained, retired (not yet seen by a lane)
    desired: int
    live_workers: int
    ready_workers: int
    deployed_at: str
    deployed_by: str
    retired_at: str | None
    scaler: dict[str, Any]  # what the scaler last said about it
    builds: dict[str, int]  # live workers per lane-worker version
    # The scaler's record that this deploy's machines fail to boot (store 0047): while
    # it stands, a submit to the lane says it is not served.
    boot_failed: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None  # its gate (migration 0050), None when deployed without

    def as_json(self) -> dict[str, Any]:
        return {
            "releaseId": self.release_id,
            "queue": self.queue,
            "image": self.image,
            "role": self.role,
            "status": self.status,
            "desired": self.desired,
            "liveWorkers": self.live_workers,
            "readyWorkers": self.ready_workers,
            "deployedAt": self.deployed_at,
            "deployedBy": self.deployed_by,
            "retiredAt": self.retired_at,
            "scaler": self.scaler,
            "builds": self.builds,
            "bootFailed": self.boot_failed,
            "gate": self.gate,
        }


@dataclass(frozen=True)
class RolloutState:
    """Where a rollout stands: done, or why not yet."""

    done: bool
    reason: str | None
    # Nothing left to wait for: this rollout cannot finish as asked (another
    # release was deployed since, or it runs no machine and supersedes one).
    final: bool = False


class Releases:
    """The registry on one store."""

    def __init__(
        self, db: Database, store: Store, check_schemas: Callable[[], Awaitable[None]]
    ) -> None:
        self.db, self.store, self.check_schemas = db, store, check_schemas

    async def deploy(
        self,
        release_id: str,
        *,
        image: str,
        machines: int = 1,
        force: bool = False,
        gate: list[dict[str, Any]] | None = None,
        gate_timeout_s: float = GATE_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Record ``release_id`` as the current release; the scaler does the rest.

        With ``gate`` (``[{"play", "input"}, ...]``) it is the candidate: the scaler
        runs each gate run on its lane once its machines are ready and makes it
        current only if all complete within ``gate_timeout_s`` (migration 0050).
        Refused while the registry is held (``hold``), unless ``force``; refused too
        (``InvalidRequestError``) for an id no worker would boot with.
        """
        trimmed, low = release_id.strip(), release_id.strip().lower()
        # Ids the registry's own checks refuse (blank, too long, dev spellings) keep
        # their own sentence; this catches what only a worker's boot refuses ("Dev!").
        plain = settings.release_id_problem(trimmed) is None
        dev = low == "dev" or low.startswith("dev-")
        refusal = settings.boot_refusal(trimmed) if plain and not dev else None
        if refusal is not None:
            raise InvalidRequestError(
                f"release {shown(trimmed)} cannot be deployed: no worker could boot with it "
                f"({refusal.rstrip('.')}); pick another release id."
            )
        return await self._record(
            release_id, image, machines, "deployed", force, gate or None, gate_timeout_s
        )

    async def hold(self, reason: str | None = None) -> dict[str, Any]:
        """Hold the registry: the scaler changes no current release until ``resume``, and
        deploys and rollbacks by hand are refused unless forced."""
        await self.check_schemas()
        who = actor(pid=False)
        # A blank reason says nothing: kept as none, not as spaces `releases` would show.
        why = (reason or "").strip() or None
        return await self.db.run(lambda c: self.store.registry.hold(c, actor=who, reason=why))

    async def resume(self) -> bool:
        """End the hold; False when there was none."""
        await self.check_schemas()
        who = actor(pid=False)
        return await self.db.run(lambda c: self.store.registry.resume(c, actor=who))

    async def scaler(self) -> ScalerState | None:
        """The scaler's last word (which backend, where it runs), or None."""
        await self.check_schemas()
        return await self.db.run(self.store.registry.scaler_state)

    async def held(self) -> ReleaseHold | None:
        """The registry's hold, or None."""
        await self.check_schemas()
        return await self.db.run(self.store.registry.held)

    async def rollback(self, release_id: str, *, force: bool = False) -> dict[str, Any]:
        """Make an older deployed release current again, with its recorded image and count."""
        await self.check_schemas()
        known = {d.release_id: d for d in await self.db.run(self.store.registry.deployments)}
        old = known.get(release_id.strip())
        if old is None:
            names = ", ".join(sorted(known)) or "none"
            raise InvalidRequestError(
                f"release {release_id!r} was never deployed through the registry, so there is "
                f"no image to roll back to (deployed: {names}); use `releases deploy` with "
                "its image."
            )
        if old.role == "current":
            raise InvalidRequestError(f"release {old.release_id!r} is the current release.")
        return await self._record(old.release_id, old.image, old.desired, "rolled_back", force)

    async def _record(
        self,
        release_id: str,
        image: str,
        machines: int,
        action: str,
        force: bool,
        gate: list[dict[str, Any]] | None = None,
        gate_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        await self.check_schemas()
        who = actor()
        before = await self.db.run(self.store.registry.deployments)
        said = await self.db.run(
            lambda c: self.store.registry.deploy(
                c,
                release_id=release_id,
                image=image,
                desired=machines,
                actor=who,
                action=action,
                force=force,
                gate=gate,
                gate_timeout_s=gate_timeout_s if gate else None,
            )
        )
        # The current release deployed again (a hotfix's new image) supersedes nothing:
        # what it was before says what changes (read before, so only as told, not locked).
        was = next((d for d in before if d.role == "current"), None)
        same = was if was is not None and was.release_id == said["releaseId"] else None
        said["redeployedFrom"] = {"image": same.image, "desired": same.desired} if same else None
        return said

    async def list(self) -> tuple[list[ReleaseView], ScalerState | None]:
        """Every deployed release, newest deploy first, and the scaler's last pass."""
        await self.check_schemas()
        deployments = await self.db.run(self.store.registry.deployments)
        scaler = await self.db.run(self.store.registry.scaler_state)
        said = scaler.releases if scaler is not None and scaler.age_s < SCALER_STALE_S else {}
        if scaler is not None and not said:
            # No active scaler: its machines outlive it (by design), so what it last
            # listed is still shown, marked as its last word (``lastListedSecondsAgo``).
            said = {
                rid: {"machines": word["machines"], "lastListedSecondsAgo": round(scaler.age_s)}
                for rid, word in scaler.releases.items()
                if isinstance(word, dict) and word.get("machines")
            }
        # A lane the report leaves out (pruned, or never registered) holds nothing.
        holding = await self._holding_lanes()
        return [
            _view(d, said.get(d.release_id, {}), d.queue not in holding) for d in deployments
        ], scaler

    async def _holding_lanes(self) -> set[str]:
        """The lanes that still hold work (every reported status but drained)."""
        views = await self.db.run(lambda c: read_report(c, self.store))
        return {v.queue for v in views if v.status != "drained"}

    async def rollout_state(self, release_id: str) -> RolloutState:
        """Done when ``release_id`` is current, has its machines ready, and nothing it
        supersedes still claims (the scaler retires those once it is ready)."""
        releases, scaler = await self.list()
        mine = next((r for r in releases if r.release_id == release_id), None)
        if mine is not None and (mine.role == "candidate" or (mine.gate or {}).get("outcome")):
            gated = gate_state(mine, await self._gate_error(mine))
            if gated is not None:
                return gated
        if mine is None or mine.role != "current":
            return RolloutState(
                False, f"release {release_id!r} is no longer the current release", final=True
            )
        superseded = any(r.role == "previous" for r in releases)
        if superseded and mine.desired == 0:
            return RolloutState(
                False,
                f"release {release_id!r} was deployed with 0 machines: it takes over from "
                "nothing, so the release before it keeps claiming (deploy it with --machines 1 "
                "or more)",
                final=True,
            )
        active = scaler is not None and scaler.age_s < SCALER_STALE_S
        said = mine.scaler
        # The scaler's word on this deploy (a pass that read the registry before it
        # speaks of the previous image or count): its machines on this image are
        # ready and none is left on an image it replaced.
        current_word = (
            scaler is not None
            and scaler.beat_at > datetime.fromisoformat(mine.deployed_at)
            and said.get("image") == mine.image
            and said.get("desired") == mine.desired
        )
        if active and current_word:
            if not superseded and said.get("ready", 0) >= mine.desired and not said.get("outdated"):
                return RolloutState(True, None)
            failed = said.get("bootFailed")
            if isinstance(failed, dict) and int(failed.get("inARow") or 0) >= BOOT_FAILS_FINAL:
                return RolloutState(False, boot_failed_reason(failed), final=True)
        elif not active and not superseded and mine.ready_workers >= mine.desired:
            return RolloutState(True, None)  # machines run by hand, no scaler
        hold = await self.held() if superseded else None
        if hold is not None:
            return RolloutState(
                False,
                f"the releases are held by {hold.held_by}: the scaler retires nothing it "
                "supersedes until `lane-worker releases resume`",
            )
        if not active:
            return RolloutState(False, "no active scaler (start `lane-worker scaler`)")
        if said.get("error"):
            return RolloutState(False, f"the scaler's backend failed: {said['error']}")
        if said.get("bootRefused"):
            return RolloutState(False, f"a machine refused to boot: {said['bootRefused']}")
        if said.get("outdated") and said.get("ready", 0) >= mine.desired:
            return RolloutState(
                False,
                f"{counted(said['outdated'], 'machine')} on the replaced image still stopping",
            )
        ready = said.get("ready", mine.ready_workers)
        return RolloutState(False, f"machines not ready ({ready} of {mine.desired} ready)")

    async def _gate_error(self, mine: ReleaseView) -> str | None:
        """The failed gate run's error (through store 0051's gate_run_status: the owner and
        the scaler may read it; the registry keeps only the run's id)."""
        gate = mine.gate or {}
        if gate.get("outcome") != "failed" or not gate.get("run"):
            return None
        run_id = str(gate["run"])
        try:
            said = await self.db.run(
                lambda c: self.store.registry.gate_run_status(c, run_id=run_id)
            )
        except (asyncpg.PostgresError, RunNotFoundError, ValueError):
            return None  # not a run this role may read, or no run (a refused submit)
        error = said.get("error")
        if isinstance(error, dict):
            error = error.get("message") or error.get("name") or error
        return None if error is None else " ".join(str(error).split())[:500]

    async def wait_rolled_out(
        self, release_id: str, *, timeout_s: float, poll_s: float = 1.0
    ) -> RolloutState:
        """Wait until the rollout of ``release_id`` is done, or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = await self.rollout_state(release_id)
            if state.done or state.final or time.monotonic() >= deadline:
                return state
            await asyncio.sleep(poll_s)


def gate_state(mine: ReleaseView, error: str | None = None) -> RolloutState | None:
    """Where a gated release's rollout stands while its gate decides (None once passed);
    ``error``: the failed gate run's error, for whoever may read it."""
    gate = mine.gate or {}
    outcome = gate.get("outcome")
    if outcome == "failed":
        said = f"its gate failed, so it never became current: {gate.get('reason')}"
        return RolloutState(False, said + (f": {error}" if error else ""), final=True)
    if outcome == "abandoned":
        return RolloutState(False, f"its gate was abandoned: {gate.get('reason')}", final=True)
    if outcome == "passed" or mine.role != "candidate":
        return None
    return RolloutState(False, gate_word(mine))


def gate_word(mine: ReleaseView) -> str:
    """What an undecided gate is doing, for ``releases`` and ``--wait``."""
    gate = mine.gate or {}
    plays = ", ".join(str(g.get("play")) for g in gate.get("runs") or [])
    if gate.get("ageSeconds") is None:
        return (
            f"gate ({plays}) waits for its machines ({mine.ready_workers} of {mine.desired} "
            "ready); the current release stays current meanwhile"
        )
    return (
        f"gate ({plays}) running for {gate['ageSeconds']:.0f} s of "
        f"{gate.get('timeoutSeconds'):g} s; the current release stays current meanwhile"
    )


def boot_failed_reason(failed: dict[str, Any]) -> str:
    """Why a release's machines cannot boot, from the scaler's ``bootFailed`` word."""
    code = failed.get("exitCode")
    what = (
        "their worker refused its configuration: fix the environment the machines get"
        if code == EXIT_CONFIG
        else "their worker could not load the app (--image): fix it and deploy again"
    )
    said = (
        f"its machines cannot boot: {failed.get('inARow')} in a row exited {code} ({what}); "
        f"the last, machine {failed.get('machine')}, logs: {failed.get('logs')}"
    )
    last = failed.get("lastLine")
    return f"{said}; its last line: {last}" if last else said


def boot_failed_short(failed: dict[str, Any]) -> str:
    """One line on why a release's machines cannot boot (what a submit's warning quotes)."""
    code = failed.get("exitCode")
    what = "refused its configuration" if code == EXIT_CONFIG else "could not load its app"
    said = f"{failed.get('inARow')} machines in a row exited {code}: their worker {what}"
    last = failed.get("lastLine")
    return f"{said}; the last one's last line: {last}" if last else said


def _view(d: Deployment, scaler: dict[str, Any], drained: bool) -> ReleaseView:
    if d.role == "current":
        status = "current"
    elif d.role == "candidate":
        status = "gating (its gate decides whether it becomes current)"
    elif d.role == "previous":
        status = "superseded (claims until the current release is ready)"
    else:
        status = "drained" if drained or d.lane_status is None else "draining"
    return ReleaseView(
        release_id=d.release_id,
        queue=d.queue,
        image=d.image,
        role=d.role,
        status=status,
        desired=d.desired,
        live_workers=d.live_workers,
        ready_workers=d.ready_workers,
        deployed_at=d.deployed_at.isoformat(),
        deployed_by=d.deployed_by,
        retired_at=d.retired_at.isoformat() if d.retired_at else None,
        # What a scaler stored is shown with any credential in it masked (one of an
        # older build may have kept a refusal that echoed its token).
        scaler=mask_value(scaler, ()),
        builds={v or NO_VERSION: n for v, n in sorted(d.live_builds.items())},
        boot_failed=mask_value(d.boot_failed, ()) if d.boot_failed else None,
        gate=None
        if d.gate is None
        else {
            "runs": d.gate,
            "timeoutSeconds": d.gate_timeout_s,
            "ageSeconds": d.gate_age_s,
            "outcome": d.gate_outcome,
            "reason": d.gate_reason,
            "run": d.gate_run,
        },
    )
