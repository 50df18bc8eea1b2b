"""Every branch of the lane disposition (worker/run/decide.py), without Postgres."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from worker import lanes
from worker.run.decide import Cause, LaneFacts, PlayRegistration, Seat, decide
from worker.run.decide import needs_play_registration as needs
from worker.states import Disposition

A, B, C = "rel-a", "rel-b", "rel-c"
QA, QB, QC = (lanes.queue_name_for_release(r) for r in (A, B, C))
RUN = uuid.UUID(int=7)


def facts(**kw: object) -> LaneFacts:
    base = LaneFacts(run_id=RUN, release_id=A, status="queued", play="p")
    return replace(base, **kw)  # type: ignore[arg-type]


GRACE = 600.0


def seat(
    release: str = A,
    *,
    own_loop: bool = True,
    plays: tuple[str, ...] = ("p",),
    grace_s: float = GRACE,
) -> Seat:
    queue = lanes.queue_name_for_release(release)
    return Seat(release, queue, frozenset(plays), own_loop, unknown_play_grace_s=grace_s)


PARKED = {"status": "waiting", "current_wait": {"kind": "sleep", "boundaryId": "z"}}


def test_an_own_lane_run_whose_play_this_app_has_is_owned() -> None:
    decision = decide(facts(), seat())
    assert (decision.disposition, decision.cause) == (Disposition.OWN, Cause.OWN_LANE)
    assert decision.executes
    assert not needs(facts(), seat())


def test_an_own_loop_that_meets_another_lane_s_run_refuses_it_by_the_guard() -> None:
    decision = decide(facts(release_id=B), seat(A))
    assert (decision.disposition, decision.cause) == (Disposition.REFUSE, Cause.LANE_GUARD)
    assert B in (decision.reason or "")
    assert not decision.executes


@pytest.mark.parametrize("own_loop", [True, False])
def test_a_run_adopted_by_a_claiming_lane_is_left_to_its_adopter(own_loop: bool) -> None:
    run = facts(adopted_release_id=B, adopted_queue=QB, adopter_claiming=True, **PARKED)
    decision = decide(run, seat(A if own_loop else C, own_loop=own_loop))
    assert (decision.disposition, decision.cause) == (Disposition.DEFER, Cause.ADOPTED_ELSEWHERE)
    assert decision.delay_s == 0
    assert decision.reason == f"adopted by {B}"


def test_the_own_loop_leaves_an_adoptee_even_when_its_adopter_is_retired() -> None:
    run = facts(adopted_release_id=B, adopted_queue=QB, adopter_claiming=False)
    assert decide(run, seat(A)).cause == Cause.ADOPTED_ELSEWHERE


def test_the_adopter_itself_owns_its_adoptee_on_the_retired_queue() -> None:
    run = facts(adopted_release_id=B, adopted_queue=QB, adopter_claiming=True, **PARKED)
    decision = decide(run, seat(B, own_loop=False))
    assert (decision.disposition, decision.cause) == (Disposition.OWN, Cause.OWN_LANE)


def test_a_retired_adopter_s_adoptee_goes_to_a_newer_claiming_release_when_parked() -> None:
    run = facts(adopted_release_id=B, adopted_queue=QB, adopter_claiming=False, **PARKED)
    decision = decide(run, seat(C, own_loop=False))
    assert decision.disposition == Disposition.ADOPT
    assert decision.adopted_from == B


def test_a_parked_run_of_a_retired_lane_is_adopted() -> None:
    decision = decide(facts(**PARKED), seat(B, own_loop=False))
    assert (decision.disposition, decision.cause) == (Disposition.ADOPT, Cause.ADOPTABLE)
    assert decision.adopted_from == A
    assert decision.executes


def test_a_run_parked_in_an_unknown_wait_kind_is_not_adoptable() -> None:
    run = facts(status="waiting", current_wait={"kind": "detached_runner"})
    assert decide(run, seat(B, own_loop=False)).cause == Cause.NOT_PARKED


def test_a_retired_lane_s_run_that_is_not_parked_is_deferred_30_s() -> None:
    decision = decide(facts(status="retrying"), seat(B, own_loop=False))
    assert (decision.disposition, decision.cause) == (Disposition.DEFER, Cause.NOT_PARKED)
    assert decision.delay_s == lanes.LANE_ADOPTION_DEFER_SECONDS
    assert decision.reason


def test_a_claiming_lane_s_run_met_on_a_continuation_loop_is_refused() -> None:
    decision = decide(facts(lane_claiming=True, **PARKED), seat(B, own_loop=False))
    assert (decision.disposition, decision.cause) == (Disposition.REFUSE, Cause.LANE_CLAIMS)


@pytest.mark.parametrize("parked", [True, False])
def test_a_continuation_run_whose_play_this_app_lacks_is_deferred(parked: bool) -> None:
    run = facts(**PARKED) if parked else facts(adopted_release_id=B, adopted_queue=QB)
    own = seat(B, own_loop=False, plays=("other",))
    decision = decide(run, own)
    assert (decision.disposition, decision.cause) == (Disposition.DEFER, Cause.PLAY_NOT_HERE)
    assert decision.delay_s == lanes.LANE_ADOPTION_DEFER_SECONDS
    assert "'p'" in (decision.reason or "")
    assert not needs(run, own)


def test_an_own_lane_play_a_live_machine_registers_is_left_to_it_at_once() -> None:
    own = seat(plays=("other",))
    assert needs(facts(), own)
    decision = decide(facts(), own, PlayRegistration(live=True, ever=True))
    assert (decision.disposition, decision.cause) == (Disposition.DEFER, Cause.PLAY_ON_LIVE_MACHINE)
    assert decision.delay_s == 0


def test_an_own_lane_play_only_a_stopped_machine_registered_is_deferred_30_s() -> None:
    decision = decide(facts(), seat(plays=()), PlayRegistration(live=False, ever=True))
    assert decision.cause == Cause.PLAY_ON_STOPPED_MACHINE
    assert decision.delay_s == lanes.LANE_ADOPTION_DEFER_SECONDS
    assert "start one" in (decision.reason or "")


@pytest.mark.parametrize("deferred_s", [0.0, 30.0, GRACE - 0.001])
def test_an_own_lane_play_no_machine_ever_registered_is_put_back_through_the_grace(
    deferred_s: float,
) -> None:
    """A hotfix adding a play: the lane's old machines wait for a new one, spending nothing."""
    unknown = PlayRegistration(live=False, ever=False, deferred_s=deferred_s)
    decision = decide(facts(), seat(plays=("other",)), unknown)
    assert (decision.disposition, decision.cause) == (Disposition.DEFER, Cause.PLAY_AWAITED)
    assert decision.delay_s == lanes.LANE_ADOPTION_DEFER_SECONDS  # counted: it has a streak
    assert "LANE_WORKER_UNKNOWN_PLAY_GRACE" in (decision.reason or "")
    assert "600 s" in (decision.reason or "")


@pytest.mark.parametrize(("grace_s", "deferred_s"), [(GRACE, GRACE), (GRACE, 5000.0), (0.0, 0.0)])
def test_an_own_lane_play_no_machine_ever_registered_fails_visibly_past_the_grace(
    grace_s: float, deferred_s: float
) -> None:
    unknown = PlayRegistration(live=False, ever=False, deferred_s=deferred_s)
    decision = decide(facts(), seat(plays=(), grace_s=grace_s), unknown)
    assert (decision.disposition, decision.cause) == (Disposition.OWN, Cause.PLAY_UNKNOWN)


def test_an_own_lane_decision_on_a_missing_play_needs_its_registration() -> None:
    with pytest.raises(ValueError, match="registration"):
        decide(facts(), seat(plays=()))


def test_the_adopter_race_comes_before_the_play_check() -> None:
    run = facts(adopted_release_id=B, adopted_queue=QB)
    own = seat(A, plays=())
    assert not needs(run, own)
    assert decide(run, own).cause == Cause.ADOPTED_ELSEWHERE
