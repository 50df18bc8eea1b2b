"""Whether a claim loop can claim: its failed claims in a row, since when, and why.

A loop whose claims keep failing (a claim function an older build replaced, a
revoked permission, a broken schema, a database away) leaves its lane silently
dead: it backs off and tries again for ever. Readiness, the worker's heartbeat
row (the lanes page, ``lanes --json``) and ``/metrics`` read this verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker.config.dburl import mask_secrets

# A loop counts as not claiming once its claims have failed this long, at least
# this many times in a row, with no good claim between (one transient failure, or
# one failure before the loop waits long for a free slot, never flips it). The
# backoff (1, 2, 4, 8, 15 s) makes that 5 failures by 20 s: readiness turns
# false within 30 s of the first failure.
FAILING_AFTER_S = 20.0
FAILING_AFTER_CLAIMS = 3
# What is kept of the error: one line, this many characters, secrets masked.
REASON_CHARS = 200


@dataclass(frozen=True)
class NotClaiming:
    """One loop that cannot claim: which, for how long, how often, and the last error."""

    queue: str
    loop: str  # own, continuation
    failing_s: float
    failures: int
    reason: str

    def as_json(self) -> dict[str, Any]:
        """Return it as ``/readyz`` and the heartbeat row carry it."""
        return {
            "queue": self.queue,
            "loop": self.loop,
            "failingForSeconds": round(self.failing_s, 1),
            "failures": self.failures,
            "reason": self.reason,
        }


def describe(exc: BaseException, secrets: Sequence[str] = ()) -> str:
    """Return ``exc`` as one short line: its type and message, secrets masked, cut."""
    message = " ".join(str(exc).split())
    text = mask_secrets(
        f"{type(exc).__name__}: {message}" if message else type(exc).__name__, secrets
    )
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


class ClaimHealth:
    """One loop's claims in a row that failed, or the claim that has not returned."""

    def __init__(
        self,
        queue: str,
        loop: str,
        *,
        secrets: Sequence[str] = (),
        after_s: float | None = None,  # FAILING_AFTER_S
        after_claims: int = FAILING_AFTER_CLAIMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queue, self.loop = queue, loop
        self._secrets = tuple(secrets)
        self._after_s = FAILING_AFTER_S if after_s is None else after_s
        self._after_claims = after_claims
        self._clock = clock
        self.failures = 0  # in a row
        self._failing_since: float | None = None
        self._reason = ""
        self._claim_since: float | None = None  # a claim in flight since

    def started(self) -> None:
        """A claim was sent."""
        self._claim_since = self._clock()

    def succeeded(self) -> None:
        """A claim came back (with runs or without): the loop claims."""
        self._claim_since = None
        self.failures = 0
        self._failing_since = None

    def failed(self, exc: BaseException) -> None:
        """A claim raised ``exc``."""
        now = self._clock()
        self._claim_since = None
        self.failures += 1
        if self._failing_since is None:
            self._failing_since = now
        self._reason = describe(exc, self._secrets)

    def failing_s(self) -> float:
        """Seconds since the first failed claim of the streak, or since a claim hangs; else 0."""
        now = self._clock()
        since = [t for t in (self._failing_since, self._claim_since) if t is not None]
        return now - min(since) if since else 0.0

    def verdict(self) -> NotClaiming | None:
        """Return why the loop does not claim, or None while it does."""
        now = self._clock()
        if self._claim_since is not None and now - self._claim_since >= self._after_s:
            # A claim that does not return (a lock, a silent network) claims nothing either.
            waited = now - self._claim_since
            reason = f"a claim has not returned for {waited:.0f} s"
            if self._failing_since is not None:
                reason += f" (before it: {self._reason})"
            return NotClaiming(self.queue, self.loop, self.failing_s(), self.failures, reason)
        if self._failing_since is None or self.failures < self._after_claims:
            return None
        if now - self._failing_since < self._after_s:
            return None
        return NotClaiming(
            self.queue, self.loop, now - self._failing_since, self.failures, self._reason
        )
