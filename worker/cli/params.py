"""Parameter types (each refuses a bad value with exit 2 and one sentence), shared options."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

import click

from worker import lanes, limits
from worker.config import settings
from worker.errors import (
    InvalidRequestError,
)


class Checked(click.ParamType[Any]):
    """A string parameter: ``problem`` says why a value is unusable (exit 2), else None."""

    def __init__(self, name: str, problem: Callable[[str], str | None], to: Callable[[str], Any]):
        self.name, self.problem, self.to = name, problem, to

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        reason = self.problem(value) if isinstance(value, str) else None
        if reason:
            self.fail(reason, param, ctx)
        return self.to(value) if isinstance(value, str) else value


def _refuse_constant(name: str) -> Any:
    raise ValueError(
        f"{name} is not JSON (the JSON standard has no {name}): send null or a string instead."
    )


def _read_json_text(value: str, what: str) -> str:
    """Return the JSON text of ``value``: itself, ``@FILE``'s content, or stdin for ``-``."""
    limit = limits.MAX_INPUT_BYTES
    try:
        if value == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        elif value.startswith("@"):
            with open(value[1:], "rb") as file:
                raw = file.read(limit + 1)
        else:
            raw = value.encode("utf-8", "surrogatepass")
    except OSError as exc:
        raise ValueError(f"cannot read {what} from {value[1:]!r}: {exc.strerror or exc}.") from None
    if len(raw) > limit:
        raise ValueError(
            f"{what} is more than {limit} bytes (1 MiB) of JSON text: store large data "
            "elsewhere and pass a reference to it."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text.") from None


def _parse_json(value: str, what: str) -> Any:
    return parse_json_text(_read_json_text(value, what), what)


def parse_json_text(text: str, what: str) -> Any:
    """Return the JSON value ``text`` holds, or refuse it (``ValueError`` naming ``what``)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply.") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})."
        ) from None
    except ValueError as exc:
        if "digits" not in str(exc):  # NaN / Infinity, refused by _refuse_constant
            raise
        # Python's limit on integer digits; its own message names a Python setting.
        raise ValueError(
            f"{what} holds an integer with more than 4300 digits: send it as a string."
        ) from None


class JsonArg(click.ParamType[Any]):
    """JSON given inline, as ``@FILE`` or as ``-`` (stdin), checked by ``check`` (exit 2)."""

    def __init__(self, name: str, check: Callable[[Any], Any]) -> None:
        self.name, self.check = name, check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        what = param.opts[0] if param is not None and param.opts else "the value"
        try:
            return self.check(_parse_json(value, what))
        except ValueError as exc:  # InvalidRequestError is one
            self.fail(str(exc), param, ctx)


class Seconds(click.ParamType[float]):
    """A finite number of seconds above zero (``nan``, ``inf`` and negatives are refused)."""

    name = "seconds"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        number = settings.decimal_number(str(value).strip())
        if number is None or number <= 0:
            self.fail(f"{value!r} is not a number of seconds above 0.", param, ctx)
        return number


def _key_problem(what: str) -> Callable[[str], str | None]:
    def problem(value: str) -> str | None:
        try:
            limits.checked_key(value, what)
        except InvalidRequestError as exc:
            return str(exc)
        return None

    return problem


def _release_problem(value: str) -> str | None:
    problem = settings.release_id_problem(value)
    return f"{problem}." if problem else None


def _run_id_problem(value: str) -> str | None:
    try:
        uuid.UUID(value.strip())
    except ValueError:
        # A short or partial id is not looked up by prefix: say what a run id is and where
        # the whole one is (the store keys runs by the full UUID only).
        return (
            f"{value.strip()!r} is not a run id: give the full run id, a UUID such as "
            "9b6c1f2e-5d4a-4e3b-8c7d-0a1b2c3d4e5f (submit prints it; `lane-worker runs` "
            "lists them; the page's /runs shows them); a short or partial id is not "
            "accepted."
        )
    return None


def _app_problem(value: str) -> str | None:
    module, _, attr = value.partition(":")
    if module.strip() and attr.strip():
        return None
    # What was meant, most likely: a file path or a module without its attribute.
    guess = module.strip().removesuffix(".py").replace("/", ".").strip(".")
    hint = f" (for example {guess}:app, if the App is named app)" if guess else ""
    return f"{value!r} is not MODULE:ATTRIBUTE{hint}."


def _play_problem(value: str) -> str | None:
    try:
        limits.checked_play(value.strip())
    except InvalidRequestError as exc:
        return str(exc)
    return None


def _suffix_problem(value: str) -> str | None:
    return None if lanes.normalize_queue_suffix(value) else f"{value!r} names no queue."


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _runtime_api(value: Any) -> Any:
    # Its fields are checked by the store's submit_run; no message quotes a value
    # (it holds tokens).
    if not isinstance(value, dict):
        raise ValueError(
            "--runtime-api must be a JSON object (baseUrl, executorToken, ...), not "
            + ("null." if value is None else f"a JSON {_JSON_KINDS[type(value)]}.")
        )
    return value


INPUT = JsonArg("json-object", limits.checked_input)
RUNTIME_API = JsonArg("json-object", _runtime_api)
PAYLOAD = JsonArg("json", limits.checked_payload)
TEXT = Checked("text", lambda v: None if v.strip() else "must not be blank.", str.strip)
PLAY = Checked("play", lambda v: _play_problem(v), str.strip)
IDEMPOTENCY_KEY = Checked("key", _key_problem("an idempotency key"), str)
EVENT_KEY = Checked("event_key", _key_problem("an event key"), str)
RELEASE_ID = Checked("release_id", _release_problem, str.strip)
SUFFIX = Checked("suffix", _suffix_problem, str.strip)
RUN_ID = Checked("run_id", _run_id_problem, lambda v: str(uuid.UUID(v.strip())))
APP_SPEC = Checked("module:attr", _app_problem, str.strip)


def gate_spec(value: str) -> dict[str, Any]:
    """``PLAY`` or ``PLAY=JSON`` (a JSON object, its input): one gate run of a deploy.

    Raises ``ValueError`` with one sentence naming what is wrong.
    """
    play, sep, text = value.partition("=")
    problem = _play_problem(play)
    if problem:
        raise ValueError(f"--gate {value!r} names no play: {problem}")
    params: Any = None
    if sep:
        params = limits.checked_input(parse_json_text(text, f"the input of --gate {play.strip()}"))
    return {"play": play.strip(), "input": params}


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class Duration(click.ParamType[float]):
    """A duration: seconds, or a number with s, m, h or d (``90m``, ``24h``, ``7d``)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in _UNITS else "s"
        number = settings.decimal_number(text[:-1] if text[-1:] in _UNITS else text)
        if number is None:
            self.fail(f"{value!r} is not a duration such as 3600, 90m, 24h or 7d.", param, ctx)
        return number * _UNITS[unit]


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
force_option = click.option(
    "--force", is_flag=True, help="Create the lane even if no lane has ever had this release id."
)
