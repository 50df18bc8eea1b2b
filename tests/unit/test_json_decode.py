"""The pool's JSON decoder: what Python cannot read is an ``Unreadable`` stand-in, not an error."""

from __future__ import annotations

import json

import pytest

from worker.errors import FatalRunError
from worker.jsonvalue import (
    MAX_DEPTH,
    MAX_INTEGER_DIGITS,
    Unreadable,
    decode_json,
    json_problem,
    require_readable,
    unreadable_in,
)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 3000 + "]" * 3000, "nested too deeply for Python's json"),
        ('{"n": ' + "1" * 5001 + "}", "an integer of more than"),
    ],
)
def test_what_python_cannot_read_decodes_to_a_stand_in(text: str, why: str) -> None:
    """A 3,000-deep array or a 5,001-digit integer: an Unreadable saying why and how long."""
    value = decode_json(text)
    assert isinstance(value, Unreadable)
    assert why in value.why
    assert value.chars == len(text)
    assert str(value).startswith(f"<unreadable JSON, {len(text)} characters: ")


def test_readable_json_decodes_as_json_loads_does() -> None:
    """Everything else is json.loads' own value."""
    text = '{"a": [1, 2.5, null, true, "x"], "n": ' + "9" * MAX_INTEGER_DIGITS + "}"
    assert decode_json(text) == json.loads(text)


def test_a_stand_in_is_never_written_back() -> None:
    """The stand-in is not JSON: encoding it raises, so no write replaces the data with it."""
    with pytest.raises(TypeError):
        json.dumps({"input": Unreadable("why", 6000)})
    assert json_problem({"input": Unreadable("why", 6000)}) is not None


def test_a_value_a_run_cannot_keep_is_a_fatal_run_error() -> None:
    """Unreadable, or readable but too deep to store: the run fails for good, saying which."""
    assert unreadable_in("its input", {"a": 1}) is None
    with pytest.raises(FatalRunError, match="the payload of event 'go' cannot be read back"):
        require_readable(Unreadable("nested too deeply", 6000), "the payload of event 'go'")
    deep: list[object] = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(FatalRunError, match="cannot be stored in the run's envelope"):
        require_readable(deep, "the result of runner attempt 1")
    require_readable({"ok": [1, 2]}, "the result of runner attempt 1")


def test_ints_are_counted_against_the_shared_limit_not_the_process_setting() -> None:
    """MAX_INTEGER_DIGITS digits pass and one more is refused, whatever sys's own limit."""
    assert json_problem(10**MAX_INTEGER_DIGITS - 1) is None
    problem = json_problem({"n": -(10**MAX_INTEGER_DIGITS)})
    assert problem is not None
    assert f"over {MAX_INTEGER_DIGITS} digits" in problem
