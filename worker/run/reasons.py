"""How an error is stored: its class name and a printable, bounded message.

A run's terminal fact (``run.completed``, ``run.failed``, ``run.cancelled``) is
built by the store, not here: ``terminal_fact`` (store migration 0032), called
by every settle, the client's cancel included.
"""

from __future__ import annotations

from typing import Any

from worker.errors import printable

# A stored error message is for people; a multi-megabyte one only bloats rows.
MAX_ERROR_MESSAGE_CHARS = 8000


def error_reason(exc: BaseException) -> dict[str, Any]:
    """Return how an error is stored: its class name and a printable message."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop the failure being recorded
        message = f"<{type(exc).__name__} whose message could not be read>"
    # jsonb refuses NUL characters, and UTF-8 lone surrogates (a file name decoded
    # with surrogateescape, say): escape both, so the failure can be stored.
    message = message.replace("\x00", "\\u0000")[:MAX_ERROR_MESSAGE_CHARS]
    return {"name": type(exc).__name__, "message": printable(message)}
