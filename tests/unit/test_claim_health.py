"""When a claim loop counts as not claiming: failures in a row, for long enough, or a hung claim."""

from __future__ import annotations

import asyncpg

from worker.run.claim_health import REASON_CHARS, ClaimHealth, NotClaiming


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def failing(health: ClaimHealth, clock: Clock, at: list[float], exc: BaseException) -> None:
    """Fail a claim at each of the offsets ``at`` (seconds from now)."""
    start = clock.now
    for offset in at:
        clock.now = start + offset
        health.started()
        health.failed(exc)


BROKEN = asyncpg.RaiseError("unknown claim mode all")


def test_one_failure_then_a_good_claim_never_flips_it() -> None:
    """A transient failure is forgotten by the next claim that returns."""
    clock = Clock()
    health = ClaimHealth("runs_a", "own", clock=clock)
    failing(health, clock, [0], BROKEN)
    clock.now += 60
    assert health.verdict() is None  # one failure, then the loop waited for a slot
    health.started()
    health.succeeded()
    clock.now += 60
    assert health.verdict() is None
    assert health.failing_s() == 0


def test_claims_failing_for_20_s_make_it_not_claiming_until_one_succeeds() -> None:
    """The backoff's failures (0, 1, 3, 7, 15 s) flip it at 20 s, with the last error."""
    clock = Clock()
    health = ClaimHealth("runs_a", "own", clock=clock)
    failing(health, clock, [0, 1, 3, 7, 15], BROKEN)
    clock.now += 4  # 19 s after the first failure
    assert health.verdict() is None
    clock.now += 1
    verdict = health.verdict()
    assert verdict == NotClaiming("runs_a", "own", 20.0, 5, "RaiseError: unknown claim mode all")
    assert verdict.as_json()["failingForSeconds"] == 20.0
    health.started()
    health.succeeded()
    assert health.verdict() is None


def test_a_claim_that_does_not_return_counts_too() -> None:
    """A claim in flight for 20 s claims nothing: not claiming, and it says so."""
    clock = Clock()
    health = ClaimHealth("runs_a", "continuation", clock=clock)
    health.started()
    clock.now += 19
    assert health.verdict() is None
    clock.now += 2
    verdict = health.verdict()
    assert verdict is not None
    assert verdict.reason == "a claim has not returned for 21 s"
    assert health.failing_s() == 21


def test_the_reason_is_one_short_line_without_the_password() -> None:
    """An error that quotes the database URL keeps its password out of the reason."""
    clock = Clock()
    health = ClaimHealth("runs_a", "own", secrets=["s3cret-pass"], clock=clock, after_s=0)
    long = "connect to postgresql://lane:s3cret-pass@db/x failed\n" + "x" * 500
    failing(health, clock, [0, 1, 2], OSError(long))
    verdict = health.verdict()
    assert verdict is not None
    assert "s3cret-pass" not in verdict.reason
    assert "postgresql://lane:***@db/x" in verdict.reason
    assert "\n" not in verdict.reason
    assert len(verdict.reason) == REASON_CHARS
