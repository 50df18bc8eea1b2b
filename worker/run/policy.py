"""What this worker may claim on which queue: one immutable value, replaced whole.

The daemon's lane follower (``worker/daemon/lane_follower.py``) owns the
``CurrentPolicy``: it publishes a new ``ClaimPolicy`` whenever the lane
registry changes what the loops may claim. The claim loops and the runtime
only read ``CurrentPolicy.value``; what a claim teaches (another lane adopted
runs here, a machine of this lane has a play this app lacks) is told to the
holder, which publishes the next value itself. Nobody edits a field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from worker import lanes
from worker.db import engine


@dataclass(frozen=True)
class ClaimPolicy:
    """What the registry says this worker may claim, as of one refresh."""

    own_queue: str
    # This release's lane is retired (draining or drained): on every queue it
    # claims only what no other release may run; parked runs go to newer releases.
    draining: bool = False
    # The other lanes that claim: on their queues only this release's adoptees.
    claiming_queues: frozenset[str] = frozenset()
    # Runs on the own queue were adopted by another lane: the own loop skips them.
    foreign_adoptees: bool = False
    # A live machine of this lane registers a play this app lacks (a rollout of
    # mixed apps): the own loop claims past such runs from then on.
    lane_plays_differ: bool = False

    def mode(self, queue: str) -> str | None:
        """Return how this worker claims ``queue`` (None: the engine's own claim).

        A claiming release drains its own queue with the engine's claim (or,
        when another lane adopted runs there, one that skips those), adopts from
        retired queues and, on a lane that claims too, takes only its own
        adoptees; a retired (draining) one claims, on every queue, only what no
        other release may run.
        """
        if self.draining:
            return engine.CLAIM_DRAIN
        if lanes.loop_kind(queue, self.own_queue) == "own":
            own_filter = self.foreign_adoptees or self.lane_plays_differ
            return engine.CLAIM_OWN if own_filter else None
        return engine.CLAIM_MINE if queue in self.claiming_queues else engine.CLAIM_ADOPT


class CurrentPolicy:
    """The claim policy in force; each change is one assignment of a new value."""

    def __init__(self, value: ClaimPolicy) -> None:
        self.value = value

    def publish(self, value: ClaimPolicy) -> None:
        """Put ``value`` in force (the lane follower's, at a registry refresh)."""
        self.value = value

    def learned_foreign_adoptees(self) -> None:
        """An own claim met a run another lane adopted (a race the claim filter missed)."""
        if not self.value.foreign_adoptees:
            self.value = replace(self.value, foreign_adoptees=True)

    def learned_plays_differ(self) -> None:
        """A run waits for a play a live machine of this lane has and this app lacks."""
        if not self.value.lane_plays_differ:
            self.value = replace(self.value, lane_plays_differ=True)
