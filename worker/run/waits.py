"""A play's durable waits as values: their durations, and the envelope's armed boundaries.

Pure functions over the checkpoint envelope (``TaskContext`` in
``worker/run/context.py`` keeps the envelope and writes it): what a wait
armed (its wake time or deadline, under ``armedWaits``), how a boundary
resolved, and the seconds a play asked for, read once and bounded.
"""

from __future__ import annotations

import math
from typing import Any

from worker import checkpoint
from worker.errors import SHOWN_CHARS, FatalRunError, PlayValueError
from worker.run.handle import STEP_KEYS_LEGACY

ARMED_WAITS = "armedWaits"  # our envelope key; unknown to other builds, so kept by them
# The engine counts a wait's timeout in int32 seconds: a longer one failed every
# attempt without parking. Longer durations are clamped to it (about 68 years).
MAX_WAIT_S = 2**31 - 1


def seconds(value: Any) -> float:
    """Return ``value`` as a float of seconds (NaN when it is no number, inf past a double)."""
    seconds = math.nan
    if not isinstance(value, bool | str | bytes):  # float() would read "5" and True
        try:
            seconds = float(value)  # numpy's and Decimal's numbers too
        except OverflowError:  # an int past a double: as long (or short) as a wait can be
            seconds = math.inf if value > 0 else -math.inf
        except (TypeError, ValueError):
            pass
    return seconds


def duration_s(value: Any, what: str) -> float:
    """Return ``value`` as seconds within [0, MAX_WAIT_S] (below 0 is 0).

    A value that is no number (NaN, a string, None) fails the run for good
    (``PlayValueError``): every attempt would compute it again.
    """
    secs = seconds(value)
    if math.isnan(secs):
        raise PlayValueError(
            f"{what} needs a number of seconds, not {shown(value)}; the run fails for good"
            " (a retry would compute the same value)"
        )
    return min(max(secs, 0.0), float(MAX_WAIT_S))


def shown(value: Any) -> str:
    """Return ``repr(value)``, cut to 100 characters (a 400-digit int stays readable)."""
    try:
        text = repr(value)
    except ValueError:  # an int past the interpreter's digit limit for str()
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def step_checkpoint_name(name: str, occurrence: int, step_keys: int | None) -> str:
    """Return the engine checkpoint of the ``occurrence``-th use (from 1) of step ``name``.

    One-to-one: every '#' in the name is doubled, and a lone '#' starts the
    occurrence number, so ``a#2`` (once) and ``a`` (twice) cannot meet. Names
    without '#' keep the keys they always had.
    """
    key = name if step_keys is STEP_KEYS_LEGACY else name.replace("#", "##")
    return f"step:{key}" if occurrence == 1 else f"step:{key}#{occurrence}"


def armed(
    envelope: dict[str, Any], run_id: str, boundary_id: str, kind: str
) -> dict[str, Any] | None:
    """Return what boundary ``boundary_id`` armed, or None; refuse one armed as another kind."""
    table = envelope.get(ARMED_WAITS)
    entry = table.get(boundary_id) if isinstance(table, dict) else None
    if entry is None:
        return None
    if not isinstance(entry, dict) or entry.get("kind") != kind:
        found = entry.get("kind") if isinstance(entry, dict) else entry
        raise FatalRunError(
            f"boundary {boundary_id!r} of run {run_id} was armed as a {found!r} wait, "
            f"but this build resumes it as a {kind!r} wait; it cannot be resumed here."
        )
    return dict(entry)


def arm(envelope: dict[str, Any], boundary_id: str, armed: dict[str, Any]) -> dict[str, Any]:
    """Return ``envelope`` with ``armed`` kept for ``boundary_id``."""
    envelope = dict(envelope)
    table = envelope.get(ARMED_WAITS)
    envelope[ARMED_WAITS] = {**(table if isinstance(table, dict) else {}), boundary_id: armed}
    return envelope


