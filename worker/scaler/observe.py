"""What a scaler pass believes: the plan's state, built from what it read and watched.

``observe`` is the one adapter from the page's and the registry's models
(``Deployment``, ``LaneView``) and the backend's listing to the plan's narrow
typed state (``plan.PassState``). It also keeps the scaler's memory
(``Watch``): each pass is otherwise stateless, so a scaler that restarts (or a
standby that takes over) converges to the same end. What is watched, and
forgotten when a scaler becomes active:

- since when a machine has been seen without a live worker (so a database
  outage, which stops every heartbeat, does not make every machine look dead
  the moment it ends);
- which stops were sent (a backend may list a stopping machine as running for a
  moment: it is believed stopping for ``STOP_RESEND_S``), and since when a
  machine the backend lists stopping without saying since when was seen so;
- how many listings in a row said failed or stopped of a machine whose worker
  beats and that nobody was known to stop: the first is doubted (the machine is
  counted running and never acted on), the second believed; a machine listed
  running again has its stopping clock start over;
- the machines this scaler created (until listed) and made (while listed): these
  are kept in the store too (``scaler_creates``, migration 0026) and loaded again
  when a scaler becomes active (``Watch.remember``), so the create bounds hold
  across activations; an unlisted one is forgotten after ``CREATE_MEMORY_S``
  (one the scaler was cut off creating, without a machine id, after
  ``UNLISTED_AFTER_S``).

The deaths of a release's image (its backoff), and which listed machines' crashes
were counted, are kept across activations of one process. A machine is its id: one the backend
lists twice is one machine.

The listing's word on whose a machine is gives way to what is known better: a
machine listed as one release's while another release's worker beats on it (and
this one's does not), or that this scaler made for another release (booting, no
heartbeat yet), is ``Condition.MISFILED`` for the release the listing names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog

from worker.db.store.rows import Deployment, ScalerCreate
from worker.ops.lane_view import BUCKETS, PARKED, LaneView
from worker.scaler.backend import STOPPING, Machine, one_per_id
from worker.scaler.plan import (
    UNLISTED_AFTER_S,
    Condition,
    MachineFacts,
    PassState,
    ReleaseState,
    Role,
    Stray,
    Unlisted,
)

# A stop sent while the backend still lists the machine running is not sent again
# for this long (the backend catches up within a pass or two).
STOP_RESEND_S = 300.0
# Listings in a row that say a machine whose worker beats is off, from which on they
# are believed (the first is doubted).
BELIEVED_FROM = 2
# How long a machine this scaler created and the backend never listed is remembered
# (it keeps its release from creating, said loudly, meanwhile): a machine removed
# behind the scaler's back before it was ever listed must not block its release for
# good, and a listing that never shows the scaler's machines costs at most one round
# of creates per this long, however often a scaler becomes active.
CREATE_MEMORY_S = 3600.0
# The id a create gets in ``Watch.created`` while its machine id is unknown (a scaler
# was cut off before the backend answered): counted, never listed.
UNANSWERED = "unanswered create "

log = structlog.get_logger("lane_worker.scaler")

_NOT_PARKED = tuple(b for b in BUCKETS if b not in PARKED)
_ROLES = {"current": Role.CURRENT, "previous": Role.SUPERSEDED, "candidate": Role.CANDIDATE}


@dataclass(frozen=True)
class BootFailed:
    """Machines of a release's image that refused to boot in a row, for one deploy."""

    deployed_at: str
    in_a_row: int
    exit_code: int
    machine_id: str
    logs: str
    last_line: str | None

    def as_json(self) -> dict[str, object]:
        return {
            "inARow": self.in_a_row,
            "exitCode": self.exit_code,
            "machine": self.machine_id,
            "logs": self.logs,
            "lastLine": self.last_line,
        }


