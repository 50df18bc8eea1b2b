"""A play's failure's traceback, as the attempt's error keeps it: bounded and masked.

An operator reading a failed run needs where the play raised, not only what; a
recursion error must not put a thousand frames in every row and log line. So
the traceback keeps the innermost ``MAX_FRAMES`` frames of the error (and of
each error it was raised from or during), each frame's and each error line's
text cut to ``MAX_PART_CHARS``, then the last ``MAX_CHARS`` characters; each cut
is marked in the text. The database URL's secrets are masked before any cut, so
no cut can leave part of one behind.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from types import TracebackType

from worker.config.dburl import mask_secrets
from worker.errors import printable

# The bounds README states (what a failed attempt's error holds).
MAX_FRAMES = 20
MAX_CHARS = 8000
# A long message (the error's ``message`` keeps 8,000 characters of it) must not push
# the frames out: each frame's or error's text keeps this many.
MAX_PART_CHARS = 1000

# What the cut's own line takes, so the whole stays within MAX_CHARS.
_MARKER_ROOM = 80

# This package: the worker's code that runs a play, around the play's own frames.
_RUNNER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

_HEADER = "Traceback (most recent call last):\n"


def _from_the_play(tb: TracebackType | None) -> TracebackType | None:
    """Skip the frames of the worker's code that runs a play (execute, lease): the
    traceback starts where the play's code does (all of it when none is the play's)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNNER_DIR):
        tb = tb.tb_next
    return tb or first


def _without_runner_frames(lines: list[str]) -> list[str]:
    """Leave out the worker's frames between two of the play's (``ctx.step`` running the
    step's function, its thread): one line says how many. Frames after the play's last one
    stay: they show where the worker raised (a bad argument to a ``ctx`` call, say)."""
    runner = f'  File "{_RUNNER_DIR}'
    kept: list[str] = []
    pending: list[str] = []
    for line in lines:
        if line.startswith(runner):
            pending.append(line)
            continue
        if pending and line.startswith('  File "'):
            plural = "s" if len(pending) > 1 else ""
            kept.append(f"  ... ({len(pending)} frame{plural} of lane-worker's own left out)\n")
        else:
            kept.extend(pending)
        pending = []
        kept.append(line)
    return kept + pending


def _kept(part: str, secrets: Sequence[str]) -> str:
    """One frame's or one error's text, masked, then cut to ``MAX_PART_CHARS``."""
    # jsonb refuses NUL characters and lone surrogates: escape both, as in the message.
    part = printable(mask_secrets(part, secrets).replace("\x00", "\\u0000"))
    if len(part) <= MAX_PART_CHARS:
        return part
    return f"{part[:MAX_PART_CHARS]}... ({len(part) - MAX_PART_CHARS} characters left out)\n"


def bounded_traceback(exc: BaseException, secrets: Sequence[str]) -> str:
    """Return ``exc``'s traceback as Python prints it, bounded and with ``secrets`` masked."""
    tb = _from_the_play(exc.__traceback__)
    try:
        lines = _without_runner_frames(
            traceback.format_exception(type(exc), exc, tb, limit=-MAX_FRAMES)
        )
    except Exception as broken:  # a broken __str__ or __repr__ must not stop the failure
        lines = [f"(the traceback could not be formatted: {type(broken).__name__})\n"]
    frames = sum(1 for _ in traceback.walk_tb(tb))
    if frames > MAX_FRAMES and _HEADER in lines:
        # The error's own frames are the last header's (the chain comes first).
        at = len(lines) - lines[::-1].index(_HEADER)
        lines.insert(at, f"  ... ({frames - MAX_FRAMES} outer frames left out)\n")
    text = "".join(_kept(line, secrets) for line in lines)
    if len(text) <= MAX_CHARS:
        return text
    tail = text[-(MAX_CHARS - _MARKER_ROOM) :]
    tail = tail[tail.find("\n") + 1 :] if "\n" in tail[:-1] else tail
    return f"... (the traceback's first {len(text) - len(tail)} characters left out)\n{tail}"
