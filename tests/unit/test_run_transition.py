"""How an attempt ends (worker/run/transition.py) and a wait's pure values (worker/run/waits.py)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from worker.db.engine import ClaimedRun
from worker.errors import FatalRunError, PlayValueError
from worker.run import waits
from worker.run.transition import Complete, Fail, Park, Retry, failure


def claimed(attempt: int, max_attempts: int | None) -> ClaimedRun:
    return ClaimedRun(
        queue="q", run_id=uuid.uuid4(), task_id=uuid.uuid4(), attempt=attempt,
        task_name="play-run", params=None, max_attempts=max_attempts, wake_event=None,
        event_payload=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "kind"),
    [(1, 3, Retry), (2, 3, Retry), (3, 3, Fail), (4, 3, Fail), (1, 1, Fail), (9, None, Retry)],
)
def test_a_failure_retries_until_the_last_attempt(
    attempt: int, max_attempts: int | None, kind: type
) -> None:
    error = RuntimeError("boom")
    ended = failure(error, claimed(attempt, max_attempts))
    assert type(ended) is kind
    assert ended.error is error


def test_transitions_are_values() -> None:
    assert Complete({"a": 1}) == Complete({"a": 1})
    park = Park("sleep", "b", {"kind": "sleep"}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        park.boundary_id = "other"  # type: ignore[misc]


def test_the_engine_timeout_rounds_up_and_never_wakes_early() -> None:
    assert waits.engine_timeout_s(None, 0) is None
    assert waits.engine_timeout_s(1_001, 0) == 2
    assert waits.engine_timeout_s(0, 5_000) == 1  # past: at least one second
    assert waits.engine_timeout_s(10**15, 0) == waits.MAX_WAIT_S


def test_an_armed_wait_of_another_kind_cannot_be_resumed() -> None:
    envelope = waits.arm({}, "b", waits.event_armed("k", None, 10))
    assert waits.armed(envelope, "run", "b", "integration_event") == {
        "kind": "integration_event", "eventKey": "k", "deadlineMs": None, "armedAtMs": 10,
    }  # fmt: skip
    with pytest.raises(FatalRunError, match="armed as a 'integration_event' wait"):
        waits.armed(envelope, "run", "b", "sleep")
    assert waits.armed(waits.disarm(envelope, "b"), "run", "b", "sleep") is None


@pytest.mark.parametrize(("name", "timeout"), [(" ", 5), ("n", 0), ("n", "5"), ("n", None)])
def test_a_detached_call_needs_a_name_and_a_timeout(name: str, timeout: object) -> None:
    with pytest.raises(PlayValueError):
        waits.runner_timeout_s(name, timeout)