@dataclass
class Watch:
    """What the scaler remembers between passes (in memory: a restarted scaler starts
    over, which is safe, only slower; except ``created`` and ``made``, which the store
    keeps too). Machine ids, and (release, image) keys."""

    not_live_since: dict[str, float] = field(default_factory=dict)
    stop_sent: dict[str, float] = field(default_factory=dict)
    stopping_seen: dict[str, float] = field(default_factory=dict)
    off_listings: dict[str, int] = field(default_factory=dict)
    # (release, image, when) of a create this scaler made that the backend has not
    # listed yet; kept until it does.
    created: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    # (release, image) of every machine this scaler made, while it is listed (or not
    # yet): it runs that image whatever the listing says of it.
    made: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Per release and image: machines that died young in a row, when the next may
    # be created, and the last exit, until one is ready. A new image of the
    # release (the fix) starts at once.
    died: dict[tuple[str, str], int] = field(default_factory=dict)
    not_before: dict[tuple[str, str], float] = field(default_factory=dict)
    why_died: dict[tuple[str, str], str] = field(default_factory=dict)
    # Per release and image: the machines in a row whose worker refused its
    # configuration or its app (exit 78 or 2), with the deploy they count for
    # (a deploy again starts over) and the last one's word (``BootFailed``).
    boot_failed: dict[tuple[str, str], BootFailed] = field(default_factory=dict)
    # Machines whose crash was counted (while listed): a dead machine the backend will
    # not remove is one death, not one per listing.
    death_noted: set[str] = field(default_factory=set)
    # What the store is yet to be told of ``created`` and ``made``: machines the
    # backend now lists, and those it no longer does (``take_seen``).
    found: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)

    def reset(self) -> None:
        """Forget what was watched: called when this scaler becomes the active one."""
        self.not_live_since.clear()
        self.stop_sent.clear()
        self.stopping_seen.clear()
        self.off_listings.clear()
        # Another scaler may have listed and removed them meanwhile: the store's word
        # replaces this one's (``remember``).
        self.created.clear()
        self.made.clear()
        self.found.clear()
        self.gone.clear()

    def remember(self, creates: Sequence[ScalerCreate], now: float) -> None:
        """Take the store's word on what was created (the rows a scaler keeps there)."""
        for c in creates:
            if c.listed and c.machine_id:
                self.made[c.machine_id] = (c.release_id, c.image)
            elif c.machine_id:
                self.created[c.machine_id] = (c.release_id, c.image, now - c.age_s)
                self.made[c.machine_id] = (c.release_id, c.image)
            else:
                self.created[UNANSWERED + c.create_key] = (c.release_id, c.image, now - c.age_s)

    def take_seen(self) -> tuple[set[str], set[str]]:
        """The machines found listed and gone since last taken (for the store)."""
        found, gone = self.found - self.gone, set(self.gone)
        self.found.clear()
        self.gone.clear()
        return found, gone

    def forget_unlisted(self, listed: set[str], now: float) -> None:
        """Forget what is watched of machines the listing no longer has, and creates
        unlisted for too long (``CREATE_MEMORY_S``; unanswered, ``UNLISTED_AFTER_S``:
        the plan never holds those against the release)."""
        for memory in (self.not_live_since, self.stop_sent, self.stopping_seen, self.off_listings):
            for gone in set(memory) - listed:
                del memory[gone]
        self.death_noted &= listed
        for mid, (_, _, at) in list(self.created.items()):
            if mid in listed:
                del self.created[mid]
                self.found.add(mid)
            elif now - at > (UNLISTED_AFTER_S if mid.startswith(UNANSWERED) else CREATE_MEMORY_S):
                del self.created[mid]
        for gone in set(self.made) - listed - set(self.created):
            del self.made[gone]
            self.gone.add(gone)


def observe(
    watch: Watch,
    deployments: Sequence[Deployment],
    views: Mapping[str, LaneView],
    listing: list[Machine],
    *,
    now: float,
    stop_deadline_s: float,
    where_logs: Callable[[str], str],
    held: bool = False,
) -> tuple[PassState, dict[str, Machine]]:
    """The plan's state for one pass, and each listed machine by id as actions name it.

    ``views`` is the drain report by queue; ``now`` the scaler's monotonic clock.
    """
    machines = one_per_id(listing)
    watch.forget_unlisted({m.machine_id for m in machines}, now)
    # What this scaler made that runs, per release and image, wherever the listing
    # puts it (another release's metadata, another image): bounds its creates.
    made_running: dict[tuple[str, str], int] = {}
    for m in machines:
        if m.running and m.machine_id in watch.made:
            key = watch.made[m.machine_id]
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
    acted_on: dict[str, Machine] = {}
    releases = []
    # The current release runs no ready worker (deployed with 0 machines, or its
    # machines still booting): a retired lane's parked runs wait for it (plan.py).
    paused = any(d.role == "current" and d.ready_workers == 0 for d in deployments)
    for d in deployments:
        mine = by_release.pop(d.release_id, [])
        elsewhere = {i for i, of in live_of.items() if d.release_id not in of}
        view = views.get(d.queue)
        release = _release(watch, d, view, mine, elsewhere, now, where_logs, acted_on)
        releases.append(
            replace(
                release,
                made_running=made_running.get((d.release_id, d.image), 0),
                waits_for_current=paused and release.role is Role.DRAINING and _only_parked(view),
            )
        )
    strays = tuple(
        Stray(release_id, sum(m.running for m in found)) for release_id, found in by_release.items()
    )
    state = PassState(
        now=now,
        stop_deadline_s=stop_deadline_s,
        releases=tuple(releases),
        strays=strays,
        held=held,
    )
    return state, acted_on


def _only_parked(view: LaneView | None) -> bool:
    """Whether the lane's open runs are all parked (sleeps, events): none in flight, fresh,
    retrying or handed back, which only its own release may run."""
    if view is None:
        return False
    return not any(n for bucket, n in view.counts.items() if bucket in _NOT_PARKED)


