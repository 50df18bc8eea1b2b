"""Unit tests for worker/checkpoint.py against DESIGN.md and the TS reference."""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import pytest

from worker.checkpoint import (
    boundary_resolved,
    checkpoint_base,
    checkpoint_with_integration_event,
    checkpoint_with_sleep,
    integration_event_boundary_output,
    integration_event_name,
    runner_terminal_event_name,
    terminal_ledger_event,
)
from worker.errors import LaneWorkerError, UnknownBoundaryError

TABLES = ("completedBatches", "completedToolBatches", "resolvedWaterfalls", "resolvedBoundaries")
EMPTY_BASE: dict[str, Any] = {key: {} for key in TABLES}
FIXED_RESUMED_KEYS = [
    "resumed",
    "timed_out",
    "signal",
    "event_key",
    "message_ref",
    "event_payload",
    "response",
]


# --- checkpoint_base ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, [], [{"a": 1}], "str", "", 0, 5, 5.5, True, ("a",)])
def test_checkpoint_base_non_dict_input_is_empty(value: object) -> None:
    """Anything that is not a dict is treated as an empty envelope."""
    assert checkpoint_base(value) == EMPTY_BASE


def test_checkpoint_base_empty_dict() -> None:
    """An empty dict gains the four empty tables and nothing else."""
    assert checkpoint_base({}) == EMPTY_BASE


def test_checkpoint_base_keeps_unknown_keys_by_identity() -> None:
    """Unknown top-level keys pass through with their very objects."""
    nested = {"deep": [1, {"x": None}]}
    items = [1, 2, 3]
    checkpoint = {"futureField": nested, "otherList": items, "n": None, "s": "v"}
    base = checkpoint_base(checkpoint)
    assert base["futureField"] is nested
    assert base["otherList"] is items
    assert base["n"] is None
    assert base["s"] == "v"
    assert base == {**checkpoint, **EMPTY_BASE}


@pytest.mark.parametrize("table", TABLES)
def test_checkpoint_base_table_missing_or_none_becomes_empty(table: str) -> None:
    """Each table key becomes {} when missing or None."""
    assert checkpoint_base({})[table] == {}
    assert checkpoint_base({table: None})[table] == {}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("value", [[1, 2], "text", 0, False, {"a": {"b": 1}}, {}])
def test_checkpoint_base_table_other_values_kept(table: str, value: object) -> None:
    """A table value that is not None is kept as it is (the same object), even a list."""
    base = checkpoint_base({table: value})
    assert base[table] is value


@pytest.mark.parametrize("epoch", [0, 5, 5.5, 0.0, -0.0, 1_700_000_000_000])
def test_checkpoint_base_epoch_kept_when_finite_non_negative(epoch: float) -> None:
    """A finite number >= 0 is kept."""
    base = checkpoint_base({"durableCallCacheEpochMs": epoch})
    assert base["durableCallCacheEpochMs"] == epoch
    assert type(base["durableCallCacheEpochMs"]) is type(epoch)


@pytest.mark.parametrize(
    "epoch",
    [-1, -0.5, math.nan, math.inf, -math.inf, True, False, "5", None, [], {}, [5]],
)
def test_checkpoint_base_epoch_removed_otherwise(epoch: object) -> None:
    """Negative, non-finite, bool, string, None and containers are removed."""
    base = checkpoint_base({"durableCallCacheEpochMs": epoch, "keep": 1})
    assert "durableCallCacheEpochMs" not in base
    assert base["keep"] == 1


def test_checkpoint_base_epoch_huge_int_does_not_raise() -> None:
    """An integer too large for a float is a finite number >= 0, kept without raising.

    Regression: math.isfinite(10**400) raises OverflowError.
    """
    huge = 10**400
    base = checkpoint_base({"durableCallCacheEpochMs": huge})
    assert base["durableCallCacheEpochMs"] == huge


@pytest.mark.parametrize("frames", [{}, {"frame-1": {"i": 0}}])
def test_checkpoint_base_map_frames_kept_when_dict(frames: dict[str, Any]) -> None:
    """A dict mapFrames is kept (the same object)."""
    assert checkpoint_base({"mapFrames": frames})["mapFrames"] is frames


@pytest.mark.parametrize("frames", [None, [], [{"i": 0}], "frames", 0, True])
def test_checkpoint_base_map_frames_removed_otherwise(frames: object) -> None:
    """A mapFrames that is not a dict is removed."""
    assert "mapFrames" not in checkpoint_base({"mapFrames": frames})


