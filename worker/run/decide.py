"""The lane disposition of one claimed run: Own, Adopt, Defer or Refuse, decided once.

Pure: from the run's lane facts (what the store says of its lane and its
adopter), the worker's seat (its release, its own queue, its plays) and, only
for a run on its own lane whose play this app lacks, where else that play is
registered. ``worker/lanes.py`` holds the rules the TypeScript app shares
(``resolve_lane_disposition``); this module folds in what only the worker
knows: the adopter race, the plays a machine registers, the lane guard.

The claim statements (``sql/engine/own_claim.sql`` for the own loop,
``claim_next_v2`` over ``claim_v1.sql``'s filters for every other loop) skip the
runs this would put back at once (adopted elsewhere, a play no machine of this
app registers) and begin the ones it certainly owns, so those branches decide
races; they must agree with it (``tests/integration/test_claim_rule.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from worker import checkpoint, lanes
from worker.errors import LaneMismatchError
from worker.states import Disposition, RunStatus


@dataclass(frozen=True)
class LaneFacts:
    """What the store says of one claimed run and its lane (the ``lane_state`` row)."""

    run_id: uuid.UUID
    release_id: str  # the release the run was stamped with (its lane)
    status: str
    play: str
    current_wait: dict[str, Any] | None = None
    adopted_release_id: str | None = None
    adopted_queue: str | None = None
    lane_claiming: bool = False  # the stamped lane still claims
    adopter_claiming: bool = False  # the adopter's lane still claims

    @property
    def effective_release_id(self) -> str:
        """The release whose code runs it now: its adopter once adopted."""
        return self.adopted_release_id or self.release_id

    @property
    def parked_in_adoptable_wait(self) -> bool:
        kind = (self.current_wait or {}).get("kind")
        return self.status == RunStatus.WAITING and kind in checkpoint.KNOWN_BOUNDARY_KINDS


@dataclass(frozen=True)
class Seat:
    """Who decides: one worker of ``release_id``, on one of its loops."""

    release_id: str
    own_queue: str
    plays: frozenset[str]
    own_loop: bool  # claimed on its own queue (else a retired lane's :continuations)
    # LANE_WORKER_UNKNOWN_PLAY_GRACE: how long an own-lane run whose play no machine of
    # the lane ever registered is put back before it fails as unknown (0: at once).
    unknown_play_grace_s: float


@dataclass(frozen=True)
class PlayRegistration:
    """Whether machines of this worker's lane register a play (a live one now, any ever),
    and how long the run has been put back in a row (its deferral streak, seconds)."""

    live: bool
    ever: bool
    deferred_s: float = 0.0


class Cause(StrEnum):
    """Why a run got its disposition (logs, metrics and the flags a loop keeps)."""

    OWN_LANE = "own_lane"
    PLAY_UNKNOWN = "play_unknown"  # own lane, no machine of it ever registered the play
    PLAY_AWAITED = "play_awaited"  # the same, within the grace: a rollout may bring it
    ADOPTABLE = "adoptable"
    LANE_GUARD = "lane_guard"  # own loop met a run of another lane: misconfiguration
    ADOPTED_ELSEWHERE = "adopted_elsewhere"  # its adopter may still run it
    PLAY_ON_LIVE_MACHINE = "play_on_live_machine"  # another machine of this lane runs it
    PLAY_ON_STOPPED_MACHINE = "play_on_stopped_machine"
    NOT_PARKED = "not_parked"  # a retired lane's run that only its own release may run
    PLAY_NOT_HERE = "play_not_here"  # adoptable or ours, but this app lacks the play
    LANE_CLAIMS = "lane_claims"  # its lane still claims: no other release may take it


@dataclass(frozen=True)
class Decision:
    """One claimed run's disposition, why, and (for a put-back) when it is due again."""

    disposition: Disposition
    cause: Cause
    delay_s: float = 0.0
    reason: str | None = None  # recorded on the put-back attempt and logged
    adopted_from: str | None = None  # Adopt: the retired release it is taken from

    @property
    def executes(self) -> bool:
        return self.disposition in (Disposition.OWN, Disposition.ADOPT)


def needs_play_registration(facts: LaneFacts, seat: Seat) -> bool:
    """Tell whether ``decide`` needs to know where else the run's play is registered."""
    return seat.own_loop and facts.play not in seat.plays and not _left_to_adopter(facts, seat)


