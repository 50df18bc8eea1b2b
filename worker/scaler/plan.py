"""What one scaler pass does, decided purely: ``plan(state) -> actions``.

The state is what the pass believes, built by ``observe.py`` from the registry,
the drain report, the backend's listing and what this scaler watched; the
actions are what ``reconcile.py`` performs on the backend and records. Nothing
here does I/O or reads a clock: the time is part of the state. The rules:

- the current release runs its desired count (up or down), and so does a gated
  candidate (its gate runs on them; ``gate.py`` decides whether it becomes current);
- a superseded release (``previous``: its lane still claims) keeps its machines;
- a draining release (retired, its lane not drained) keeps its recorded count
  (at least one while its lane is stranded: work only it may run and no live
  worker): a machine that died (stopped, failed, or no live worker of it for
  ``DEAD_AFTER_S`` as the scaler watched it) is replaced from the release's image;
  except while the current release has no ready worker (deployed with 0 machines,
  or its machines still booting) and the draining lane holds only parked runs
  (``waits_for_current``): those wait for the current release to adopt them once
  it runs, so no machine of the old release is started for them (one still running
  keeps draining);
- a drained release has its machines stopped, then destroyed;
- a stopping machine drains undisturbed (a second stop signal would make its
  worker exit at once) and is destroyed once it stopped, or when it outlives the
  backend's ``stop_deadline_s`` (above its worker's longest stop), unless its
  worker beats and nobody was known to stop it;
- a live machine of a release that is not drained is never stopped or destroyed,
  except the current release's surplus when its count goes down, and a machine
  on an image the release no longer records (it was deployed again with a new
  one) once the new image has the release's count ready;
- once the current release has its desired count ready, what it supersedes is
  retired, unless the releases are held (``releases hold``): then nothing is;
- any release above what it needs (a create whose answer was lost made a twin)
  is trimmed, machines without a live worker first, and a live machine is never
  stopped when that would leave the release fewer live ones than it needs (at
  least one, while it should run), whatever the listing says;
- a machine the scaler created counts towards its release until the backend
  lists it; one still unlisted after ``UNLISTED_AFTER_S`` means the listing is
  wrong: said loudly, and that release gets no new machine until the listing
  shows it. At most ``MAX_CREATES_PER_PASS`` are created per release and pass,
  and none while the machines the scaler made for the release's image that run
  (wherever the listing puts them) reach its count plus ``MADE_SURPLUS``;
- a machine whose worker exited with an error (one nobody stopped) backs its
  release's image off: 2, 4, ... ``MAX_RESTART_BACKOFF_S`` s between machines,
  until one of that image is ready; a crash is counted once per machine (a dead
  machine the backend will not remove is listed pass after pass);
- a doubted machine (see ``Condition``) counts as running and is never acted on;
- a misfiled machine (listed as the release's, yet another release's worker beats
  on it, or the scaler made it for another release) is neither counted nor acted
  on by the release the listing names, and said: it may be the other release's
  last machine, mid-step;
- a ``Destroy`` is always of a machine the release no longer counts (stopped,
  failed, stuck stopping, dead): ``reconcile.py`` says its refusal and goes on
  to the release's creates (a dead machine the backend will not remove must not
  leave the release without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from worker.errors import EXIT_CONFIG, counted  # a worker that refused its configuration
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

# A machine whose worker has not been live this long, as the scaler watched it
# (and at least this long after it was created), is dead: a boot takes seconds.
DEAD_AFTER_S = 60.0
MAX_RESTART_BACKOFF_S = 300.0  # between machines of a release whose machines keep dying
MAX_CREATES_PER_PASS = 3  # per release: a wrong count or listing costs a few machines, not many
# A machine the scaler created that the backend has not listed for this long: the
# listing is wrong (Fly lists a new machine within a pass or two).
UNLISTED_AFTER_S = 30.0
# Machines the scaler made for a release's image and that still run (whatever the
# listing says of their image), above which it creates no more for that release:
# the release's count plus this. A listing that misreports what it made cannot
# make it create without end.
MADE_SURPLUS = 2
# A draining release's word while its parked runs wait for the current release.
PAUSED_WORD = (
    "waiting for the current release to run (deployed with 0 machines, or none ready yet) "
    "and adopt its parked runs: no machine is started for them"
)


class Role(Enum):
    """What a release is to the scaler (its registry role, and its lane's drain verdict)."""

    CURRENT = "current"  # runs its desired count
    # Gated, not current yet (migration 0050): runs its desired count for its gate;
    # never retires anything (the gate driver, gate.py, promotes it).
    CANDIDATE = "candidate"
    SUPERSEDED = "superseded"  # ``previous``: its lane still claims; keeps its count
    DRAINING = "draining"  # retired, its lane still holds work: keeps its count, one at least
    DRAINED = "drained"  # retired, its lane holds nothing (or was pruned): its machines go


class Condition(Enum):
    """How the pass believes a machine's listing (``observe.py`` decides it)."""

    RUNNING = "running"  # starting or started
    # Listed failed or stopped for the first time in a row while its worker beats and
    # nobody was known to stop it: counted running (and ready), never acted on.
    DOUBTED = "doubted"
    STOPPING = "stopping"  # its stop was sent (by anyone) and it drains
    DOWN = "down"  # stopped or failed
    # Listed as this release's, yet another release's worker beats on it (and this
    # one's does not), or this scaler made it for another release (still booting).
    MISFILED = "misfiled"


@dataclass(frozen=True)
class MachineFacts:
    """What the plan reads of one machine (one per machine id)."""

    machine_id: str
    # Its image; for one the scaler made and the listing shows on another, the image
    # it was made with (``misreported``).
    image: str
    condition: Condition
    age_s: float = 1000.0  # since it was created
    live: bool = False  # a live worker on it
    ready: bool = False  # ... with the ready mark, claiming
    # How long the scaler has watched it running without a live worker (0 while live).
    not_live_s: float = 0.0
    stopping_s: float = 0.0  # how long it has been stopping (STOPPING)
    stop_known: bool = False  # its stop was sent (this scaler's word or the backend's)
    listed_running: bool = False  # the backend lists it starting or started
    exit_code: int | None = None  # how its worker exited, when the backend knows
    death_noted: bool = False  # its crash was counted at an earlier listing
    misreported: bool = False
    logs: str = ""  # where its worker's output is read
    last_line: str | None = None  # the last line its worker printed (a dead machine's)


@dataclass(frozen=True)
class Unlisted:
    """A machine the scaler created that the backend does not list yet."""

    machine_id: str
    image: str
    created_at: float


@dataclass(frozen=True)
class ReleaseState:
    """One release as the plan reads it."""

    release_id: str
    image: str  # the image the registry records for it
    role: Role
    desired: int
    stranded: bool = False  # its lane holds work only it may run and no live worker claims
    # Draining, its lane holds only parked runs, and the current release has no ready
    # worker (deployed with 0, or booting): the runs wait for it (adopted once it runs).
    waits_for_current: bool = False
    machines: tuple[MachineFacts, ...] = ()  # as listed, in the listing's order
    unlisted: tuple[Unlisted, ...] = ()
    # The scaler's machines of this release and image that run, wherever listed.
    made_running: int = 0
    # Machines per image that died in a row (exited with an error, none ready since).
    deaths: Mapping[str, int] = field(default_factory=dict)
    not_before: float = 0.0  # no machine of its image is created before then (backoff)


@dataclass(frozen=True)
class Stray:
    """Machines carrying the mark of a release the registry does not have."""

    release_id: str
    running: int


@dataclass(frozen=True)
class PassState:
    """Everything one pass decides from."""

    now: float  # the scaler's monotonic clock, as the pass read it
    stop_deadline_s: float  # the backend's: above a worker's longest stop
    releases: tuple[ReleaseState, ...] = ()
    strays: tuple[Stray, ...] = ()
    # `releases hold`: no current release changes (nothing superseded is retired).
    held: bool = False


def plan(state: PassState) -> list[Action]:
    """What the pass does, in order: each release's actions, the strays', then retiring."""
    actions: list[Action] = []
    for release in state.releases:
        actions += _release(release, state)
    for stray in state.strays:
        # Left alone: their lane may still hold work.
        actions += [
            Tally(stray.release_id, running=stray.running),
            Say(stray.release_id, None, "not in the registry: left alone"),
        ]
    actions += _retire(state, actions)
    return actions


def _release(r: ReleaseState, state: PassState) -> list[Action]:
    out: list[Action] = []
    alive: list[MachineFacts] = []  # counted running
    stopping = stopping_outdated = 0
    deaths = dict(r.deaths)
    not_before = r.not_before
    deadline_s = state.stop_deadline_s
    for m in r.machines:
        if m.condition is Condition.MISFILED:
            continue  # neither counted nor acted on here: said below
        if m.condition is Condition.DOUBTED:
            alive.append(m)
        elif m.condition is Condition.STOPPING:
            stopping += 1
            stopping_outdated += m.image != r.image
            if m.stopping_s > deadline_s and m.live and not m.stop_known:
                out.append(
                    Say(
                        r.release_id,
                        "scaler.stopping_with_live_worker",
                        fields=(("machine", m.machine_id),),
                    )
                )
            elif m.stopping_s > deadline_s:
                out.append(
                    Destroy(
                        r.release_id,
                        m.machine_id,
                        f"still stopping {deadline_s:g} s after its stop",
                        stop_first=m.listed_running,
                    )
                )
        elif m.condition is Condition.DOWN:
            # A machine the scaler (or one before it) stopped did not die.
            # Once per machine: counted again each listing, the wait before its
            # replacement would double every pass and never end.
            if not m.stop_known and m.exit_code not in (None, 0) and not m.death_noted:
                deaths[m.image] = deaths.get(m.image, 0) + 1
                until = state.now + min(MAX_RESTART_BACKOFF_S, 2.0 ** deaths[m.image])
                if m.image == r.image:
                    not_before = until
                out.append(
                    Backoff(
                        r.release_id,
                        m.machine_id,
                        m.image,
                        deaths[m.image],
                        until,
                        _death(m),
                        current=m.image == r.image,
                        exit_code=m.exit_code,
                        last_line=m.last_line,
                    )
                )
            out.append(Destroy(r.release_id, m.machine_id, "it is not running"))
        elif r.role is not Role.DRAINED and _dead(m):
            out.append(
                Destroy(
                    r.release_id,
                    m.machine_id,
                    f"no live worker on it for {DEAD_AFTER_S:g} s",
                    replaced=True,
                    stop_first=True,
                )
            )
        else:
            alive.append(m)
    # Machines still on an image the release no longer records (it was deployed
    # again with a new one): replaced, new ones first.
    fresh = [m for m in alive if m.image == r.image]
    outdated = [m for m in alive if m.image != r.image]
    misreported = sorted(m.machine_id for m in r.machines if m.misreported)
    if misreported:
        out.append(
            Say(
                r.release_id,
                "scaler.image_misreported",
                f"the backend lists machine(s) {', '.join(misreported)} this scaler created with "
                f"{r.image} on another image (listed without its lane_worker_image metadata?): "
                "counted as on the image they were created with",
                (("machines", misreported), ("image", r.image)),
            )
        )
    misfiled = sorted(m.machine_id for m in r.machines if m.condition is Condition.MISFILED)
    if misfiled:
        out.append(
            Say(
                r.release_id,
                "scaler.release_misreported",
                f"the backend lists machine(s) {', '.join(misfiled)} as this release's, yet "
                "another release's worker runs on them (or this scaler made them for another "
                "release): left alone",
                (("machines", misfiled),),
            )
        )
    ready = sum(1 for m in fresh if m.ready)
    if ready:
        out.append(Recovered(r.release_id, r.image))
        not_before = 0.0
    counted = Tally(
        r.release_id,
        running=len(alive),
        ready=ready,
        stopping=stopping,
        outdated=stopping_outdated + len(outdated),
    )
    untouched = [m for m in alive if m.condition is not Condition.DOUBTED]
    if r.role is Role.DRAINED:
        out.append(counted)
        out += [Stop(r.release_id, m.machine_id, "its lane is drained") for m in untouched]
        return out
    # A retired lane with work only its release may run and no live worker gets one
    # machine even if the release was deployed with none.
    stranded = r.role is Role.DRAINING and r.stranded
    base = max(r.desired, 1) if stranded else r.desired
    # Scaling the current release to 0 pauses the app: an older release is not
    # booted to run parked runs the current one adopts once it runs (again).
    paused = r.role is Role.DRAINING and r.waits_for_current
    target = 0 if paused else base
    unlisted = sorted(
        u.machine_id for u in r.unlisted if state.now - u.created_at > UNLISTED_AFTER_S
    )
    out.append(replace(counted, target=target, unlisted=len(unlisted)))
    if paused and len(fresh) < base:
        out.append(Note(r.release_id, PAUSED_WORD))
    out += _start_missing(r, state.now, target, len(fresh), not_before, unlisted)
    # An outdated machine stops only once the new image has the release's count
    # ready: a new image that cannot boot leaves the old ones serving.
    if outdated and ready >= r.desired:
        out += [
            Stop(r.release_id, m.machine_id, f"its image {m.image} was replaced by {r.image}")
            for m in outdated
            if m.condition is not Condition.DOUBTED
        ]
    # A draining release keeps one machine while its lane holds work, even one
    # deployed with none (it got one while stranded): only twins above that go.
    keep = max(base, 1) if r.role is Role.DRAINING else target
    if len(fresh) > keep:
        out += _trim(r.release_id, fresh, keep)
    return out


def _dead(m: MachineFacts) -> bool:
    """No live worker on ``m`` for ``DEAD_AFTER_S`` as the scaler watched it (nor since made)."""
    return not m.live and m.age_s > DEAD_AFTER_S and m.not_live_s > DEAD_AFTER_S


def _death(m: MachineFacts) -> str:
    why = (
        "its worker refused the configuration"
        if m.exit_code == EXIT_CONFIG
        else "its worker could not start or crashed"
    )
    said = f"machine {m.machine_id} exited {m.exit_code} ({why}; see {m.logs})"
    return f"{said}; its last line: {m.last_line}" if m.last_line else said


def _start_missing(
    r: ReleaseState,
    now: float,
    target: int,
    listed: int,
    not_before: float,
    unlisted: list[str],
) -> list[Action]:
    """Create what the release lacks: a few per pass, none while the listing is wrong.

    A machine created but not listed yet counts as the release's (so a listing
    that never shows it cannot make the scaler create without end), and no more
    are created while the machines the scaler made for the release's image that
    still run reach its count plus ``MADE_SURPLUS``, whatever the listing says, nor
    while some it created are ``unlisted`` past ``UNLISTED_AFTER_S``.
    """
    on_image = sum(1 for u in r.unlisted if u.image == r.image)
    have = listed + on_image
    made = r.made_running + on_image
    wait_s = not_before - now
    ceiling = target + MADE_SURPLUS
    if target > have and made >= ceiling:
        return [
            Say(
                r.release_id,
                "scaler.create_bound",
                f"this scaler made {counted(made, 'machine')} of this release on {r.image} "
                f"still running, yet the backend lists {listed} of {target} on it: no machine "
                f"is created for this release above {ceiling} (is the listing wrong?)",
                (("made", made), ("listed", listed), ("target", target)),
            )
        ]
    if unlisted:
        return [
            Say(
                r.release_id,
                "scaler.machines_unlisted",
                f"the backend does not list machine(s) {', '.join(unlisted)} this scaler created "
                f"over {UNLISTED_AFTER_S:g} s ago (listed without the scaler's metadata?): no "
                "machine is created for this release until the listing shows them",
                (("machines", unlisted),),
            )
        ]
    if target > have and wait_s > 0:
        return [Wait(r.release_id, wait_s)]
    reason = f"{have} of {target} running {r.image}"
    count = min(MAX_CREATES_PER_PASS, target - have, ceiling - made)
    return [Create(r.release_id, r.image, reason) for _ in range(count)]


def _trim(release_id: str, fresh: list[MachineFacts], keep: int) -> list[Action]:
    """Stop what ``fresh`` has above ``keep``, never a live machine it still needs."""
    live_left = len({m.machine_id for m in fresh if m.live})  # machines, not listings
    # Machines without a live worker first, the oldest first.
    surplus = sorted(fresh, key=lambda m: (m.live, -m.age_s))
    surplus = [m for m in surplus if m.condition is not Condition.DOUBTED]
    stops: list[Action] = []
    for m in surplus[: len(fresh) - keep]:
        if m.live:
            if live_left <= keep:
                continue  # the release needs this live one, whatever the listing says
            live_left -= 1
        stops.append(Stop(release_id, m.machine_id, "above the desired count"))
    return stops


def _retire(state: PassState, actions: list[Action]) -> list[Action]:
    current = next((r for r in state.releases if r.role is Role.CURRENT), None)
    if current is None or not any(r.role is Role.SUPERSEDED for r in state.releases):
        return []
    ready = next(
        (a.ready for a in actions if isinstance(a, Tally) and a.release_id == current.release_id), 0
    )
    # A current release that runs no machine takes nothing over: the superseded
    # ones keep claiming (no lane would otherwise take new runs).
    if current.desired == 0 or ready < current.desired:
        return []
    if state.held:
        return [Held(current.release_id)]
    return [Retire(current.release_id, ready)]