def _release(
    watch: Watch,
    d: Deployment,
    view: LaneView | None,
    mine: list[Machine],
    elsewhere: set[str],
    now: float,
    where_logs: Callable[[str], str],
    acted_on: dict[str, Machine],
) -> ReleaseState:
    """``d`` as the plan reads it; ``elsewhere``: machines another release's worker beats
    on (and ``d``'s does not)."""
    # A retired lane the report no longer shows (pruned) holds nothing either.
    if d.role == "retired":
        drained = view is None or view.status == "drained"
        role = Role.DRAINED if drained else Role.DRAINING
    else:
        role = _ROLES.get(d.role, Role.SUPERSEDED)
    live, ready = set(d.live_machines), set(d.ready_machines)
    facts = []
    for m in mine:
        made_for = watch.made.get(m.machine_id, (d.release_id, ""))[0]
        if m.machine_id in elsewhere or made_for != d.release_id:
            # Not this release's, whatever the listing says: neither watched nor acted
            # on here (stopping it could cut another release's last machine mid-step).
            facts.append(
                MachineFacts(
                    m.machine_id,
                    m.image,
                    Condition.MISFILED,
                    age_s=m.age_s,
                    listed_running=m.running,
                )
            )
            continue
        misreported = watch.made.get(m.machine_id) == (d.release_id, d.image) and m.image != d.image
        if misreported:
            # It runs the image this scaler created it with, whatever the listing says
            # (a listing without lane_worker_image shows config.image as resolved).
            m = replace(m, image=d.image)
        acted_on[m.machine_id] = m
        facts.append(_machine(watch, m, live, ready, misreported, role, now, where_logs))
    return ReleaseState(
        release_id=d.release_id,
        image=d.image,
        role=role,
        desired=d.desired,
        stranded=role is Role.DRAINING and view is not None and view.stranded,
        machines=tuple(facts),
        unlisted=tuple(
            Unlisted(i, image, at)
            for i, (r, image, at) in watch.created.items()
            if r == d.release_id
        ),
        deaths={image: n for (r, image), n in watch.died.items() if r == d.release_id},
        not_before=watch.not_before.get((d.release_id, d.image), 0.0),
    )


def _machine(
    watch: Watch,
    m: Machine,
    live: set[str],
    ready: set[str],
    misreported: bool,
    role: Role,
    now: float,
    where_logs: Callable[[str], str],
) -> MachineFacts:
    """What the plan reads of ``m``; watches it (the clocks and counts above)."""
    mid = m.machine_id
    stop_known = m.stopping_s is not None or mid in watch.stop_sent
    facts = MachineFacts(
        machine_id=mid,
        image=m.image,
        condition=Condition.RUNNING,
        age_s=m.age_s,
        live=mid in live,
        ready=mid in ready,
        stop_known=stop_known,
        listed_running=m.running,
        exit_code=m.exit_code,
        death_noted=mid in watch.death_noted,
        misreported=misreported,
    )
    if _doubted(watch, m, facts.live and not stop_known):
        return replace(facts, condition=Condition.DOUBTED)
    sent = watch.stop_sent.get(mid)
    if m.state == STOPPING or (m.running and sent is not None and now - sent < STOP_RESEND_S):
        return replace(facts, condition=Condition.STOPPING, stopping_s=_stopping_for(watch, m, now))
    if not m.running:
        down = replace(facts, condition=Condition.DOWN, logs=where_logs(mid))
        return replace(down, last_line=m.last_line)
    if role is Role.DRAINED:
        return facts  # its machines stop whatever their workers do: not watched
    if facts.live:
        watch.not_live_since.pop(mid, None)
        return facts
    since = watch.not_live_since.setdefault(mid, now)
    return replace(facts, not_live_s=now - since)


def _doubted(watch: Watch, m: Machine, unasked_live: bool) -> bool:
    """Whether this listing of ``m`` is doubted: its worker beats, nobody was known to stop
    it (``unasked_live``), and it is listed failed or stopped for the first time in a
    row (a stale listing must not cut a step mid-run; the next listing decides)."""
    if m.running:  # listed running again: its stopping clock starts over
        watch.stopping_seen.pop(m.machine_id, None)
    if m.running or m.state == STOPPING or not unasked_live:
        watch.off_listings.pop(m.machine_id, None)
        return False
    listings = watch.off_listings[m.machine_id] = watch.off_listings.get(m.machine_id, 0) + 1
    if listings >= BELIEVED_FROM:
        return False
    log.warning(
        "scaler.listing_doubted",
        machine=m.machine_id,
        state=m.state,
        detail="its worker beats: believed running until the next listing",
    )
    return True


def _stopping_for(watch: Watch, m: Machine, now: float) -> float:
    """How long ``m`` has been stopping: as the backend says, else as this scaler saw it."""
    if m.stopping_s is not None:
        return m.stopping_s
    since = watch.stopping_seen.setdefault(m.machine_id, watch.stop_sent.get(m.machine_id, now))
    return now - since
