"""The hot path's JSON codec (msgspec) gives what json gives: the same values, digit for digit.

``decode_json`` reads what the pool's jsonb columns return, ``encode_checked`` writes
step results, outputs and facts, ``render_json`` writes log lines. Each must mean
exactly what json's text meant: values are compared with their types (1 is not 1.0,
True is not 1) and numbers as decimals, so a float written with other digits fails.
"""

from __future__ import annotations

import decimal
import json
import math
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.processors import JSONRenderer

from worker import jsonvalue
from worker.daemon.logs import _stamp, iso_utc, render_json
from worker.jsonvalue import (
    MAX_DEPTH,
    MAX_INTEGER_DIGITS,
    Unreadable,
    decode_json,
    encode_checked,
    json_problem,
)

text_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
scalars = st.one_of(
    st.none(),
    st.booleans(),
    # Past 64 bits too: a codec that reads them as floats changes them.
    st.integers(min_value=-(10**60), max_value=10**60),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(text_chars, max_size=12),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(text_chars, max_size=6), children)
    ),
    max_leaves=16,
)


def typed(value: Any) -> Any:
    """The value with each scalar's type beside it, so 1 == 1.0 == True no longer holds."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])  # in order
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, value)


def as_decimals(text: str) -> Any:
    """The JSON value of ``text`` with every number exact (a float's digits, not its double)."""
    return typed(json.loads(text, parse_float=Decimal, parse_int=Decimal))


@settings(max_examples=400, deadline=None)
@given(values)
def test_encode_checked_writes_the_value_json_dumps_writes(value: Any) -> None:
    """Same keys in the same order, same strings, same numbers digit for digit."""
    assert json_problem(value) is None
    text = encode_checked(value)
    assert as_decimals(text) == as_decimals(json.dumps(value))
    assert typed(json.loads(text)) == typed(json.loads(json.dumps(value)))


@settings(max_examples=400, deadline=None)
@given(values)
def test_decode_json_reads_what_json_loads_reads(value: Any) -> None:
    """From json's spelling and from compact UTF-8 spelling alike, types included."""
    for text in (json.dumps(value), encode_checked(value)):
        assert typed(decode_json(text)) == typed(json.loads(text))


@settings(max_examples=300, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False, places=None))
def test_decode_json_reads_numbers_as_postgres_writes_them(number: Decimal) -> None:
    """jsonb writes numbers in plain notation, with as many digits as were stored."""
    text = f"{number:f}"
    if "." not in text and len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        return
    assert typed(decode_json(f"[{text}]")) == typed(json.loads(f"[{text}]"))


@pytest.mark.parametrize(
    "text",
    [
        "NaN",  # not from jsonb, but json reads it: so does decode_json
        '{"n": ' + "9" * MAX_INTEGER_DIGITS + "}",
        "18446744073709551616",
        "0.1000000000000000055511151231257827",
        "1" + "0" * 400,
        "0." + "0" * 400 + "1",
        '"\\ud83d\\ude00 \\u2028"',
        '{"a": 1, "a": 2}',
    ],
)
def test_decode_json_edges(text: str) -> None:
    """Where msgspec refuses or may differ, the value is json's."""
    found, expected = decode_json(text), json.loads(text)
    if isinstance(expected, float) and math.isnan(expected):
        assert isinstance(found, float)
        assert math.isnan(found)
    else:
        assert typed(found) == typed(expected)


def test_decode_json_still_stands_in_for_what_json_cannot_read() -> None:
    """Past the digit limit or the recursion limit: json's reason, not msgspec's."""
    too_long = decode_json('{"n": ' + "1" * 5001 + "}")
    assert isinstance(too_long, Unreadable)
    assert "an integer of more than" in too_long.why
    too_deep = decode_json("[" * 3000 + "]" * 3000)
    assert isinstance(too_deep, Unreadable)
    assert too_deep.why == "nested too deeply for Python's json"


def test_encode_checked_falls_back_to_json_for_what_msgspec_refuses() -> None:
    """An int past 64 bits and beyond msgspec's reach, or a subclass, is still written."""
    big = 10**MAX_INTEGER_DIGITS - 1

    class Name(str):
        pass

    for value in ({"n": big}, {"k": Name("x")}, [1, -(2**200)]):
        assert as_decimals(encode_checked(value)) == as_decimals(json.dumps(value))