def disarm(envelope: dict[str, Any], boundary_id: str) -> dict[str, Any]:
    """Return ``envelope`` without what ``boundary_id`` armed (it resolved)."""
    table = envelope.get(ARMED_WAITS)
    if isinstance(table, dict) and boundary_id in table:
        envelope = dict(envelope)
        envelope[ARMED_WAITS] = {k: v for k, v in table.items() if k != boundary_id}
    return envelope


def resolved_output(
    envelope: dict[str, Any],
    boundary_id: str,
    kind: str = checkpoint.INTEGRATION_EVENT_BOUNDARY,
) -> dict[str, Any] | None:
    """Return the output boundary ``boundary_id`` resolved with, or None while it has not."""
    if not checkpoint.boundary_resolved(envelope, boundary_id):
        return None
    entry = envelope["resolvedBoundaries"][boundary_id]
    if entry.get("kind") != kind:
        raise FatalRunError(
            f"boundary {boundary_id!r} was resolved as a {entry.get('kind')!r}, but the play "
            f"now waits for a {kind!r} there; boundary ids must not change meaning."
        )
    output: dict[str, Any] = entry.get("output") or {}
    return output


def check_key_unused(
    envelope: dict[str, Any], run_id: str, boundary_id: str, event_key: str
) -> None:
    """Refuse ``event_key`` when another boundary of the run waits or waited for it."""
    boundaries = envelope.get("resolvedBoundaries") or {}
    armed = envelope.get(ARMED_WAITS) or {}
    for table in (boundaries, armed):
        if not isinstance(table, dict):
            continue
        for other_id, entry in table.items():
            if (
                other_id != boundary_id
                and isinstance(entry, dict)
                and entry.get("kind") == checkpoint.INTEGRATION_EVENT_BOUNDARY
                and entry.get("eventKey") == event_key
            ):
                raise FatalRunError(
                    f"event key {event_key!r} is waited on twice in run {run_id} "
                    f"(boundaries {other_id!r} and {boundary_id!r}); an event key can be "
                    "waited on once per run."
                )


def engine_timeout_s(deadline_ms: int | None, now_ms: int) -> int | None:
    """Return the engine's timeout for a wait until ``deadline_ms`` (None: no deadline).

    Whole seconds from now, rounded up and never below 1, so the run is not
    woken before the armed deadline.
    """
    if deadline_ms is None:
        return None
    return min(MAX_WAIT_S, max(1, math.ceil((deadline_ms - now_ms) / 1000)))


def event_armed(event_key: str, timeout: Any, now_ms: int) -> dict[str, Any]:
    """Return what a new event wait arms: its deadline ``timeout`` seconds from now, if any."""
    deadline = (
        None
        if timeout is None
        else now_ms + round(duration_s(timeout, "wait_for_event's timeout") * 1000)
    )
    return {
        "kind": checkpoint.INTEGRATION_EVENT_BOUNDARY,
        "eventKey": event_key,
        "deadlineMs": deadline,
        "armedAtMs": now_ms,
    }


def runner_timeout_s(name: Any, timeout: Any) -> float:
    """Return a detached call's timeout in seconds; refuse a blank name or no timeout.

    Either fails the run for good (``PlayValueError``).
    """
    if not isinstance(name, str) or not name.strip():
        raise PlayValueError(
            "run_detached needs a name (a non-blank string); the run fails for good"
        )
    # Any number above 0 (inf and an int past a double wait as long as the engine
    # counts, as 1e300 does); NaN, 0 or below, or no number fails the run for good.
    if not seconds(timeout) > 0:
        raise PlayValueError(
            f"run_detached needs a timeout in seconds above 0, not {shown(timeout)};"
            " the run fails for good (a retry would compute the same value)"
        )
    return duration_s(timeout, "run_detached's timeout")


def runner_armed(number: int, timeout_s: float, now_ms: int) -> dict[str, Any]:
    """Return what a new runner wait for runner attempt ``number`` arms."""
    return {
        "kind": checkpoint.RUNNER_BOUNDARY,
        "runnerAttempt": number,
        "deadlineMs": now_ms + max(1, round(timeout_s * 1000)),
        "armedAtMs": now_ms,
    }