def test_checkpoint_base_never_mutates_input() -> None:
    """The input is unchanged even when keys are removed or defaulted."""
    checkpoint: dict[str, Any] = {
        "completedBatches": None,
        "resolvedBoundaries": {"b": {"kind": "sleep"}},
        "durableCallCacheEpochMs": -1,
        "mapFrames": [1],
        "future": {"x": [1, 2]},
    }
    before = copy.deepcopy(checkpoint)
    base = checkpoint_base(checkpoint)
    assert checkpoint == before
    assert base is not checkpoint
    base["future"] = "changed"
    base["completedBatches"]["x"] = 1
    assert checkpoint == before


def test_checkpoint_base_is_idempotent() -> None:
    """Normalizing a normalized envelope changes nothing."""
    checkpoint = {"durableCallCacheEpochMs": 5, "mapFrames": {"f": 1}, "x": [1], "ra": None}
    once = checkpoint_base(checkpoint)
    assert checkpoint_base(once) == once


# --- checkpoint_with_sleep ----------------------------------------------------------------


def test_checkpoint_with_sleep_exact_entry() -> None:
    """The sleep boundary is {kind, delayMs, completedAt} with completedAt = now_ms."""
    result = checkpoint_with_sleep(None, "nap", 30_000, now_ms=1_700_000_000_123)
    assert result == {
        **EMPTY_BASE,
        "resolvedBoundaries": {
            "nap": {"kind": "sleep", "delayMs": 30_000, "completedAt": 1_700_000_000_123}
        },
    }
    assert list(result["resolvedBoundaries"]["nap"]) == ["kind", "delayMs", "completedAt"]


def test_checkpoint_with_sleep_keeps_boundaries_and_unknown_keys() -> None:
    """Existing boundaries and unknown top-level keys survive; the input is not mutated."""
    other = {"kind": "integration_event", "eventKey": "k", "output": {"a": 1}}
    checkpoint = {
        "resolvedBoundaries": {"earlier": other},
        "futureKey": {"v": 2},
        "completedBatches": {"b1": True},
    }
    before = copy.deepcopy(checkpoint)
    result = checkpoint_with_sleep(checkpoint, "nap", 5, now_ms=10)
    assert checkpoint == before
    assert result["futureKey"] is checkpoint["futureKey"]
    assert result["completedBatches"] == {"b1": True}
    assert result["resolvedBoundaries"] == {
        "earlier": other,
        "nap": {"kind": "sleep", "delayMs": 5, "completedAt": 10},
    }


def test_checkpoint_with_sleep_replaces_same_boundary() -> None:
    """Resolving the same sleep again replaces its entry."""
    first = checkpoint_with_sleep({}, "nap", 5, now_ms=10)
    second = checkpoint_with_sleep(first, "nap", 7, now_ms=20)
    assert second["resolvedBoundaries"] == {
        "nap": {"kind": "sleep", "delayMs": 7, "completedAt": 20}
    }
    assert first["resolvedBoundaries"]["nap"]["completedAt"] == 10


def test_checkpoint_with_sleep_default_now_is_wall_clock() -> None:
    """Without now_ms the completion time is the current epoch in milliseconds."""
    before = int(time.time() * 1000)
    result = checkpoint_with_sleep({}, "nap", 1)
    after = int(time.time() * 1000)
    completed_at = result["resolvedBoundaries"]["nap"]["completedAt"]
    assert isinstance(completed_at, int)
    assert before <= completed_at <= after + 1


# --- integration_event_boundary_output ----------------------------------------------------


def test_boundary_output_timed_out_shape_and_order() -> None:
    """A timed-out wait has the fixed shape, in this key order, ignoring signal data."""
    output = integration_event_boundary_output(
        event_key="approved", signal_data={"x": 1}, timed_out=True
    )
    assert output == {
        "resumed": False,
        "timed_out": True,
        "signal": "approved",
        "event_key": "approved",
        "message_ref": None,
        "event_payload": None,
        "response": None,
    }
    assert list(output) == FIXED_RESUMED_KEYS


def test_boundary_output_timed_out_with_message_ref() -> None:
    """A timed-out wait still reports the message reference it was given."""
    ref = {"channel": "C1", "ts": "1.2"}
    output = integration_event_boundary_output(
        event_key="k", signal_data=None, message_ref=ref, timed_out=True
    )
    assert output["message_ref"] == ref


