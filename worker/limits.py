"""What a submit or a signal may carry: the rules the client and the CLI both apply.

Each check raises ``InvalidRequestError`` with one sentence before anything
reaches the database, so a bad request never turns into a driver error, a
half-written run or an index row Postgres refuses. The store's SQL API
(``submit_run``, ``signal_run``: migration 0008) enforces the same limits for
callers in other languages; what only Python can get wrong (a value JSON cannot
hold, a lone surrogate) is checked here alone.
"""

from __future__ import annotations

import json
from typing import Any

from worker.errors import InvalidRequestError, shown
from worker.jsonvalue import is_utf8, json_problem

# 1 MiB of JSON text: an input is arguments, not a document store. Every step
# of a run reads it back, and larger rows slow every claim that touches them.
MAX_INPUT_BYTES = 1_048_576
# Keys are ids (webhook ids, request ids, hashes); the unique index caps a key at
# about 2.7 kB, so a far longer one fails there with a driver error.
MAX_KEY_CHARS = 255
MAX_PLAY_CHARS = 200


_PROBLEM_SHOWN = 300  # a path 512 levels deep must not fill a terminal either


def _json_problem(value: Any, what: str) -> str | None:
    try:
        problem = json_problem(value)
    except RecursionError:
        raise InvalidRequestError(f"{what} is nested too deeply to store.") from None
    if problem is not None and len(problem) > _PROBLEM_SHOWN:
        problem = problem[:_PROBLEM_SHOWN] + "..."
    return problem


def _size_problem(value: Any, what: str) -> None:
    try:
        # Measured as Postgres prints it (jsonb::text: ", " and ": "), which is
        # how the store's submit_run and signal_run measure it too.
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    except RecursionError:
        raise InvalidRequestError(f"{what} is nested too deeply to store.") from None
    size = len(text.encode("utf-8"))
    if size > MAX_INPUT_BYTES:
        raise InvalidRequestError(
            f"{what} is {size} bytes of JSON, more than the {MAX_INPUT_BYTES} bytes (1 MiB) "
            "allowed: store large data elsewhere and pass a reference to it."
        )


def checked_input(value: Any) -> dict[str, Any]:
    """Return a run's input (``None`` is ``{}``), or refuse one that is not a small JSON object."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"a run's input must be a JSON object (a dict), not {type(value).__name__}: "
            'wrap it, for example {"value": ...}.'
        )
    problem = _json_problem(value, "the run's input")
    if problem is not None:
        raise InvalidRequestError(f"the run's input is not storable JSON: {problem}.")
    _size_problem(value, "the run's input")
    return value


def checked_payload(value: Any) -> Any:
    """Return an event's payload, or refuse one that is not small, storable JSON."""
    problem = _json_problem(value, "the event's payload")
    if problem is not None:
        raise InvalidRequestError(f"the event's payload is not storable JSON: {problem}.")
    _size_problem(value, "the event's payload")
    return value


def _text_ok(text: str, limit: int) -> bool:
    # Postgres text holds no NUL, and a lone surrogate cannot be encoded to send.
    return is_utf8(text) and len(text) <= limit and "\x00" not in text


def checked_key(key: str | None, what: str) -> str | None:
    """Return an idempotency or event key, or refuse a blank or over-long one."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise InvalidRequestError(f"{what} must be a non-blank string.")
    if not _text_ok(key, MAX_KEY_CHARS):
        raise InvalidRequestError(
            f"{what} {shown(key)} is not usable: a key has at most {MAX_KEY_CHARS} characters "
            "and no NUL or unpaired surrogate character."
        )
    return key


def checked_play(play: str) -> str:
    """Return a play name, or refuse a blank or over-long one."""
    if not isinstance(play, str) or not play.strip():
        raise InvalidRequestError("submit needs a play name (a non-blank string).")
    if not _text_ok(play, MAX_PLAY_CHARS):
        raise InvalidRequestError(
            f"play name {shown(play)} is not usable: a play name has at most {MAX_PLAY_CHARS} "
            "characters and no NUL or unpaired surrogate character."
        )
    return play


def checked_runtime_api(value: Any) -> dict[str, Any] | None:
    """Return a runtime API context, or refuse one Python cannot even send (never quoting it).

    Its fields are checked by the store's ``submit_run``; here only what could not
    reach it as JSON text (a NUL, a lone surrogate, a value JSON cannot hold).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError(
            "runtime_api must be a mapping (baseUrl, executorToken, ...) or None, "
            f"not {type(value).__name__}."
        )
    problem = _json_problem(value, "the runtime API context")
    if problem is not None:
        # json_problem names the kind of value and where it sits, never the value.
        raise InvalidRequestError(f"the runtime API context is not storable JSON: {problem}.")
    return value


MAX_ATTEMPTS = 1000  # the store's submit_run refuses more (migration 0025)


def checked_max_attempts(value: Any) -> int | None:
    """Return a run's attempt budget (None: LANE_WORKER_MAX_ATTEMPTS), or refuse it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidRequestError(
            f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS} (or None), "
            f"not {shown(value)}."
        )
    return value