flat_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and infinities too: json writes them, the line keeps them
    st.text(max_size=12),  # lone surrogates and non-ASCII: json escapes them
)
log_values = st.one_of(
    flat_values,
    st.lists(flat_values, max_size=3),
    st.dictionaries(st.text(max_size=4), flat_values, max_size=3),
    st.uuids(),
    st.sets(st.integers(), max_size=2),
    st.datetimes(),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(text_chars, max_size=8), log_values, max_size=8))
def test_a_log_line_holds_what_json_would_have_written(event: dict[str, Any]) -> None:
    """The line is ASCII, and the JSON value of structlog's own renderer, key for key."""
    line = JSONRenderer(serializer=render_json)(None, "info", dict(event))
    before = JSONRenderer()(None, "info", dict(event))
    assert isinstance(line, str)
    assert line.isascii()
    parsed = json.loads(line, parse_float=Decimal, parse_int=Decimal)
    expected = json.loads(before, parse_float=Decimal, parse_int=Decimal)
    with decimal.localcontext() as exact:
        exact.traps[decimal.InvalidOperation] = False  # NaN == NaN is asked below
        assert list(parsed) == list(expected)
        for key, found in parsed.items():
            wanted = expected[key]
            if isinstance(wanted, Decimal) and wanted.is_nan():
                assert isinstance(found, Decimal)
                assert found.is_nan()
            else:
                assert typed(found) == typed(wanted)


def test_a_log_line_with_a_non_json_value_is_json_dumps_own() -> None:
    """A UUID or a nested dict is written as before, byte for byte (structlog's repr)."""
    event = {"event": "x", "run_id": uuid.UUID(int=5), "outcomes": {"completed": 2}}
    assert JSONRenderer(serializer=render_json)(None, "info", dict(event)) == JSONRenderer()(
        None, "info", dict(event)
    )


any_scalars = st.one_of(
    scalars,
    st.sampled_from([math.nan, math.inf, -math.inf, True, b"x", 1.5]),
    st.builds(pow, st.just(10), st.just(MAX_INTEGER_DIGITS)),  # one digit too many
    st.text(max_size=6),  # NUL and lone surrogates too
    st.builds(uuid.uuid4),
)
any_values = st.recursive(
    any_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4) | st.integers(), children, max_size=4)
    ),
    max_leaves=16,
)


@settings(max_examples=500, deadline=None)
@given(any_values)
def test_the_quick_check_passes_only_what_the_full_walk_passes(value: Any) -> None:
    """json_problem's quick walk (no paths) never lets through what the full walk names."""
    assert json_problem(value) == jsonvalue._problem_at(value)


def test_the_quick_check_refuses_past_the_depth_limit() -> None:
    """As deep as MAX_DEPTH passes, one level more is named by the full walk."""
    ok: list[Any] = []
    for _ in range(MAX_DEPTH):
        ok = [ok]
    assert json_problem(ok) is None
    assert json_problem([ok]) is not None


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=4_102_444_800 * 10**9))  # to 2100
def test_a_log_lines_time_is_written_as_structlogs_timestamper_writes_it(now_ns: int) -> None:
    """ISO 8601 in UTC with a Z, microseconds floored, none written when they are 0."""
    when = datetime.fromtimestamp(now_ns // 10**9, tz=UTC).replace(
        microsecond=now_ns % 10**9 // 1000
    )
    assert iso_utc(now_ns) == when.isoformat().replace("+00:00", "Z")


def test_a_log_line_is_stamped_with_the_time_it_was_written() -> None:
    """The daemon's stamp reads the clock (a cached second must not stick)."""
    line: dict[str, Any] = {}
    before = datetime.now(tz=UTC).replace(microsecond=0)
    stamped = datetime.fromisoformat(_stamp(None, "info", line)["timestamp"])
    assert before <= stamped <= datetime.now(tz=UTC)
    assert iso_utc(0) == "1970-01-01T00:00:00Z"
    assert iso_utc(1_500_000) == "1970-01-01T00:00:00.001500Z"  # the same second, cached