def test_boundary_output_resumed_shape_and_order() -> None:
    """Signal data keys come first, then the fixed keys, with response carrying the data."""
    data = {"approved": True, "by": "ann"}
    ref = {"channel": "C1", "ts": "1.2"}
    before = copy.deepcopy(data)
    output = integration_event_boundary_output(
        event_key="approval", signal_data=data, message_ref=ref, timed_out=False
    )
    assert output == {
        "approved": True,
        "by": "ann",
        "resumed": True,
        "timed_out": False,
        "signal": "approval",
        "event_key": "approval",
        "message_ref": ref,
        "event_payload": data,
        "response": {"eventKey": "approval", "data": data},
    }
    assert list(output) == ["approved", "by", *FIXED_RESUMED_KEYS]
    assert list(output["response"]) == ["eventKey", "data"]
    assert data == before


def test_boundary_output_fixed_keys_win_a_clash() -> None:
    """A signal key named like a fixed key is overridden by the fixed value."""
    data = {"x": 1, "resumed": "no", "signal": "spoofed", "response": 0}
    output = integration_event_boundary_output(event_key="k", signal_data=data, timed_out=False)
    assert output["resumed"] is True
    assert output["signal"] == "k"
    assert output["response"] == {"eventKey": "k", "data": data}
    assert output["event_payload"] == data
    assert output["x"] == 1
    assert next(iter(output)) == "x"
    assert set(output) == {"x", *FIXED_RESUMED_KEYS}


def test_boundary_output_resumed_without_signal_data() -> None:
    """Resumed with no signal data: only the fixed keys, payload None, response data None."""
    output = integration_event_boundary_output(event_key="k", signal_data=None, timed_out=False)
    assert output == {
        "resumed": True,
        "timed_out": False,
        "signal": "k",
        "event_key": "k",
        "message_ref": None,
        "event_payload": None,
        "response": {"eventKey": "k", "data": None},
    }
    assert list(output) == FIXED_RESUMED_KEYS


def test_boundary_output_resumed_with_empty_signal_data() -> None:
    """An empty signal payload is a payload ({}), not a missing one."""
    output = integration_event_boundary_output(event_key="k", signal_data={}, timed_out=False)
    assert output["event_payload"] == {}
    assert output["response"] == {"eventKey": "k", "data": {}}
    assert list(output) == FIXED_RESUMED_KEYS


# --- checkpoint_with_integration_event ----------------------------------------------------


def test_integration_event_exact_entry() -> None:
    """A fresh resolution records kind, eventKey, timeoutMs, output and completedAt."""
    output = {"resumed": True}
    result = checkpoint_with_integration_event(
        checkpoint=None,
        boundary_id="approval",
        event_key="approved",
        timeout_ms=3_600_000,
        output=output,
        now_ms=42,
    )
    assert result == {
        **EMPTY_BASE,
        "resolvedBoundaries": {
            "approval": {
                "kind": "integration_event",
                "eventKey": "approved",
                "timeoutMs": 3_600_000,
                "output": output,
                "completedAt": 42,
            }
        },
    }


def test_integration_event_message_ref_only_if_given() -> None:
    """messageRef is recorded when given and absent when not."""
    common: dict[str, Any] = {
        "checkpoint": {},
        "boundary_id": "b",
        "event_key": "k",
        "timeout_ms": 1,
        "output": {},
        "now_ms": 1,
    }
    without = checkpoint_with_integration_event(**common)
    assert "messageRef" not in without["resolvedBoundaries"]["b"]
    none_ref = checkpoint_with_integration_event(**common, message_ref=None)
    assert "messageRef" not in none_ref["resolvedBoundaries"]["b"]
    ref = {"channel": "C1", "ts": "1.2"}
    given = checkpoint_with_integration_event(**common, message_ref=ref)
    assert given["resolvedBoundaries"]["b"]["messageRef"] == ref


def test_integration_event_empty_message_ref_is_still_given() -> None:
    """An empty message_ref mapping is given, so it is recorded (the TS truthiness keeps {}).

    Regression: a truthiness test (`if message_ref:`) dropped an empty mapping.
    """
    result = checkpoint_with_integration_event(
        checkpoint={},
        boundary_id="b",
        event_key="k",
        timeout_ms=1,
        message_ref={},
        output={},
        now_ms=1,
    )
    assert result["resolvedBoundaries"]["b"]["messageRef"] == {}


