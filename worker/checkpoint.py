"""The durable checkpoint envelope of a play run, and the names derived from a run.

The envelope is written back on every park and resume, possibly by an older
build than the one that wrote it last, so every function here keeps the keys it
does not know and never mutates what it is given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from worker.errors import UnknownBoundaryError

Checkpoint = dict[str, Any]

SLEEP_BOUNDARY = "sleep"
INTEGRATION_EVENT_BOUNDARY = "integration_event"
# lane-worker's own: a wait for a detached runner (`ctx.run_detached`).
RUNNER_BOUNDARY = "runner"
KNOWN_BOUNDARY_KINDS = frozenset({SLEEP_BOUNDARY, INTEGRATION_EVENT_BOUNDARY, RUNNER_BOUNDARY})

_TABLE_KEYS = (
    "completedBatches",
    "completedToolBatches",
    "resolvedWaterfalls",
    "resolvedBoundaries",
)


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def _is_epoch_ms(value: object) -> bool:
    # bool is an int in Python but not a number in the envelope's JSON sense.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        # Python ints are exact and finite, even past a double's range
        # (math.isfinite would overflow on them).
        return value >= 0
    return math.isfinite(value) and value >= 0


def checkpoint_base(checkpoint: object) -> Checkpoint:
    """Return the envelope with its known keys validated and every unknown key kept."""
    # Once per run: a dict (what the store returns) skips the ABC check.
    base: Checkpoint = (
        dict(checkpoint) if type(checkpoint) is dict or isinstance(checkpoint, Mapping) else {}
    )
    for key in _TABLE_KEYS:
        if base.get(key) is None:
            base[key] = {}
    if not _is_epoch_ms(base.get("durableCallCacheEpochMs")):
        base.pop("durableCallCacheEpochMs", None)
    if "mapFrames" in base and not isinstance(base["mapFrames"], Mapping):
        del base["mapFrames"]
    return base


def _boundaries(base: Checkpoint) -> dict[str, Any]:
    # A table that is not an object is a corrupt envelope; treat it as empty
    # rather than spreading a list or a string into boundary ids.
    table = base.get("resolvedBoundaries")
    return dict(table) if isinstance(table, Mapping) else {}


def checkpoint_with_sleep(
    checkpoint: object, boundary_id: str, delay_ms: int, *, now_ms: int | None = None
) -> Checkpoint:
    """Return a new envelope with the sleep ``boundary_id`` resolved."""
    base = checkpoint_base(checkpoint)
    boundaries = _boundaries(base)
    boundaries[boundary_id] = {
        "kind": SLEEP_BOUNDARY,
        "delayMs": delay_ms,
        "completedAt": _now_ms(now_ms),
    }
    base["resolvedBoundaries"] = boundaries
    return base


def checkpoint_with_runner(
    checkpoint: object,
    boundary_id: str,
    *,
    runner_attempt: int,
    output: Mapping[str, Any],
    now_ms: int | None = None,
) -> Checkpoint:
    """Return a new envelope with the detached-runner wait ``boundary_id`` resolved."""
    base = checkpoint_base(checkpoint)
    boundaries = _boundaries(base)
    boundaries[boundary_id] = {
        "kind": RUNNER_BOUNDARY,
        "runnerAttempt": runner_attempt,
        "output": dict(output),
        "completedAt": _now_ms(now_ms),
    }
    base["resolvedBoundaries"] = boundaries
    return base


def integration_event_boundary_output(
    *,
    event_key: str,
    signal_data: Mapping[str, Any] | None,
    message_ref: Mapping[str, Any] | None = None,
    timed_out: bool,
) -> dict[str, Any]:
    """Return what ``wait_for_event`` gives the play when the event arrives or times out."""
    ref = dict(message_ref) if message_ref is not None else None
    if timed_out:
        return {
            "resumed": False,
            "timed_out": True,
            "signal": event_key,
            "event_key": event_key,
            "message_ref": ref,
            "event_payload": None,
            "response": None,
        }
    payload = dict(signal_data) if signal_data is not None else None
    # The signal's own keys come first so the play can read them directly;
    # the fixed keys after them win on a clash.
    return {
        **(payload or {}),
        "resumed": True,
        "timed_out": False,
        "signal": event_key,
        "event_key": event_key,
        "message_ref": ref,
        "event_payload": payload,
        "response": {"eventKey": event_key, "data": payload},
    }


def checkpoint_with_integration_event(
    *,
    checkpoint: object,
    boundary_id: str,
    event_key: str,
    timeout_ms: int,
    message_ref: Mapping[str, Any] | None = None,
    output: Mapping[str, Any],
    now_ms: int | None = None,
) -> Checkpoint:
    """Return a new envelope with the integration-event ``boundary_id`` resolved.

    Fields recorded when the wait was armed (its timeout policy, its deadline)
    survive: resolving a wait sets its output, it does not reinterpret it.
    """
    base = checkpoint_base(checkpoint)
    boundaries = _boundaries(base)
    existing = boundaries.get(boundary_id)
    armed = (
        dict(existing)
        if isinstance(existing, Mapping) and existing.get("kind") == INTEGRATION_EVENT_BOUNDARY
        else {}
    )
    entry: dict[str, Any] = {
        **armed,
        "kind": INTEGRATION_EVENT_BOUNDARY,
        "eventKey": event_key,
        "timeoutMs": timeout_ms,
    }
    if message_ref is not None:  # an empty ref is still a ref (the app's rule)
        entry["messageRef"] = dict(message_ref)
    entry["output"] = dict(output)
    entry["completedAt"] = _now_ms(now_ms)
    boundaries[boundary_id] = entry
    base["resolvedBoundaries"] = boundaries
    return base


def boundary_resolved(checkpoint: object, boundary_id: str) -> bool:
    """Tell whether ``boundary_id`` is resolved; raise on a kind this build cannot replay."""
    entry = _boundaries(checkpoint_base(checkpoint)).get(boundary_id)
    if entry is None:
        return False
    kind = entry.get("kind") if isinstance(entry, Mapping) else None
    if isinstance(kind, str) and kind in KNOWN_BOUNDARY_KINDS:
        return True
    raise UnknownBoundaryError(
        f"checkpoint boundary {boundary_id!r} was resolved with kind {kind!r}, which this "
        f"build cannot replay (it knows {', '.join(sorted(KNOWN_BOUNDARY_KINDS))}); "
        "run this run on the release that wrote it or a newer one.",
        boundary_id=boundary_id,
        kind=kind,
    )


def integration_event_name(run_id: str, event_key: str) -> str:
    """Return the engine event that wakes ``run_id`` for ``event_key``.

    Run-scoped because engine events are first-emit-wins per queue: an
    unscoped name would wake other runs and pin one payload forever.
    """
    return f"evt:{run_id}:{event_key}"


def runner_terminal_event_name(run_id: str, runner_attempt: int) -> str:
    """Return the engine event that wakes one attempt of a run parked on a runner."""
    return f"runner-terminal:{run_id}:{runner_attempt}"


def terminal_ledger_event(
    result: Mapping[str, Any], *, now_ms: int | None = None
) -> dict[str, Any] | None:
    """Return the ``run.completed`` / ``run.failed`` ledger fact for a settled run, else None."""
    status = result.get("status")
    if status == "completed":
        return {
            "type": "run.completed",
            "runId": result.get("runId"),
            "occurredAt": _now_ms(now_ms),
            "source": "worker",
            "result": result.get("output"),
        }
    if status == "failed":
        return {
            "type": "run.failed",
            "runId": result.get("runId"),
            "occurredAt": _now_ms(now_ms),
            "source": "worker",
            "error": result.get("error"),
        }
    return None
