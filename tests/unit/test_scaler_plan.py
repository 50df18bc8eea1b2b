"""The scaler's pure plan (worker/scaler/plan.py): what a pass does, case by case.

Each case is a state (a release, its machines as the pass believes them, the
time) and the actions the plan must give, in order; no database, no backend,
no clock. The integration tests (tests/integration/test_scaler_reconcile.py)
run the same rules through the real registry and the executor.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from worker.db.store.rows import Deployment, ScalerCreate
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
from worker.scaler.backend import FAILED, STARTED, STOPPED, Machine
from worker.scaler.observe import CREATE_MEMORY_S, Watch, observe
from worker.scaler.plan import (
    DEAD_AFTER_S,
    MADE_SURPLUS,
    MAX_CREATES_PER_PASS,
    MAX_RESTART_BACKOFF_S,
    PAUSED_WORD,
    UNLISTED_AFTER_S,
    Condition,
    MachineFacts,
    PassState,
    ReleaseState,
    Role,
    Stray,
    Unlisted,
    plan,
)

NOW = 5000.0
DEADLINE_S = 75.0
R = "rel"

RUN, DOUBT, STOPPING, DOWN, MISFILED = (Condition.RUNNING, Condition.DOUBTED,
                                        Condition.STOPPING, Condition.DOWN,
                                        Condition.MISFILED)  # fmt: skip


def up(machine_id: str, *, live: bool = True, image: str = "img", **kw: object) -> MachineFacts:
    """A machine listed running; live and ready unless told."""
    ready = bool(kw.pop("ready", live))
    return replace(MachineFacts(machine_id, image, RUN, live=live, ready=ready,
                                listed_running=True), **kw)  # type: ignore[arg-type]  # fmt: skip


def release(*machines: MachineFacts, role: Role = Role.CURRENT, desired: int = 1,
            **kw: object) -> ReleaseState:  # fmt: skip
    return replace(ReleaseState(R, "img", role, desired, machines=machines), **kw)  # type: ignore[arg-type]


def brief(action: Action) -> str:
    """An action in a few words (the tally apart: ``tally`` checks it)."""
    match action:
        case Create():
            return f"create {action.image}"
        case Stop():
            return f"stop {action.machine_id}"
        case Destroy():
            verb = "replace" if action.replaced else "destroy"
            return f"{verb} {action.machine_id}" + (" after a stop" if action.stop_first else "")
        case Backoff():
            return f"backoff {action.image} x{action.died} {action.until - NOW:g} s"
        case Recovered():
            return f"recovered {action.image}"
        case Wait():
            return f"wait {action.wait_s:g} s"
        case Say():
            return f"say {action.event or action.error}"
        case Retire():
            return f"retire superseded by {action.release_id}"
        case Held():
            return f"held: {action.release_id} retires nothing"
        case Note():
            return f"note {action.text}"
        case Tally():
            return "tally"


def planned(*releases: ReleaseState, strays: tuple[Stray, ...] = ()) -> list[str]:
    state = PassState(NOW, DEADLINE_S, releases, strays)
    return [brief(a) for a in plan(state) if not isinstance(a, Tally)]


def tally(r: ReleaseState) -> Tally:
    [counted] = [a for a in plan(PassState(NOW, DEADLINE_S, (r,))) if isinstance(a, Tally)]
    return counted


CASES = [
    # The current release at its count, up and down.
    ("nothing to do", release(up("m1")), ["recovered img"]),
    ("a release of two with none", release(desired=2), ["create img", "create img"]),
    ("a big count, a few per pass", release(desired=10), ["create img"] * MAX_CREATES_PER_PASS),
    (
        "scaled to none: its machine stops",
        release(up("m1"), desired=0),
        ["recovered img", "stop m1"],
    ),
    (
        "surplus: without a live worker first",
        release(up("a1"), up("a2", live=False, age_s=5.0), up("a3", live=False, age_s=9.0)),
        ["recovered img", "stop a3", "stop a2"],
    ),
    (
        "surplus of live ones: the oldest goes",
        release(up("a1", age_s=10.0), up("a2", age_s=20.0)),
        ["recovered img", "stop a2"],
    ),
    ("the only live machine, given twice, stays", release(up("m1"), up("m1")), ["recovered img"]),
    (
        "a superseded release's twins go, never its live one",
        release(
            up("a1", ready=False),
            up("a2", live=False, age_s=5.0),
            up("a3", live=False, age_s=5.0),
            role=Role.SUPERSEDED,
        ),
        ["stop a2", "stop a3"],
    ),
    # Dead machines.
    (
        "no live worker for a minute: replaced",
        release(up("m1", live=False, not_live_s=DEAD_AFTER_S + 1)),
        ["replace m1 after a stop", "create img"],
    ),
    (
        "no live worker, watched briefly: left",
        release(up("m1", live=False, not_live_s=DEAD_AFTER_S / 2)),
        [],
    ),
    (
        "no live worker, just made: left",
        release(up("m1", live=False, age_s=5.0, not_live_s=DEAD_AFTER_S + 1)),
        [],
    ),
    (
        "a drained release's dead machine is stopped, not replaced",
        release(up("m1", live=False, not_live_s=DEAD_AFTER_S + 1), role=Role.DRAINED),
        ["stop m1"],
    ),
    # Machines that exited.
    (
        "exited with an error: backs off",
        release(MachineFacts("m1", "img", DOWN, exit_code=2)),
        ["backoff img x1 2 s", "destroy m1", "wait 2 s"],
    ),
    (
        "the fourth death in a row",
        release(MachineFacts("m1", "img", DOWN, exit_code=2), deaths={"img": 3}),
        ["backoff img x4 16 s", "destroy m1", "wait 16 s"],
    ),
    (
        "deaths back off at most five minutes",
        release(MachineFacts("m1", "img", DOWN, exit_code=2), deaths={"img": 20}),
        [
            f"backoff img x21 {MAX_RESTART_BACKOFF_S:g} s",
            "destroy m1",
            f"wait {MAX_RESTART_BACKOFF_S:g} s",
        ],
    ),
    (
        "stopped by someone: not a death",
        release(MachineFacts("m1", "img", DOWN, exit_code=143, stop_known=True)),
        ["destroy m1", "create img"],
    ),
    (
        "exited cleanly: not a death",
        release(MachineFacts("m1", "img", DOWN, exit_code=0)),
        ["destroy m1", "create img"],
    ),
    (
        "an older image's death does not hold the new one",
        release(MachineFacts("m1", "img:old", DOWN, exit_code=2)),
        ["backoff img:old x1 2 s", "destroy m1", "create img"],
    ),
    ("backing off from an earlier death", release(not_before=NOW + 30), ["wait 30 s"]),
    # A dead machine the backend will not remove is listed pass after pass (attack34 A1).
    (
        "a crash already noted is not a new death: its wait is not doubled",
        release(
            MachineFacts("m1", "img", DOWN, exit_code=137, death_noted=True),
            deaths={"img": 1},
            not_before=NOW + 1,
        ),
        ["destroy m1", "wait 1 s"],
    ),
    (
        "a crash already noted, its wait over: replaced though its removal is refused",
        release(
            MachineFacts("m1", "img", DOWN, exit_code=137, death_noted=True),
            deaths={"img": 1},
            not_before=NOW - 1,
        ),
        ["destroy m1", "create img"],
    ),
    (
        "a ready machine ends the backoff",
        release(up("m1"), desired=2, not_before=NOW + 30),
        ["recovered img", "create img"],
    ),
    # Stopping machines.
    (
        "stopping within its deadline: left to drain",
        release(
            MachineFacts("m1", "img", STOPPING, stopping_s=DEADLINE_S - 1, stop_known=True),
            desired=0,
        ),
        [],
    ),
    (
        "stuck stopping: destroyed",
        release(
            MachineFacts("m1", "img", STOPPING, stopping_s=DEADLINE_S + 1, stop_known=True),
            desired=0,
        ),
        ["destroy m1"],
    ),
    (
        "stuck stopping, listed running still: stopped and destroyed",
        release(
            MachineFacts(
                "m1",
                "img",
                STOPPING,
                stopping_s=DEADLINE_S + 1,
                stop_known=True,
                listed_running=True,
            ),
            desired=0,
        ),
        ["destroy m1 after a stop"],
    ),
    (
        "listed stopping while its worker beats and nobody stopped it",
        release(
            MachineFacts("m1", "img", STOPPING, stopping_s=DEADLINE_S + 1, live=True), desired=0
        ),
        ["say scaler.stopping_with_live_worker"],
    ),
    (
        "a stopping machine is not running: one is created",
        release(MachineFacts("m1", "img", STOPPING, stopping_s=1.0, stop_known=True)),
        ["create img"],
    ),
    # Doubted listings: counted running, never acted on.
    (
        "doubted: counted, not replaced",
        release(MachineFacts("m1", "img", DOUBT, live=True, ready=True, exit_code=1)),
        ["recovered img"],
    ),
    (
        "doubted surplus is not trimmed",
        release(MachineFacts("m1", "img", DOUBT, live=True, ready=True), up("m2"), desired=0),
        ["recovered img", "stop m2"],
    ),
    (
        "doubted on a drained release is not stopped",
        release(MachineFacts("m1", "img", DOUBT, live=True), role=Role.DRAINED),
        [],
    ),
    # Retired releases.
    (
        "a draining release keeps one, even deployed with none",
        release(up("m1", ready=False), role=Role.DRAINING, desired=0),
        [],
    ),
    (
        "a draining release's twin goes",
        release(
            up("m1", ready=False), up("m2", live=False, age_s=5.0), role=Role.DRAINING, desired=0
        ),
        ["stop m2"],
    ),
    (
        "a stranded draining release gets one",
        release(role=Role.DRAINING, desired=0, stranded=True),
        ["create img"],
    ),
    (
        "parked runs that wait for the current release (scaled to 0) boot nothing old",
        release(role=Role.DRAINING, desired=1, stranded=True, waits_for_current=True),
        [f"note {PAUSED_WORD}"],
    ),
    (
        "a draining machine still running keeps draining while the current is scaled to 0",
        release(up("m1", ready=False), role=Role.DRAINING, desired=2, waits_for_current=True),
        [f"note {PAUSED_WORD}"],
    ),
    (
        "a drained release's machines stop",
        release(up("m1", ready=False), up("m2", live=False), role=Role.DRAINED),
        ["stop m1", "stop m2"],
    ),
    # Images.
    (
        "a new image: made first, the old kept serving",
        release(up("m1", image="img:old")),
        ["create img"],
    ),
    (
        "a new image ready: the old stops",
        release(up("m1", image="img:old"), up("m2")),
        ["recovered img", "stop m1"],
    ),
    (
        "a misreported image is said, and counted as made",
        release(up("m1", misreported=True)),
        ["say scaler.image_misreported", "recovered img"],
    ),
    # Misfiled: listed as this release's, another release's (attack34 A3).
    (
        "misfiled: neither counted nor acted on, and said",
        release(MachineFacts("x1", "img", MISFILED, listed_running=True)),
        ["say scaler.release_misreported", "create img"],
    ),
    (
        "a superseded release at its count does not trim a misfiled machine",
        release(
            up("a1"),
            MachineFacts("x1", "img", MISFILED, listed_running=True, age_s=5.0),
            role=Role.SUPERSEDED,
        ),
        ["say scaler.release_misreported", "recovered img"],
    ),
    (
        "a drained release does not stop a misfiled machine",
        release(
            up("a1", ready=False),
            MachineFacts("x1", "img", MISFILED, listed_running=True),
            role=Role.DRAINED,
        ),
        ["say scaler.release_misreported", "stop a1"],
    ),
    (
        "a misfiled machine listed failed is not removed",
        release(MachineFacts("x1", "img", MISFILED, exit_code=137), desired=0),
        ["say scaler.release_misreported"],
    ),
    # What the scaler created and the listing does not show.
    (
        "created, not listed yet: counted",
        release(unlisted=(Unlisted("new-1", "img", NOW - 1),)),
        [],
    ),
    (
        "created, not listed for long: said, no create",
        release(desired=2, unlisted=(Unlisted("new-1", "img", NOW - UNLISTED_AFTER_S - 1),)),
        ["say scaler.machines_unlisted"],
    ),
    (
        "created on another image, not listed: not counted",
        release(unlisted=(Unlisted("new-1", "img:old", NOW - 1),)),
        ["create img"],
    ),
    (
        "made and running elsewhere up to the bound: no create",
        release(desired=1, made_running=1 + MADE_SURPLUS),
        ["say scaler.create_bound"],
    ),
    (
        "made and running elsewhere below the bound: up to it",
        release(desired=3, made_running=MADE_SURPLUS + 1),
        ["create img", "create img"],
    ),
]


@pytest.mark.parametrize(("state", "expected"), [pytest.param(s, e, id=i) for i, s, e in CASES])
def test_the_plan_of_one_release(state: ReleaseState, expected: list[str]) -> None:
    assert planned(state) == expected


@pytest.mark.parametrize(
    ("desired", "current_ready", "superseded", "retired"),
    [
        (1, 1, True, True),
        (2, 1, True, False),  # not its count ready yet
        (0, 0, True, False),  # a current release that runs nothing takes nothing over
        (1, 1, False, False),  # nothing to retire
    ],
)
def test_what_the_current_release_supersedes_is_retired_once_it_is_ready(
    desired: int, current_ready: int, superseded: bool, retired: bool
) -> None:
    current = ReleaseState("cur", "img", Role.CURRENT, desired,
                           machines=tuple(up(f"c{i}") for i in range(current_ready)))  # fmt: skip
    others = (release(up("p1"), role=Role.SUPERSEDED),) if superseded else ()
    actions = planned(current, *others)
    assert ("retire superseded by cur" in actions) == retired, actions


def test_machines_of_a_release_not_in_the_registry_are_left_alone_and_shown() -> None:
    actions = plan(PassState(NOW, DEADLINE_S, strays=(Stray("ghost", 2),)))
    assert actions == [Tally("ghost", running=2),
                       Say("ghost", None, "not in the registry: left alone")]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            release(
                up("m1"),
                up("m2", image="old"),
                MachineFacts("m3", "old", STOPPING, stop_known=True),
            ),
            Tally(R, target=1, running=2, ready=1, outdated=2, stopping=1),
        ),
        (release(role=Role.DRAINING, desired=0, stranded=True), Tally(R, target=1)),
        (release(up("m1"), role=Role.DRAINED), Tally(R, target=0, running=1, ready=1)),
        (
            release(desired=2, unlisted=(Unlisted("n1", "img", NOW - UNLISTED_AFTER_S - 1),)),
            Tally(R, target=2, unlisted=1),
        ),
        (
            release(MachineFacts("m1", "img", DOUBT, live=True, ready=True)),
            Tally(R, target=1, running=1, ready=1),
        ),
        (
            release(up("m1"), MachineFacts("x1", "img", MISFILED, listed_running=True)),
            Tally(R, target=1, running=1, ready=1),
        ),
    ],
)
def test_what_the_pass_counts(state: ReleaseState, expected: Tally) -> None:
    assert tally(state) == expected


def test_a_death_says_why_and_where_to_look() -> None:
    refused = MachineFacts("m1", "img", DOWN, exit_code=78, logs="fly logs -i m1")
    [backoff] = [a for a in plan(PassState(NOW, DEADLINE_S, (release(refused),)))
                 if isinstance(a, Backoff)]  # fmt: skip
    assert backoff.current
    why = "machine m1 exited 78 (its worker refused the configuration; see fly logs -i m1)"
    assert backoff.why == why
    assert backoff.machine_id == "m1"  # noted once: the executor remembers it


def test_the_plan_is_pure() -> None:
    """The same state gives the same actions, and the state is not changed."""
    state = PassState(NOW, DEADLINE_S, tuple(s for _, s, _ in CASES[:12]))
    before = repr(state)
    assert plan(state) == plan(state)
    assert repr(state) == before


# The adapter: the listing as the plan reads it.


def deployment(desired: int = 1, live: tuple[str, ...] = ("m1",), release_id: str = R,
               role: str = "current") -> Deployment:  # fmt: skip
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Deployment(release_id, f"q-{release_id}", "img", desired, role, at, "t", None, None,
                      "claiming", len(live), len(live), list(live), list(live), {})  # fmt: skip


def listed(machine_id: str, state: str = STARTED, image: str = "img") -> Machine:
    return Machine(machine_id, R, image, state, age_s=1000.0)


def observed(watch: Watch, listing: list[Machine], d: Deployment | None = None) -> list[str]:
    state, _ = observe(watch, [d or deployment()], {}, listing, now=NOW,
                       stop_deadline_s=DEADLINE_S, where_logs=str)  # fmt: skip
    return [brief(a) for a in plan(state) if not isinstance(a, Tally)]


def test_a_machine_listed_twice_is_one_machine_and_the_last_live_one_stays() -> None:
    assert observed(Watch(), [listed("m1"), listed("m1", STOPPED)]) == ["recovered img"]


def test_one_stale_listing_of_a_machine_whose_worker_beats_is_doubted_the_second_believed() -> None:
    watch = Watch()
    assert observed(watch, [listed("m1", FAILED)]) == ["recovered img"]
    assert observed(watch, [listed("m1", FAILED)]) == ["destroy m1", "create img"]


def test_a_machine_this_scaler_made_counts_as_on_its_image_whatever_the_listing_says() -> None:
    watch = Watch(made={"m1": (R, "img")})
    assert observed(watch, [listed("m1", image="img@sha256:0")]) == [
        "say scaler.image_misreported",
        "recovered img",
    ]


def test_a_stop_sent_while_the_machine_is_listed_running_is_not_sent_again() -> None:
    watch = Watch(stop_sent={"m1": NOW - 10})
    assert observed(watch, [listed("m1")], deployment(desired=0)) == []


def test_the_dead_clock_starts_when_the_scaler_first_sees_no_live_worker() -> None:
    watch = Watch()
    d = deployment(live=())
    assert observed(watch, [listed("m1")], d) == []
    assert watch.not_live_since == {"m1": NOW}


def test_a_crash_is_noted_once_per_machine_while_it_is_listed() -> None:
    watch = Watch()
    crashed = Machine("m1", R, "img", FAILED, age_s=1000.0, exit_code=137)
    assert observed(watch, [crashed], deployment(live=())) == [
        "backoff img x1 2 s",
        "destroy m1",
        "wait 2 s",
    ]
    watch.died[R, "img"], watch.not_before[R, "img"] = 1, NOW - 1  # as the executor kept it
    watch.death_noted.add("m1")
    assert observed(watch, [crashed], deployment(live=())) == ["destroy m1", "create img"]
    observed(watch, [], deployment(live=()))
    assert watch.death_noted == set()  # forgotten once unlisted


def test_a_machine_another_release_s_worker_beats_on_is_misfiled() -> None:
    """Listed as R's, while the worker on it is another release's: R neither counts nor
    watches it (attack34 A3); a machine both releases' workers beat on stays R's."""
    watch = Watch()
    other = deployment(release_id="other", role="previous", live=("m1", "m2"))
    mine = deployment(live=("m2",))
    state, acted_on = observe(watch, [mine, other], {}, [listed("m1"), listed("m2")], now=NOW,
                              stop_deadline_s=DEADLINE_S, where_logs=str)  # fmt: skip
    [r, _] = state.releases
    assert [(m.machine_id, m.condition) for m in r.machines] == [("m1", MISFILED), ("m2", RUN)]
    assert "m1" not in acted_on


def test_a_machine_this_scaler_made_for_another_release_is_misfiled_before_it_beats() -> None:
    watch = Watch(made={"m1": ("other", "img")})
    d = deployment(live=())
    assert observed(watch, [listed("m1")], d) == ["say scaler.release_misreported", "create img"]
    assert watch.not_live_since == {}  # not watched as R's


def test_the_store_s_creates_are_remembered_as_this_scaler_s() -> None:
    """What a scaler becoming active loads (``scaler_creates``): an unlisted create counts
    and, past UNLISTED_AFTER_S, holds the release's creates; a listed one counts as made;
    one never answered (no machine id) counts, and is forgotten before it would hold them."""
    watch = Watch()
    watch.remember([
        ScalerCreate("k1", R, "img", "m1", listed=False, age_s=UNLISTED_AFTER_S + 1),
        ScalerCreate("k2", R, "img", "m2", listed=True, age_s=5.0),
        ScalerCreate("k3", R, "img", None, listed=False, age_s=1.0),
    ], NOW)  # fmt: skip
    assert watch.made == {"m1": (R, "img"), "m2": (R, "img")}
    d = deployment(desired=3, live=())
    assert observed(watch, [], d) == ["say scaler.machines_unlisted"]
    assert watch.take_seen() == (set(), {"m2"})  # m2 is no longer listed: the store is told
    state, _ = observe(watch, [d], {}, [], now=NOW + UNLISTED_AFTER_S, stop_deadline_s=DEADLINE_S,
                       where_logs=str)  # fmt: skip
    assert [u.machine_id for u in state.releases[0].unlisted] == ["m1"]  # k3 forgotten


def test_a_create_never_listed_is_forgotten_after_the_create_memory() -> None:
    watch = Watch(created={"m1": (R, "img", NOW - CREATE_MEMORY_S - 1)}, made={"m1": (R, "img")})
    assert observed(watch, [], deployment(desired=1, live=())) == ["create img"]
    assert (watch.created, watch.made, watch.take_seen()) == ({}, {}, (set(), {"m1"}))


def test_a_created_machine_listed_is_told_to_the_store_once() -> None:
    watch = Watch(created={"m1": (R, "img", NOW - 1)}, made={"m1": (R, "img")})
    observed(watch, [listed("m1")])
    assert watch.take_seen() == ({"m1"}, set())
    observed(watch, [listed("m1")])
    assert watch.take_seen() == (set(), set())


def test_a_held_registry_retires_nothing_and_still_replaces_and_stops() -> None:
    """`releases hold`: the ready current release retires nothing it supersedes; a dead
    machine is still replaced and a drained release's machines still stop."""
    current = ReleaseState("cur", "img", Role.CURRENT, 2,
                           machines=(up("c1"), up("c2")))  # fmt: skip
    superseded = replace(release(up("p1"), role=Role.SUPERSEDED), release_id="prev")
    dead = replace(
        release(up("d1", live=False, not_live_s=600.0), role=Role.DRAINING, stranded=True),
        release_id="drn",
    )
    drained = replace(release(up("x1", ready=False), role=Role.DRAINED), release_id="old")
    state = PassState(NOW, DEADLINE_S, (current, superseded, dead, drained), held=True)
    actions = [brief(a) for a in plan(state) if not isinstance(a, Tally)]
    assert "held: cur retires nothing" in actions
    assert not any(a.startswith("retire") for a in actions), actions
    assert "stop x1" in actions  # drained: its machines go
    assert any(a.startswith("replace d1") or a == "create img" for a in actions), actions
    unheld = [brief(a) for a in plan(replace(state, held=False)) if not isinstance(a, Tally)]
    assert "retire superseded by cur" in unheld