def test_integration_event_keeps_armed_fields() -> None:
    """Fields recorded when the wait was armed survive; the fixed fields are overwritten."""
    armed = {
        "kind": "integration_event",
        "eventKey": "old",
        "timeoutMs": 1,
        "timeoutPolicy": "fail",
        "deadlineAt": 1_700_000_000_000,
        "messageRef": {"channel": "C0", "ts": "0"},
        "output": {"stale": True},
        "completedAt": 1,
    }
    checkpoint = {"resolvedBoundaries": {"b": armed, "other": {"kind": "sleep"}}, "fut": 1}
    before = copy.deepcopy(checkpoint)
    output = {"resumed": False, "timed_out": True}
    result = checkpoint_with_integration_event(
        checkpoint=checkpoint,
        boundary_id="b",
        event_key="new",
        timeout_ms=99,
        output=output,
        now_ms=500,
    )
    assert checkpoint == before
    assert result["fut"] == 1
    assert result["resolvedBoundaries"]["other"] == {"kind": "sleep"}
    assert result["resolvedBoundaries"]["b"] == {
        "kind": "integration_event",
        "eventKey": "new",
        "timeoutMs": 99,
        "timeoutPolicy": "fail",
        "deadlineAt": 1_700_000_000_000,
        "messageRef": {"channel": "C0", "ts": "0"},
        "output": output,
        "completedAt": 500,
    }


def test_integration_event_new_message_ref_replaces_armed_one() -> None:
    """A message_ref given at resolution replaces the one recorded when armed."""
    checkpoint = {
        "resolvedBoundaries": {
            "b": {"kind": "integration_event", "messageRef": {"channel": "C0", "ts": "0"}}
        }
    }
    result = checkpoint_with_integration_event(
        checkpoint=checkpoint,
        boundary_id="b",
        event_key="k",
        timeout_ms=1,
        message_ref={"channel": "C1", "ts": "1"},
        output={},
        now_ms=1,
    )
    assert result["resolvedBoundaries"]["b"]["messageRef"] == {"channel": "C1", "ts": "1"}


@pytest.mark.parametrize(
    "existing",
    [
        {"kind": "sleep", "delayMs": 5, "deadlineAt": 9, "completedAt": 3},
        {"kind": "future_kind", "timeoutPolicy": "fail"},
        {"timeoutPolicy": "fail"},
        "not-a-dict",
    ],
)
def test_integration_event_drops_fields_of_other_boundaries(existing: object) -> None:
    """An existing boundary of another kind (or none, or not a dict) contributes nothing."""
    result = checkpoint_with_integration_event(
        checkpoint={"resolvedBoundaries": {"b": existing}},
        boundary_id="b",
        event_key="k",
        timeout_ms=7,
        output={"o": 1},
        now_ms=8,
    )
    assert result["resolvedBoundaries"]["b"] == {
        "kind": "integration_event",
        "eventKey": "k",
        "timeoutMs": 7,
        "output": {"o": 1},
        "completedAt": 8,
    }


def test_integration_event_default_now_is_wall_clock() -> None:
    """Without now_ms the completion time is the current epoch in milliseconds."""
    before = int(time.time() * 1000)
    result = checkpoint_with_integration_event(
        checkpoint={}, boundary_id="b", event_key="k", timeout_ms=1, output={}
    )
    after = int(time.time() * 1000)
    assert before <= result["resolvedBoundaries"]["b"]["completedAt"] <= after + 1


# --- boundary_resolved --------------------------------------------------------------------


@pytest.mark.parametrize(
    "checkpoint",
    [None, {}, {"resolvedBoundaries": None}, {"resolvedBoundaries": {"other": {"kind": "sleep"}}}],
)
def test_boundary_resolved_missing_is_false(checkpoint: object) -> None:
    """A boundary id that is not recorded is not resolved."""
    assert boundary_resolved(checkpoint, "b") is False


@pytest.mark.parametrize("kind", ["sleep", "integration_event"])
def test_boundary_resolved_known_kinds(kind: str) -> None:
    """A recorded sleep or integration_event boundary is resolved."""
    assert boundary_resolved({"resolvedBoundaries": {"b": {"kind": kind}}}, "b") is True


