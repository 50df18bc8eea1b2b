"""One reconcile pass of the scaler: what each release needs, against what the backend runs.

Stateless: every pass reads the registry, the drain report and the backend's
machines, and acts on the difference, so a scaler that restarts (or a standby
that takes over) converges to the same end. Two things only are remembered,
and forgotten when a scaler becomes active: since when a machine has been seen
without a live worker (so a database outage, which stops every heartbeat, does
not make every machine look dead the moment it ends) and which stops were sent
(for a backend that lists a stopping machine as running for a moment). The rules:

- the current release runs its desired count (up or down);
- a superseded release (``previous``: its lane still claims) keeps its machines;
- a retired release that is draining keeps its recorded count (at least one
  while its lane is stranded: work only it may run and no live worker): a
  machine that died (stopped, failed, or no live worker of it for
  ``DEAD_AFTER_S`` as this scaler watched it) is replaced from the release's image;
- a retired release that is drained has its machines stopped, then destroyed;
- a stop is sent once per machine: a stopping machine drains undisturbed (a
  second stop signal would make its worker exit at once) and is destroyed once it
  stopped, or when it outlives the backend's ``stop_deadline_s`` (above its
  worker's longest stop, from the drain window);
- a live machine of a release that is not drained is never stopped or destroyed,
  except the current release's surplus when its count goes down, and a machine
  on an image the release no longer records (it was deployed again with a new
  one) once the new image has the release's count ready;
- once the current release has its desired count ready, what it supersedes is
  retired (``retire_superseded``: one transaction, recorded);
- a machine is its id: one the backend lists twice is one machine;
- any release above what it needs (a create whose answer was lost made a twin)
  is trimmed, machines without a live worker first, and a live machine is never
  stopped when that would leave the release fewer live ones than it needs (at
  least one, while it should run), whatever the listing says;
- a machine this scaler created counts towards its release until the backend
  lists it; one still unlisted after ``UNLISTED_AFTER_S`` means the listing is
  wrong (a machine without its metadata): said loudly, and that release gets no
  new machine until the listing shows it. At most ``MAX_CREATES_PER_PASS`` are
  created per release and pass, and none while the machines this scaler made for
  the release's image that run (wherever the listing puts them) reach its count
  plus ``MADE_SURPLUS``; one it made that is listed on another image is on the
  image it was made with (said loudly);
- a machine whose worker beats and that nobody was known to stop, listed failed or
  stopped, is counted running and left alone until a second listing in a row says
  so; it is never destroyed as stuck stopping while its worker beats, and its
  stopping clock starts over when it is listed running;
- a backend that is rate limited for longer than its client waits is left alone
  until then (``MAX_RETRY_AFTER_S`` at most), each pass saying so.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from worker.db.pool import Database
from worker.db.store import Store
from worker.db.store.rows import Deployment
from worker.ops.report import LaneView, read_report
from worker.scaler.backend import (
    MAX_RETRY_AFTER_S,
    STARTED,
    STOPPING,
    Backend,
    BackendError,
    Machine,
    one_per_id,
)

# A machine whose worker has not been live this long, as this scaler watched it
# (and at least this long after it was created), is dead: a boot takes seconds.
DEAD_AFTER_S = 60.0
# A stop sent while the backend still lists the machine running is not sent again
# for this long (the backend catches up within a pass or two).
STOP_RESEND_S = 300.0
EXIT_CONFIG = 78  # a worker that refused its configuration
MAX_RESTART_BACKOFF_S = 300.0  # between machines of a release whose machines keep dying
MAX_BACKEND_BACKOFF_S = 60.0  # between listings of a backend that keeps refusing (a bad token)
MAX_CREATES_PER_PASS = 3  # per release: a wrong count or listing costs a few machines, not many
# A machine this scaler created that the backend has not listed for this long: the
# listing is wrong (Fly lists a new machine within a pass or two).
UNLISTED_AFTER_S = 30.0
# Machines this scaler made for a release's image and that still run (whatever the
# listing says of their image), above which it creates no more for that release:
# the release's count plus this. A listing that misreports what it made cannot
# make it create without end.
MADE_SURPLUS = 2

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

    def as_json(self) -> dict[str, Any]:
        return {
            "desired": self.desired, "image": self.image, "target": self.target,
            "running": self.running, "ready": self.ready, "outdated": self.outdated,
            "stopping": self.stopping, "unlisted": self.unlisted, "actions": self.actions,
            "error": self.error, "bootRefused": self.boot_refused,
        }  # fmt: skip


class Reconciler:
    """Reconciles the registry with one backend."""

    def __init__(self, db: Database, store: Store, backend: Backend, *, actor: str) -> None:
        self.db, self.store, self.backend, self.actor = db, store, backend, actor
        # Awaited before every action: the active scaler checks it still holds its
        # lock, so a scaler that lost it mid-pass stops acting at once.
        self.guard: Callable[[], Awaitable[object]] = _unguarded
        # Per release and image: machines that died young in a row, and when the next
        # may be created. A release whose workers cannot boot is not recreated every
        # pass; a new image of it (the fix) starts at once (kept in memory: a
        # restarted scaler starts over, which is safe, only faster).
        self._died: dict[tuple[str, str], int] = {}
        self._not_before: dict[tuple[str, str], float] = {}
        self._why_died: dict[tuple[str, str], str] = {}  # the last exit, until one is ready
        self._not_live_since: dict[str, float] = {}  # machine id: first seen without a worker
        self._stop_sent: dict[str, float] = {}  # machine id: when this scaler stopped it
        # Machine id: first seen stopping (a backend that does not say since when).
        self._stopping_seen: dict[str, float] = {}
        # Machine id: (release, image, when) of a create this scaler made that the
        # backend has not listed yet; kept until it does (see UNLISTED_AFTER_S).
        self._created: dict[str, tuple[str, str, float]] = {}
        # Machine id: (release, image) of every machine this scaler made, while it is
        # listed (or not yet): it runs that image whatever the listing says of it.
        self._made: dict[str, tuple[str, str]] = {}
        # Machine id: listings in a row that said a machine whose worker beats and that
        # this scaler never stopped is not running (failed or stopped).
        self._off_listings: dict[str, int] = {}
        self._doubted_now: set[str] = set()  # this release's, this pass: never acted on
        # Machine id: a crash already noted (a dead machine the API will not remove is
        # listed pass after pass: one death, not one per listing, or the wait before
        # its replacement doubles every pass and never ends).
        self._death_noted: dict[str, bool] = {}
        # A backend that refuses to list (401, 404, an outage past its retries) is
        # asked again after 2, 4, ... 60 s, not every pass: one error line each time.
        self._backend_failures = 0
        self._backend_retry_at = 0.0
        self._backend_error = ""

    def reset(self) -> None:
        """Forget what was watched: called when this scaler becomes the active one."""
        self._not_live_since.clear()
        self._stop_sent.clear()
        self._stopping_seen.clear()
        self._off_listings.clear()
        # Another scaler may have listed and removed them meanwhile: not this one's word.
        self._created.clear()
        self._made.clear()

    async def once(self) -> dict[str, ReleaseSeen]:
        """Run one pass; return what it saw and did per release."""
        deployments = await self.db.run(self.store.registry.deployments)
        views = {v.queue: v for v in await self.db.run(lambda c: read_report(c, self.store))}
        if time.monotonic() < self._backend_retry_at:
            return self._backend_down(deployments)
        try:
            machines = await self.backend.list()
        except BackendError as exc:
            self._backend_failures += 1
            wait_s = max(min(MAX_BACKEND_BACKOFF_S, 2.0**self._backend_failures),
                         _retry_after_s(exc))  # fmt: skip
            self._backend_retry_at = time.monotonic() + wait_s
            self._backend_error = str(exc)
            log.error("scaler.backend_failed", error=str(exc), retry_in_s=wait_s)
            return self._backend_down(deployments)
        self._backend_failures, self._backend_retry_at = 0, 0.0
        machines = one_per_id(machines)
        listed = {m.machine_id for m in machines}
        for memory in (self._not_live_since, self._stop_sent, self._stopping_seen,
                       self._off_listings, self._death_noted):  # fmt: skip
            for gone in set(memory) - listed:
                del memory[gone]
        for found in listed & set(self._created):
            del self._created[found]
        for gone in set(self._made) - listed - set(self._created):
            del self._made[gone]
        # What this scaler made that runs, per release and image, wherever the listing
        # puts it (another release's metadata, another image): bounds its creates.
        made_running: dict[tuple[str, str], int] = {}
        for m in machines:
            if m.running and m.machine_id in self._made:
                key = self._made[m.machine_id]
                made_running[key] = made_running.get(key, 0) + 1
        by_release: dict[str, list[Machine]] = {}
        for m in machines:
            by_release.setdefault(m.release_id, []).append(m)
        # Machine id: the releases whose worker beats on it (the heartbeat says what runs
        # there, whatever the listing's metadata says).
        live_of: dict[str, set[str]] = {}
        for d in deployments:
            for machine_id in d.live_machines:
                live_of.setdefault(machine_id, set()).add(d.release_id)
        seen: dict[str, ReleaseSeen] = {}
        for d in deployments:
            view = views.get(d.queue)
            made = made_running.get((d.release_id, d.image), 0)
            others = {i for i, of in live_of.items() if d.release_id not in of}
            seen[d.release_id] = await self._release(
                d, by_release.pop(d.release_id, []), view, made, others
            )
        # Machines carrying the mark of a release the registry does not have: left
        # alone (their lane may still hold work), and shown.
        for release_id, orphans in by_release.items():
            seen[release_id] = ReleaseSeen(running=sum(m.running for m in orphans),
                                           error="not in the registry: left alone")  # fmt: skip
        await self._maybe_retire(deployments, seen)
        return seen

    def _backend_down(self, deployments: list[Deployment]) -> dict[str, ReleaseSeen]:
        return {d.release_id: ReleaseSeen(desired=d.desired, image=d.image,
                                          error=self._backend_error)
                for d in deployments}  # fmt: skip

    def _stopping(self, m: Machine) -> bool:
        """Whether ``m``'s stop was sent and it is still draining."""
        if m.state == STOPPING:
            return True
        sent = self._stop_sent.get(m.machine_id)
        return m.running and sent is not None and time.monotonic() - sent < STOP_RESEND_S

    def _dead(self, m: Machine, live: set[str]) -> bool:
        """No live worker on ``m`` for ``DEAD_AFTER_S``, as this scaler watched it."""
        if m.machine_id in live:
            self._not_live_since.pop(m.machine_id, None)
            return False
        since = self._not_live_since.setdefault(m.machine_id, time.monotonic())
        return m.age_s > DEAD_AFTER_S and time.monotonic() - since > DEAD_AFTER_S

    async def _release(self, d: Deployment, mine: list[Machine], view: LaneView | None,
                       made_running: int, others_live: set[str]) -> ReleaseSeen:  # fmt: skip
        # A retired lane the report no longer shows (pruned) holds nothing either.
        drained = d.role == "retired" and (view is None or view.status == "drained")
        seen = ReleaseSeen(desired=d.desired, image=d.image,
                           boot_refused=self._why_died.get((d.release_id, d.image)))  # fmt: skip
        live = set(d.live_machines)
        ready = set(d.ready_machines)
        release_id = d.release_id
        try:
            alive: list[Machine] = []
            self._doubted_now.clear()
            misreported: list[str] = []
            failed: list[str] = []  # actions on machines the release does not count
            misfiled: list[str] = []
            for m in mine:
                made_for = self._made.get(m.machine_id, (release_id, ""))[0]
                if m.machine_id in others_live or made_for != release_id:
                    # Listed as this release's, yet another release's worker beats on it,
                    # or this scaler made it for another release (still booting): never
                    # counted nor acted on here (stopping it would cut that release's
                    # machine, perhaps its last, mid-step).
                    misfiled.append(m.machine_id)
                    continue
                made = self._made.get(m.machine_id)
                if made == (release_id, d.image) and m.image != d.image:
                    # It runs the image this scaler created it with, whatever the
                    # listing says (a listing without lane_worker_image shows
                    # config.image as the API resolved it).
                    misreported.append(m.machine_id)
                    m = replace(m, image=d.image)
                if self._doubted(m, live):
                    # Counted as running (and ready), never acted on this pass.
                    alive.append(replace(m, state=STARTED))
                    continue
                if self._stopping(m):
                    seen.stopping += 1
                    seen.outdated += m.image != d.image
                    deadline_s = self.backend.stop_deadline_s
                    if self._stopping_for(m) > deadline_s and self._unasked_live(m, live):
                        log.warning("scaler.stopping_with_live_worker", release_id=release_id,
                                    machine=m.machine_id)  # fmt: skip
                    elif self._stopping_for(m) > deadline_s:
                        why = f"still stopping {deadline_s:g} s after its stop"
                        await self._act_aside(seen, failed, release_id, "destroyed", m, why)
                    continue
                if not m.running:
                    # A machine this scaler (or one before it) stopped did not die.
                    stopped = m.stopping_s is not None or m.machine_id in self._stop_sent
                    if not stopped and m.exit_code not in (None, 0):
                        if not self._death_noted.get(m.machine_id):
                            self._death_noted[m.machine_id] = True
                            self._note_death((release_id, m.image))
                        why = ("its worker refused the configuration"
                               if m.exit_code == EXIT_CONFIG
                               else "its worker could not start or crashed")  # fmt: skip
                        self._why_died[release_id, m.image] = (
                            f"machine {m.machine_id} exited {m.exit_code} ({why}; see "
                            f"{self.backend.where_logs(m.machine_id)})"
                        )
                        if m.image == d.image:  # an older image's death is not this deploy's
                            seen.boot_refused = self._why_died[release_id, m.image]
                    await self._act_aside(seen, failed, release_id, "destroyed", m,
                                          "it is not running")  # fmt: skip
                    continue
                if not drained and self._dead(m, live):
                    why = f"no live worker on it for {DEAD_AFTER_S:g} s"
                    await self._act_aside(seen, failed, release_id, "replaced", m, why)
                    continue
                alive.append(m)
            # Machines still on an image the release no longer records (it was
            # deployed again with a new one): replaced, new ones first.
            fresh = [m for m in alive if m.image == d.image]
            outdated = [m for m in alive if m.image != d.image]
            if misreported:
                seen.error = (
                    f"the backend lists machine(s) {', '.join(sorted(misreported))} this scaler "
                    f"created with {d.image} on another image (listed without its "
                    "lane_worker_image metadata?): counted as on the image they were created with"
                )
                log.error("scaler.image_misreported", release_id=release_id,
                          machines=sorted(misreported), image=d.image)  # fmt: skip
            if misfiled:
                seen.error = _also(seen.error, (
                    f"the backend lists machine(s) {', '.join(sorted(misfiled))} as this "
                    "release's, yet another release's worker runs on them (or this scaler "
                    "made them for another release): left alone"
                ))  # fmt: skip
                log.error("scaler.release_misreported", release_id=release_id,
                          machines=sorted(misfiled))  # fmt: skip
            for said in failed:
                seen.error = _also(seen.error, said)
            seen.running = len(alive)
            seen.outdated += len(outdated)
            seen.ready = sum(1 for m in fresh if m.machine_id in ready)
            if seen.ready:
                self._died.pop((release_id, d.image), None)
                self._not_before.pop((release_id, d.image), None)
                self._why_died.pop((release_id, d.image), None)
                seen.boot_refused = None
            if drained:
                seen.target = 0
                for m in alive:
                    if m.machine_id not in self._doubted_now:
                        await self._act(seen, release_id, "stopped", m, "its lane is drained")
                return seen
            # A retired lane with work only its release may run and no live worker
            # gets one machine even if the release was deployed with none.
            stranded = d.role == "retired" and view is not None and view.stranded
            seen.target = max(d.desired, 1) if stranded else d.desired
            had = seen.error
            await self._start_missing(seen, d, len(fresh), made_running)
            if had and seen.error != had:
                seen.error = _also(had, seen.error)
            # An outdated machine stops only once the new image has the release's
            # count ready: a new image that cannot boot leaves the old ones serving.
            if outdated and seen.ready >= d.desired:
                for m in outdated:
                    if m.machine_id in self._doubted_now:
                        continue
                    await self._act(seen, release_id, "stopped", m,
                                    f"its image {m.image} was replaced by {d.image}")  # fmt: skip
            # A draining release keeps one machine while its lane holds work, even one
            # deployed with none (it got one while stranded): only twins above that go.
            keep = max(seen.target, 1) if d.role == "retired" else seen.target
            if len(fresh) > keep:
                await self._trim(seen, release_id, fresh, live, keep)
        except BackendError as exc:
            seen.error = str(exc)
            log.error("scaler.backend_failed", release_id=release_id, error=str(exc))
            after_s = _retry_after_s(exc)
            if after_s:  # rate limited: the next passes leave the backend alone meanwhile
                self._backend_retry_at = max(self._backend_retry_at, time.monotonic() + after_s)
                self._backend_error = str(exc)
        return seen

    def _unasked_live(self, m: Machine, live: set[str]) -> bool:
        """Whether ``m``'s worker beats and no stop of it is known (this scaler's or the
        backend's word): a listing that says otherwise is doubted."""
        return (m.machine_id in live and m.machine_id not in self._stop_sent
                and m.stopping_s is None)  # fmt: skip

    def _doubted(self, m: Machine, live: set[str]) -> bool:
        """Whether this listing of ``m`` is doubted: its worker beats, nobody was known to
        stop it, and it is listed failed or stopped for the first time in a row (a stale
        listing must not cut a step mid-run; the next listing decides)."""
        if m.running:  # listed running again: its stopping clock starts over
            self._stopping_seen.pop(m.machine_id, None)
        if m.running or m.state == STOPPING or not self._unasked_live(m, live):
            self._off_listings.pop(m.machine_id, None)
            return False
        listings = self._off_listings[m.machine_id] = self._off_listings.get(m.machine_id, 0) + 1
        if listings >= 2:
            return False
        log.warning("scaler.listing_doubted", machine=m.machine_id, state=m.state,
                    detail="its worker beats: believed running until the next listing")  # fmt: skip
        self._doubted_now.add(m.machine_id)
        return True

    async def _start_missing(
        self, seen: ReleaseSeen, d: Deployment, listed: int, made_running: int
    ) -> None:
        """Create what the release lacks: a few per pass, none while the listing is wrong.

        A machine created but not listed yet counts as the release's (so a listing
        that never shows it cannot make the scaler create without end), and no more
        are created while the machines this scaler made for the release's image that
        still run reach its count plus ``MADE_SURPLUS``, whatever the listing says.
        """
        now = time.monotonic()
        mine = [(i, image, at) for i, (r, image, at) in self._created.items() if r == d.release_id]
        have = listed + sum(1 for _, image, _ in mine if image == d.image)
        made = made_running + sum(1 for _, image, _ in mine if image == d.image)
        unlisted = sorted(i for i, _, at in mine if now - at > UNLISTED_AFTER_S)
        seen.unlisted = len(unlisted)
        wait_s = self._not_before.get((d.release_id, d.image), 0.0) - now
        ceiling = seen.target + MADE_SURPLUS
        if seen.target > have and made >= ceiling:
            seen.error = (
                f"this scaler made {made} machines of this release on {d.image} that still run, "
                f"yet the backend lists {listed} of {seen.target} on it: no machine is created "
                f"for this release above {ceiling} (is the listing wrong?)"
            )
            log.error("scaler.create_bound", release_id=d.release_id, made=made,
                      listed=listed, target=seen.target)  # fmt: skip
        elif unlisted:
            seen.error = (
                f"the backend does not list machine(s) {', '.join(unlisted)} this scaler created "
                f"over {UNLISTED_AFTER_S:g} s ago (listed without the scaler's metadata?): no "
                "machine is created for this release until the listing shows them"
            )
            log.error("scaler.machines_unlisted", release_id=d.release_id, machines=unlisted)
        elif seen.target > have and wait_s > 0:
            seen.actions.append(f"waiting {wait_s:.0f} s before starting another machine")
        else:
            for _ in range(min(MAX_CREATES_PER_PASS, seen.target - have, ceiling - made)):
                await self._create(seen, d, f"{have} of {seen.target} running {d.image}")

    async def _trim(
        self, seen: ReleaseSeen, release_id: str, fresh: list[Machine], live: set[str], keep: int
    ) -> None:
        """Stop what ``fresh`` has above ``keep``, never a live machine it still needs."""
        live_left = len({m.machine_id for m in fresh} & live)  # machines, not listings
        # Machines without a live worker first.
        surplus = sorted(fresh, key=lambda m: (m.machine_id in live, -m.age_s))
        surplus = [m for m in surplus if m.machine_id not in self._doubted_now]
        for m in surplus[: len(fresh) - keep]:
            if m.machine_id in live:
                if live_left <= keep:
                    continue  # the release needs this live one, whatever the listing says
                live_left -= 1
            await self._act(seen, release_id, "stopped", m, "above the desired count")

    def _stopping_for(self, m: Machine) -> float:
        """How long ``m`` has been stopping: as the backend says, else as this scaler saw it."""
        if m.stopping_s is not None:
            return m.stopping_s
        now = time.monotonic()
        since = self._stopping_seen.setdefault(m.machine_id, self._stop_sent.get(m.machine_id, now))
        return now - since

    async def _create(self, seen: ReleaseSeen, d: Deployment, reason: str) -> None:
        await self.guard()
        made = await self.backend.create(d.release_id, d.image)
        self._created[made.machine_id] = (d.release_id, d.image, time.monotonic())
        self._made[made.machine_id] = (d.release_id, d.image)
        seen.actions.append(f"created {made.machine_id}")
        detail = {"machine": made.machine_id, "image": d.image, "reason": reason}
        await self._record(d.release_id, "machine_created", detail)
        log.info("scaler.machine_created", release_id=d.release_id, machine=made.machine_id,
                 image=d.image, reason=reason)  # fmt: skip

    def _note_death(self, key: tuple[str, str]) -> None:
        """A machine of a release's image exited with an error: back off before the next."""
        died = self._died.get(key, 0) + 1
        self._died[key] = died
        self._not_before[key] = time.monotonic() + min(MAX_RESTART_BACKOFF_S, 2.0**died)

    async def _act(
        self, seen: ReleaseSeen, release_id: str, action: str, m: Machine, reason: str
    ) -> None:
        """Stop (and, for a machine that is not running, destroy) ``m``; record why."""
        await self.guard()
        if m.running:
            self._stop_sent[m.machine_id] = time.monotonic()
            await self.backend.stop(m)
        if action in ("destroyed", "replaced") or not m.running:
            await self.backend.destroy(m)
        seen.actions.append(f"{action} {m.machine_id}")
        await self._record(release_id, f"machine_{action}",
                           {"machine": m.machine_id, "reason": reason,
                            "exitCode": m.exit_code})  # fmt: skip
        log.info(f"scaler.machine_{action}", release_id=release_id, machine=m.machine_id,
                 reason=reason, exit_code=m.exit_code)  # fmt: skip

    async def _act_aside(
        self, seen: ReleaseSeen, failed: list[str], release_id: str, action: str, m: Machine,
        reason: str,
    ) -> None:  # fmt: skip
        """``_act`` on a machine the release no longer counts: a refusal is said, and the
        pass goes on to create what the release lacks (a dead machine the API will not
        remove, a 404 or a 412 pass after pass, must not leave the release with none)."""
        try:
            await self._act(seen, release_id, action, m, reason)
        except BackendError as exc:
            if _retry_after_s(exc):
                raise  # rate limited: the whole backend is left alone a while
            failed.append(str(exc))
            log.error("scaler.action_failed", release_id=release_id, machine=m.machine_id,
                      action=action, error=str(exc))  # fmt: skip

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