def decide(facts: LaneFacts, seat: Seat, registration: PlayRegistration | None = None) -> Decision:
    """Decide what ``seat`` does with the claimed run ``facts`` describes.

    ``registration`` is required when ``needs_play_registration`` says so.
    """
    run_id = str(facts.run_id)
    if seat.own_loop:
        try:
            # The stamped release: this queue is that release's lane.
            lanes.assert_release_lane_matches(run_id, facts.release_id, seat.release_id)
        except LaneMismatchError as exc:
            return Decision(Disposition.REFUSE, Cause.LANE_GUARD, reason=str(exc))
    if _left_to_adopter(facts, seat):
        # Newer code than the stamped lane's ran it already: a third release must
        # not take it, and its own lane must leave it to the adopter.
        return Decision(
            Disposition.DEFER,
            Cause.ADOPTED_ELSEWHERE,
            reason=f"adopted by {facts.adopted_release_id}",
        )
    if seat.own_loop:
        if facts.play in seat.plays:
            return Decision(Disposition.OWN, Cause.OWN_LANE)
        return _own_play_elsewhere(facts, seat, registration)
    rule = lanes.resolve_lane_disposition(
        run_id=run_id,
        run_release_id=facts.effective_release_id,
        worker_release_id=seat.release_id,
        # The effective release's lane: an adopted run belongs to its adopter.
        lane_claiming=facts.adopter_claiming if facts.adopted_release_id else facts.lane_claiming,
        parked_in_adoptable_wait=facts.parked_in_adoptable_wait,
    )
    if isinstance(rule, lanes.Refuse):
        return Decision(Disposition.REFUSE, Cause.LANE_CLAIMS)
    if isinstance(rule, lanes.Defer):
        return Decision(Disposition.DEFER, Cause.NOT_PARKED, rule.delay_seconds, rule.reason)
    if facts.play not in seat.plays:
        # Running it would fail it for good here, though its own release, another
        # machine of this one or a release that registers the play can run it.
        return Decision(
            Disposition.DEFER,
            Cause.PLAY_NOT_HERE,
            lanes.LANE_ADOPTION_DEFER_SECONDS,
            f"play {facts.play!r} of run {run_id} (release {facts.effective_release_id}) is "
            f"not registered in this app of release {seat.release_id}, which cannot run it",
        )
    if isinstance(rule, lanes.Adopt):
        return Decision(Disposition.ADOPT, Cause.ADOPTABLE, adopted_from=rule.adopted_release_id)
    return Decision(Disposition.OWN, Cause.OWN_LANE)


def _left_to_adopter(facts: LaneFacts, seat: Seat) -> bool:
    return (
        facts.adopted_release_id is not None
        and facts.adopted_queue != seat.own_queue
        and (seat.own_loop or facts.adopter_claiming)
    )


def _own_play_elsewhere(
    facts: LaneFacts, seat: Seat, registration: PlayRegistration | None
) -> Decision:
    """An own-lane run whose play this app lacks (a rollout of mixed apps, or a typo).

    A live machine of this lane registers it: leave it to that machine at once.
    Only machines that stopped did: put it back 30 s, counted, so the report
    names it. None ever did: a rollout may be bringing the play (a hotfix reaches
    the lane's machines one at a time), so put it back 30 s at a time through the
    seat's grace; past it the play is unknown to the release, and the run fails
    visibly when executed.
    """
    if registration is None:
        raise ValueError("decide needs the play's registration for this run")
    here = (
        f"play {facts.play!r} of run {facts.run_id} is not registered in this app of release "
        f"{seat.release_id}"
    )
    if registration.live:
        return Decision(
            Disposition.DEFER,
            Cause.PLAY_ON_LIVE_MACHINE,
            reason=f"{here}, but a live machine of it registers it",
        )
    if registration.ever:
        return Decision(
            Disposition.DEFER,
            Cause.PLAY_ON_STOPPED_MACHINE,
            lanes.LANE_ADOPTION_DEFER_SECONDS,
            f"{here}, and no live machine of it registers it now (one that stopped did): start one",
        )
    if registration.deferred_s < seat.unknown_play_grace_s:
        return Decision(
            Disposition.DEFER,
            Cause.PLAY_AWAITED,
            lanes.LANE_ADOPTION_DEFER_SECONDS,
            f"{here}, and no machine of it ever did: put back until one that registers it "
            f"starts, for up to {seat.unknown_play_grace_s:g} s (LANE_WORKER_UNKNOWN_PLAY_GRACE), "
            "then failed as an unknown play",
        )
    return Decision(Disposition.OWN, Cause.PLAY_UNKNOWN)