def test_boundary_resolved_after_the_builders() -> None:
    """Boundaries written by the two builders read back as resolved."""
    slept = checkpoint_with_sleep({}, "nap", 1, now_ms=1)
    assert boundary_resolved(slept, "nap") is True
    waited = checkpoint_with_integration_event(
        checkpoint=slept, boundary_id="w", event_key="k", timeout_ms=1, output={}, now_ms=1
    )
    assert boundary_resolved(waited, "w") is True
    assert boundary_resolved(waited, "nap") is True


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        ({"kind": "child_play"}, "child_play"),
        ({"kind": "SLEEP"}, "SLEEP"),
        ({"kind": ""}, ""),
        ({"kind": None}, None),
        ({"kind": 1}, 1),
        ({}, None),
        ({"delayMs": 5}, None),
        ("sleep", None),
        (["sleep"], None),
        (5, None),
        (True, None),
    ],
)
def test_boundary_resolved_unknown_kind_raises(entry: object, kind: object) -> None:
    """An unknown kind, an entry without kind, or a non-dict entry raises UnknownBoundaryError."""
    with pytest.raises(UnknownBoundaryError) as caught:
        boundary_resolved({"resolvedBoundaries": {"b1": entry}}, "b1")
    assert caught.value.boundary_id == "b1"
    assert caught.value.kind == kind
    assert "b1" in str(caught.value)
    assert isinstance(caught.value, LaneWorkerError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("kind", [["sleep"], {"k": "sleep"}])
def test_boundary_resolved_unhashable_kind_raises_unknown_boundary(kind: object) -> None:
    """A kind that is a list or a dict is another unknown kind and raises UnknownBoundaryError.

    Regression: `kind in KNOWN_BOUNDARY_KINDS` on a frozenset raised TypeError (unhashable).
    """
    with pytest.raises(UnknownBoundaryError) as caught:
        boundary_resolved({"resolvedBoundaries": {"b1": {"kind": kind}}}, "b1")
    assert caught.value.kind == kind


def test_boundary_resolved_does_not_mutate() -> None:
    """Checking a boundary leaves the checkpoint untouched."""
    checkpoint = {"resolvedBoundaries": {"b": {"kind": "sleep"}}, "mapFrames": []}
    before = copy.deepcopy(checkpoint)
    boundary_resolved(checkpoint, "b")
    assert checkpoint == before


# --- event names --------------------------------------------------------------------------


def test_integration_event_name() -> None:
    """The wake event is evt:<run_id>:<event_key>."""
    assert integration_event_name("run-1", "approved") == "evt:run-1:approved"
    assert integration_event_name("r", "a:b") == "evt:r:a:b"
    assert integration_event_name("", "") == "evt::"


def test_runner_terminal_event_name() -> None:
    """The runner wake event is runner-terminal:<run_id>:<attempt>."""
    assert runner_terminal_event_name("run-1", 3) == "runner-terminal:run-1:3"
    assert runner_terminal_event_name("r", 0) == "runner-terminal:r:0"


# --- terminal_ledger_event ----------------------------------------------------------------


def test_terminal_ledger_event_completed() -> None:
    """A completed run gives the exact run.completed fact."""
    result = {"status": "completed", "runId": "r1", "output": {"ok": 1}, "error": None}
    assert terminal_ledger_event(result, now_ms=123) == {
        "type": "run.completed",
        "runId": "r1",
        "occurredAt": 123,
        "source": "worker",
        "result": {"ok": 1},
    }


def test_terminal_ledger_event_failed() -> None:
    """A failed run gives the exact run.failed fact."""
    result = {"status": "failed", "runId": "r2", "output": None, "error": "boom"}
    assert terminal_ledger_event(result, now_ms=456) == {
        "type": "run.failed",
        "runId": "r2",
        "occurredAt": 456,
        "source": "worker",
        "error": "boom",
    }


@pytest.mark.parametrize("status", ["idle", "running", "cancelled", "COMPLETED", "", None])
def test_terminal_ledger_event_other_status_is_none(status: object) -> None:
    """Any other status gives no ledger fact."""
    assert terminal_ledger_event({"status": status, "runId": "r"}, now_ms=1) is None
    assert terminal_ledger_event({"runId": "r"}, now_ms=1) is None


def test_terminal_ledger_event_default_now_is_wall_clock() -> None:
    """Without now_ms occurredAt is the current epoch in milliseconds."""
    before = int(time.time() * 1000)
    fact = terminal_ledger_event({"status": "completed", "runId": "r", "output": 1})
    after = int(time.time() * 1000)
    assert fact is not None
    assert before <= fact["occurredAt"] <= after + 1
