"""What may be stored as a step result, a play's output or a payload: plain JSON that round-trips.

A value that ``json.dumps`` cannot write, or that PostgreSQL's ``jsonb`` refuses,
would otherwise fail deep inside a database call (and leave the run held until
its lease expired); one that would come back different on replay (a dict with
int keys reads back with str keys) would make a replay diverge silently.
"""

from __future__ import annotations

import math
from typing import Any

from worker.errors import NotJsonError

MAX_DEPTH = 512  # far past any sane document; keeps the walk and json.dumps bounded


_KEY_SHOWN = 40  # a path names its keys, not a megabyte of one


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key)
    if len(text) > _KEY_SHOWN:
        text = text[:_KEY_SHOWN] + "..."
    return f"{parent}.{text}" if text.isidentifier() else f"{parent}[{text!r}]"


# Python refuses to write ints past sys.get_int_max_str_digits() decimal digits
# (4300 by default); only ints this long need the (slower) check.
_BIG_INT_BITS = 4000


def _too_long(number: int) -> bool:
    try:
        str(number)
    except ValueError:
        return True
    return False


def is_utf8(text: str) -> bool:
    """Tell whether ``text`` has a UTF-8 form (PostgreSQL stores UTF-8).

    A lone surrogate (a byte the environment or a file name could not decode,
    kept by surrogateescape) has none.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_problem(value: Any) -> str | None:
    """Return why ``value`` is not storable JSON (naming the type and where it sits), or None."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"it nests deeper than {MAX_DEPTH} levels at {where}"
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if item.bit_length() > _BIG_INT_BITS and _too_long(item):
                return f"an int too long to write as JSON ({item.bit_length()} bits) at {where}"
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"a non-finite float ({item}) at {where}"
            continue
        if isinstance(item, str):
            if "\x00" in item:
                return f"a string with a NUL character (\\u0000) at {where}"
            if not is_utf8(item):
                return f"a string with a lone surrogate (not UTF-8) at {where}"
            continue
        if isinstance(item, list | tuple):
            stack.extend((v, _path(where, i), depth + 1) for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for key, v in item.items():
                if not isinstance(key, str):
                    return f"a {type(key).__name__} key ({key!r}) at {where}; keys must be strings"
                if "\x00" in key:
                    return f"a key with a NUL character (\\u0000) at {where}"
                if not is_utf8(key):
                    return f"a key with a lone surrogate (not UTF-8) at {where}"
                stack.append((v, _path(where, key), depth + 1))
            continue
        return f"a {type(item).__module__}.{type(item).__qualname__} at {where}".replace(
            "builtins.", ""
        )
    return None


def require_json(value: Any, what: str) -> None:
    """Raise ``NotJsonError`` naming ``what`` when ``value`` is not storable JSON."""
    problem = json_problem(value)
    if problem is not None:
        raise NotJsonError(
            f"{what} is not JSON: it holds {problem}. Return only dicts with string keys, "
            "lists, strings, finite numbers, booleans and None (convert dates to ISO strings)."
        )
