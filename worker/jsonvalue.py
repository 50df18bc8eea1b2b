"""What may be stored as a step result, a play's output or a payload: plain JSON that round-trips.

A value that ``json.dumps`` cannot write, or that PostgreSQL's ``jsonb`` refuses,
would otherwise fail deep inside a database call (and leave the run held until
its lease expired); one that would come back different on replay (a dict with
int keys reads back with str keys) would make a replay diverge silently.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from typing import Any

import msgspec

from worker.errors import FatalRunError, NotJsonError

# The limits of what may be stored, shared with the store's SQL API: its
# value_limits() holds the same numbers (a test holds the two together).
MAX_DEPTH = 512  # far past any sane document; keeps the walk and json.dumps bounded
# Python's default int-to-string limit (sys.get_int_max_str_digits()): a longer
# integer cannot be read back by json.loads.
MAX_INTEGER_DIGITS = 4300


_KEY_SHOWN = 40  # a path names its keys, not a megabyte of one
_PATH_SHOWN = 120  # nor 513 levels of [0]


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key)
    if len(text) > _KEY_SHOWN:
        text = text[:_KEY_SHOWN] + "..."
    return f"{parent}.{text}" if text.isidentifier() else f"{parent}[{text!r}]"


# Only ints this long can reach MAX_INTEGER_DIGITS, so only they pay the comparison.
_BIG_INT_BITS = 4000
_TOO_LONG: int = 10**MAX_INTEGER_DIGITS  # the smallest int of MAX_INTEGER_DIGITS + 1 digits


def _too_long(number: int) -> bool:
    # Counted, not printed: the process's own int-to-string limit may be lower.
    return abs(number) >= _TOO_LONG


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


def _plainly_json(value: Any) -> bool:
    """Tell whether ``json_problem`` has nothing to say: its walk, without the paths.

    Checked on every step result and output, so it walks cheaply; anything it is
    not sure of (a subclass, a long int) goes to the full walk.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        kind = type(item)
        if kind is str:
            if "\x00" in item or not (item.isascii() or is_utf8(item)):
                return False
        elif kind is dict:
            for key, v in item.items():
                if type(key) is not str or "\x00" in key or not (key.isascii() or is_utf8(key)):
                    return False
                stack.append((v, depth + 1))
        elif kind is list or kind is tuple:
            stack.extend((v, depth + 1) for v in item)
        elif kind is int:
            if item.bit_length() > _BIG_INT_BITS:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif item is not None and kind is not bool:
            return False
    return True


def json_problem(value: Any) -> str | None:
    """Return why ``value`` is not storable JSON (naming the type and where it sits), or None."""
    if _plainly_json(value):
        return None
    return _problem_at(value)


def _problem_at(value: Any) -> str | None:
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            shown = where if len(where) <= _PATH_SHOWN else where[:_PATH_SHOWN] + "..."
            return f"a value that nests deeper than {MAX_DEPTH} levels at {shown}"
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if item.bit_length() > _BIG_INT_BITS and _too_long(item):
                return (
                    f"an int too long to write as JSON (over {MAX_INTEGER_DIGITS} digits, "
                    f"{item.bit_length()} bits) at {where}"
                )
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
        if inspect.isawaitable(item):
            # `return ctx.step(...)` in an async play: the step never ran.
            return (
                f"a {type(item).__name__} at {where}, a call that was never awaited "
                "(did you forget `await`, as in `await ctx.step(...)`?)"
            )
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


class Unreadable:
    """A stored JSON value this process cannot decode: what stands in for it, and why.

    The database codec returns one instead of raising, so a row written past the
    store's checks (by an older store, or straight to a table) fails the one run
    that needs it, never the claim batch or the listing it came in. It is not
    JSON: writing it back raises, so nothing is silently replaced.
    """

    __slots__ = ("chars", "why")

    def __init__(self, why: str, chars: int) -> None:
        self.why = why
        self.chars = chars

    def __str__(self) -> str:
        # What `status --json`, `runs` and the run page show in its place.
        return f"<unreadable JSON, {self.chars} characters: {self.why}>"

    __repr__ = __str__


def _why_unreadable(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply for Python's json"
    text = str(exc)
    if "digits" in text:  # Python's int-to-string limit
        return f"it holds an integer of more than {sys.get_int_max_str_digits()} digits"
    return f"not valid JSON ({text[:200]})"


# msgspec's codec (one C call) costs a fraction of json's on the daemon's hot path;
# each is used only where it gives what json gives (tests/unit/test_json_codec.py).
_fast_decode = msgspec.json.Decoder().decode
_fast_encode = msgspec.json.Encoder().encode


def decode_json(text: str) -> Any:
    """Decode stored JSON text; return ``Unreadable`` for what Python cannot read."""
    try:
        return _fast_decode(text)
    except (msgspec.MsgspecError, RecursionError, ValueError):
        # What msgspec does not read (nesting past the recursion limit, an integer
        # past Python's digit limit, json's NaN) json decides, as it always did.
        pass
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as exc:
        return Unreadable(_why_unreadable(exc), len(text))


def encode_checked(value: Any) -> str:
    """Return the JSON text of ``value``, which ``json_problem`` has accepted.

    Only for such values: msgspec writes a non-finite float as null, and sets,
    bytes or dates that json refuses, where json.dumps writes NaN (which the
    server refuses) or raises. For accepted values the text differs from
    ``json.dumps``'s only in spacing, non-ASCII characters written as they are, and
    an exponent's spelling (1e16 for 1e+16): the same JSON value, digit for digit.
    """
    try:
        return _fast_encode(value).decode()
    except (TypeError, ValueError, OverflowError, RecursionError):
        return json.dumps(value)  # what msgspec refuses (an int subclass of its own, say)


def unreadable_in(what: str, value: Any) -> str | None:
    """Return a sentence saying ``what`` cannot be read, when ``value`` is ``Unreadable``."""
    if isinstance(value, Unreadable):
        return f"{what} cannot be read back ({value.chars} characters of JSON: {value.why})"
    return None


def require_readable(value: Any, what: str) -> None:
    """Raise ``FatalRunError`` when a value read for a run cannot be read back or stored again.

    A payload or result a run takes ends up in its envelope; one that cannot be
    read back (or stored) would fail every later attempt, so the run fails now.
    """
    problem = unreadable_in(what, value)
    if problem is None:
        try:
            found = json_problem(value)
        except RecursionError:
            found = "it nests too deeply"
        if found is not None:
            problem = f"{what} cannot be stored in the run's envelope: {found}"
    if problem is not None:
        raise FatalRunError(problem)
