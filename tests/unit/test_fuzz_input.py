"""Fuzz the environment parser and the CLI's arguments and JSON inputs (hypothesis).

The requirement: whatever the environment or the command line holds, no traceback, and
every exit code is a documented one (0 success, 1 failure, 2 usage error, 78
configuration refused). No database here: the database commands run with a
``WORKFLOW_RUNTIME_POSTGRES`` that the boot guard refuses (it holds a ``#``), so once
their arguments parse they exit 78 before connecting. The same commands against a real
server are fuzzed in ``tests/integration/test_cli_fuzz_db.py``.

The product bugs these properties found are pinned at the end of the file, one test per
bug with its minimal counterexample; all are fixed. ``env_known_bug`` is where a newly
found, still open one would be kept out of the general properties.

How each property can fail (checked by breaking a scratch copy of the product, see the
report of the change that added this file): a ``diagnose`` that raises on a value, names a
variable outside the contract or quotes a value whole; a ``from_env`` that raises anything
but ``LaneConfigError``; a doctor exit code other than ``diagnose``'s or an error line
without the ``lane-worker:`` prefix; a redaction that leaves the password in; a command
that lets an exception through (``result.exception`` is then no ``SystemExit``) or exits
with an undocumented code; a refusal printed without the prefix; a validator that accepts
``NaN``, a NUL or a list as a run's input, or a ``--timeout`` that is no number above 0.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import string
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from worker.cli import cli
from worker.config import dburl
from worker.config import settings as config
from worker.errors import LaneConfigError

REPO = Path(__file__).resolve().parents[2]

# The names are a contract with the app (README "Environment"), so they are spelled out
# here rather than imported: a renamed constant must fail these tests.
DATABASE_URL = "WORKFLOW_RUNTIME_POSTGRES"
SCHEMA = "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"
SUFFIX = "DEEPLINE_ABSURD_QUEUE_SUFFIX"
DEPLOY = "DEEPLINE_RUNTIME_DEPLOY_VERSION"
WHOLE_NUMBER_VARIABLES = (
    "LANE_WORKER_CONCURRENCY",
    "LANE_WORKER_CLAIM_TIMEOUT",
    "LANE_WORKER_HEALTH_PORT",
    "LANE_WORKER_MAX_ATTEMPTS",
)
KNOWN_VARIABLES = (
    DATABASE_URL,
    SCHEMA,
    SUFFIX,
    DEPLOY,
    "VERCEL",
    *WHOLE_NUMBER_VARIABLES,
    "LANE_WORKER_POLL_INTERVAL",
    "LANE_WORKER_DRAIN_SECONDS",
    "LANE_WORKER_LOG_FORMAT",
    "LANE_WORKER_EVENT_LOOP",
    "LANE_WORKER_PGBOUNCER",
    "LANE_WORKER_DEFER_ALERT_AFTER",
    "LANE_WORKER_DEFER_FAIL_AFTER",
    "LANE_WORKER_HEALTH_HOST",
    "LANE_WORKER_TEST_DATABASE_URL",
    "LANE_WORKER_BOOT_RETRY",
    "LANE_WORKER_PAGE_POSTGRES",
    "LANE_WORKER_STORE_SCHEMA",
    "LANE_WORKER_PAGE_TOKEN",
)
# A variable added to worker/config.py later is fuzzed too (its name must then be in the
# contract list above for the errors to name a known variable).
FUZZED_VARIABLES = tuple(
    sorted(
        set(KNOWN_VARIABLES)
        | {v for k, v in vars(config).items() if k.endswith("_ENV") and isinstance(v, str)}
    )
)
DOCUMENTED_EXIT_CODES = {0, 1, 2, 78}
SHOWN_CHARS = 100  # a message quotes at most this many characters of a value (DESIGN)
# One quoted value is at most 100 characters, each at most 10 once repr() escapes it
# ('\U000e0001'), plus the longest fixed sentence (the dev-lane deploy-version refusal,
# about 330 characters, naming two queue names of at most 57): under 1,600 in all.
MAX_MESSAGE_CHARS = 1600

# A URL the boot guard refuses before any connection (it holds a '#'), with a password
# that must never be printed: every database command exits 78 on it after parsing.
REFUSED_SECRET = "fuzz-refused-pw-7Qx"
REFUSED_URL = f"postgresql://fuzz:{REFUSED_SECRET}#x@db.invalid:5432/runtime"

ENV_FAST = settings(max_examples=300, deadline=None)
ENV_CLI = settings(max_examples=120, deadline=None)
SECRETS = settings(max_examples=200, deadline=None)
CLI = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ORACLE = settings(max_examples=120, deadline=None)


# --- known bugs (see the tests at the end) ------------------------------------------------


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def env_known_bug(env: Mapping[str, str]) -> str | None:
    """Name an open bug ``env`` would trigger in ``diagnose``, or None (none is open now)."""
    return None


# JSON nests this deep at most in the generated inputs: far past the product's own
# 512-level refusal, and past the interpreter's recursion limit (B5).
MAX_JSON_DEPTH = 3000


# --- strategies: environments --------------------------------------------------------------

any_char = st.characters(exclude_categories=())  # every code point, lone surrogates too
control_char = st.characters(max_codepoint=0x1F) | st.sampled_from("\x7f\x85\u2028\u2029\ufeff")
printable_char = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
url_special = st.sampled_from("/#?@:%[]&= ")

long_texts = st.builds(
    lambda unit, times: unit * times,
    st.text(any_char, min_size=1, max_size=3),
    st.integers(min_value=30, max_value=3000),
)
number_like = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.floats().map(str),
    st.builds(
        "".join,
        st.tuples(
            st.sampled_from(["", "", " ", "+", "-"]),
            st.text("0123456789_\uff11", max_size=6),
            st.sampled_from(["", ".", ".5", ".25", ".0001"]),
            st.sampled_from(["", "", "e3", "E-2", "e+400"]),
        ),
    ),
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "Infinity",
            "1e3",
            "1_000",
            "+5",
            "0x10",
            "\u0663",
            "5.",
            ".5",
            ".",
            "0.01",
            "0.009",
            "0",
            "1",
            "4",
            "5",
            "1000",
            "1001",
            "3600",
            "3600.0001",
            "65535",
            "65536",
            "86400",
            "86401",
            "-1",
            "00008",
            "\uff18",
        ]
    ),
    st.integers(min_value=1, max_value=4400).map(lambda n: "9" * n),
)
keywords = st.sampled_from(
    ["1", "true", "YES", "On", "0", "false", "No", "OFF", "json", "CONSOLE", "auto", "dev",
     " dev ", "dev-", "dev-x", "DEV", "Dev-Feature", "runs", "runtime_scheduler", "", "  ",
     "\t", "main", "a" * 63, "a" * 64, "é" * 32, "_", "-", "---", "9schema", "x" * 201]
)  # fmt: skip
IDENTIFIER_CHARS = string.ascii_letters + string.digits + "_\u00e9"
identifier_like = st.builds(
    str.__add__, st.sampled_from("aZ_\u00e99"), st.text(IDENTIFIER_CHARS, max_size=70)
)
passwords = st.one_of(
    st.text(printable_char | url_special, min_size=8, max_size=24),
    st.text(st.characters(categories=["L", "N", "P", "S"]) | url_special, min_size=8, max_size=16),
    st.lists(
        st.sampled_from(
            [
                "1",
                "5432",
                "65535",
                "99999",
                "?",
                "/",
                "=",
                "&",
                "#",
                "@",
                ":",
                "%",
                "%2F",
                "%40",
                "%3F",
                "%23",
                "%zz",
                "[",
                "]",
                "x",
                "s3cret",
                "pass word",
            ]
        ),
        min_size=1,
        max_size=8,
    ).map(lambda parts: "".join(parts).ljust(8, "z")),
    # Shaped to move the URL's boundaries: a port-like head, then path and query pieces.
    st.builds(
        str.__add__,
        st.sampled_from(["", "1", "0", "5432", "99999", "x1"]),
        st.lists(st.sampled_from(["?k=v", "/p", "?", "&k=v", "=", "@", "#", "x"]), max_size=4).map(
            "".join
        ),
    ).map(lambda text: text.ljust(8, "z")),
)


@st.composite
def url_like(draw: st.DrawFn, password: st.SearchStrategy[str] = passwords) -> str:
    """URL-shaped text: every part sometimes missing, malformed or full of specials."""
    scheme = draw(st.sampled_from(["postgresql", "postgres", "PostgreSQL", "mysql", "http", ""]))
    sep = draw(st.sampled_from(["://", "://", "://", ":/", ""]))
    user = draw(
        st.sampled_from(["user", "", "u%40x", "\u00fcser"]) | st.text(printable_char, max_size=6)
    )
    secret = draw(st.none() | password)
    host = draw(
        st.sampled_from(
            ["host", "127.0.0.1", "[::1]", "[::1", "h1,h2:5433", "", "h\u00f6st", "h st"]
        )
        | st.text(printable_char | url_special, max_size=8)
    )
    port = draw(
        st.none()
        | st.sampled_from(["5432", "0", "65535", "65536", "99999999", "abc", ""])
        | st.integers(min_value=-5, max_value=70_000).map(str)
    )
    database = draw(st.none() | st.sampled_from(["db", "", "d/b", "d@b"]))
    query = draw(
        st.none()
        | st.sampled_from(
            [
                "sslmode=require",
                "sslmode=bogus",
                "password=qpw12345678",
                "port=1,2",
                "port=0",
                "a",
                "a=1&b",
                "&&",
                "a=1&a=2",
            ]
        )
        | st.text(printable_char | url_special, max_size=12)
    )
    userinfo = user + ("" if secret is None else f":{secret}")
    return "".join(
        [
            scheme,
            sep,
            f"{userinfo}@" if userinfo else "",
            host,
            "" if port is None else f":{port}",
            "" if database is None else f"/{database}",
            "" if query is None else f"?{query}",
        ]
    )


env_values = st.one_of(
    st.text(any_char, max_size=30),
    # Lone surrogates: how Python spells a non-UTF-8 byte of a real environment.
    st.text(st.sampled_from("a_-\udc80\udcff\ud800"), min_size=1, max_size=4),
    st.text(control_char | st.sampled_from("ab_-. "), max_size=10),
    long_texts,
    number_like,
    keywords,
    identifier_like,
    url_like(),
    st.builds(lambda pad, value: pad + value + pad, st.sampled_from([" ", "\t", "\n"]), keywords),
)
unknown_names = st.text(string.ascii_uppercase + string.digits + "_", min_size=1, max_size=20).map(
    lambda tail: f"LANE_WORKER_{tail}"
)
environments = st.dictionaries(
    st.sampled_from(FUZZED_VARIABLES) | unknown_names, env_values, max_size=len(FUZZED_VARIABLES)
)


def _settable(value: str) -> str:
    """The value as a real process environment can hold it: no NUL, surrogates only as bytes.

    A non-UTF-8 byte of the environment reaches Python as a lone surrogate U+DC80..U+DCFF
    (surrogateescape); other lone surrogates cannot be set.
    """
    return "".join(
        c
        for c in value
        if c != "\x00" and (c < "\ud800" or "\udc80" <= c <= "\udcff" or c > "\udfff")
    )


process_environments = environments.map(lambda env: {k: _settable(v) for k, v in env.items()})


# --- strategies: command lines -------------------------------------------------------------

arg_text = st.one_of(
    st.text(any_char, max_size=20),
    st.text(printable_char, max_size=20),
    st.sampled_from(["", " ", "-", "--", "-x", "--json", "--help", "--input", "\x00", "\udc80"]),
    long_texts,
)
no_nul_no_surrogate = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
clean_text = st.text(no_nul_no_surrogate, max_size=12)
clean_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**100), max_value=10**100),
    st.floats(allow_nan=False, allow_infinity=False),
    clean_text,
)
clean_json = st.recursive(
    clean_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(clean_text, children, max_size=4)
    ),
    max_leaves=12,
)
clean_objects = st.dictionaries(clean_text, clean_json, max_size=5)
dirty_scalars = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.text(any_char, max_size=6).map(lambda s: s + "\x00"),
    st.text(any_char, max_size=6).map(lambda s: s + "\ud800"),
)
any_json = st.recursive(
    clean_scalars | dirty_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(any_char, max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


json_texts = st.one_of(
    st.builds(
        lambda value, ascii_only: json.dumps(value, ensure_ascii=ascii_only),
        any_json,
        st.booleans(),
    ),
    clean_objects.map(json.dumps),
    st.builds(_nested, st.integers(0, MAX_JSON_DEPTH), st.sampled_from(["list", "object"])),
    st.builds(_nested, st.integers(0, MAX_JSON_DEPTH), st.just("list")).map(
        lambda text: '{"a":' + text + "}"
    ),
    st.integers(min_value=1, max_value=6000).map(lambda n: '{"n": ' + "7" * n + "}"),
    arg_text,
    st.sampled_from(
        ["-", "@", "@/", "@/dev/null", "@/nonexistent/input.json", "NaN", "Infinity", "-Infinity",
         '{"a": NaN}', '{"a": -Infinity}', "null", "{}", "[]", '{"\\u0000": 1}', '{"a": "\\u0000"}',
         '{"a": "\\ud800"}', '{"\\udc80": 1}', "\ufeff{}", '{"a": 1', "{'a': 1}", '{"a": 1e999}',
         '{"a": 1, "a": 2}', " {} ", "\x00"]
    ),
)  # fmt: skip
stdin_bytes = st.one_of(
    st.just(b""),
    json_texts.map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=40),
)
timeout_texts = st.one_of(
    number_like, arg_text, st.sampled_from(["0", "0.0", "1e-3", " 2 ", "9" * 400])
)
release_texts = st.one_of(
    arg_text,
    keywords,
    st.integers(min_value=190, max_value=5000).map(lambda n: "r" * n),
    st.sampled_from(["release-2026.12.02", "Release-2026.12.02", "dev", "dev-x", "...", " "]),
)
run_ids = st.one_of(arg_text, st.uuids().map(str), st.uuids().map(lambda u: str(u).upper()))
json_flag = st.lists(st.just("--json"), max_size=1)


def _options(
    draw: st.DrawFn, choices: Sequence[tuple[str, st.SearchStrategy[str] | None]]
) -> list[str]:
    groups: list[list[str]] = []
    for option, values in choices:
        if draw(st.booleans()):
            groups.append([option] if values is None else [option, draw(values)])
    return [arg for group in draw(st.permutations(groups)) for arg in group]


def _place(draw: st.DrawFn, options: list[str], positional: list[str]) -> list[str]:
    """Put the positional arguments among the options (sometimes after ``--``)."""
    at = draw(st.integers(0, len(options)))
    dashes = ["--"] if positional and draw(st.integers(0, 9)) == 0 else []
    if dashes:
        return [*options, *dashes, *positional]
    return [*options[:at], *positional, *options[at:]]


@st.composite
def submit_argv(draw: st.DrawFn) -> list[str]:
    options = _options(
        draw,
        [
            ("--input", json_texts),
            ("--idempotency-key", arg_text),
            ("--queue-suffix", release_texts),
            ("--timeout", timeout_texts),
            ("--wait", None),
            ("--json", None),
        ],
    )
    play = draw(st.lists(arg_text | st.sampled_from(["greet", " p ", "x" * 201]), max_size=2))
    return ["submit", *_place(draw, options, play)]


@st.composite
def signal_argv(draw: st.DrawFn) -> list[str]:
    options = _options(draw, [("--data", json_texts), ("--json", None)])
    positional = draw(st.lists(run_ids, max_size=3))
    return ["signal", *_place(draw, options, positional)]


@st.composite
def run_argv(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["cancel", "status"]))
    positional = draw(st.lists(run_ids, max_size=2))
    return [command, *_place(draw, draw(json_flag), positional)]


@st.composite
def lanes_argv(draw: st.DrawFn) -> list[str]:
    head = ["lanes", *draw(json_flag)]
    sub = draw(st.sampled_from([None, "retire", "activate", "show", "wait"]))
    if sub is None:
        return head
    flags = {"retire": "--force", "activate": "--force", "show": "--json", "wait": "--timeout"}
    options = _options(
        draw, [(flags[sub], timeout_texts if sub == "wait" else None), ("--json", None)]
    )
    return [*head, sub, *_place(draw, options, draw(st.lists(release_texts, max_size=2)))]


COMMAND_WORDS = [
    "submit", "signal", "cancel", "status", "lanes", "retire", "activate", "show", "wait", "doctor",
    "--json", "--input", "--data", "--wait", "--timeout", "--force", "--queue-suffix",
    "--idempotency-key", "--help", "-h", "--", "-", "migrate",
]  # fmt: skip
# `run` and `dev` start a daemon (and `dev` an embedded PostgreSQL): not fuzzed here.
garbage_argv = st.lists(st.sampled_from(COMMAND_WORDS) | arg_text, max_size=6).filter(
    lambda argv: not {"run", "dev"} & set(argv)
)
any_argv = st.one_of(submit_argv(), signal_argv(), run_argv(), lanes_argv(), garbage_argv)


# --- helpers -------------------------------------------------------------------------------


def _cleared_environment() -> dict[str, str | None]:
    """Unset (for CliRunner) every variable of the contract the test process itself has."""
    return {
        name: None
        for name in os.environ
        if name in KNOWN_VARIABLES or name.startswith(("LANE_WORKER_", "DEEPLINE_"))
    }


def invoke(argv: Sequence[str], env: Mapping[str, str], stdin: bytes = b"") -> Result:
    """Run ``lane-worker ARGV`` in process with exactly ``env`` for the contract's variables."""
    return CliRunner().invoke(
        cli,
        list(argv),
        env=_cleared_environment() | dict(env),
        input=stdin,
        prog_name="lane-worker",
    )


def assert_documented_exit(result: Result) -> None:
    """No traceback, a documented exit code, and each kind of failure said the documented way."""
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{exc!r} escaped: {result.exc_info}"
    assert result.exit_code in DOCUMENTED_EXIT_CODES, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    if lines and _json_refusal(lines[-1], result.exit_code):  # --json: the one JSON object
        assert len(lines) == 1, result.stderr
    elif result.exit_code == 2:
        # A click usage error ("Error: ..."; a bare group prints its usage and help), or an
        # InvalidRequestError found after parsing ("lane-worker: ...").
        said = "Error:" in result.stderr or result.stderr.startswith("Usage:")
        assert said or lines[-1].startswith("lane-worker:"), result.output
    elif result.exit_code in (1, 78):
        assert lines, result.output
        assert lines[-1].startswith("lane-worker:"), result.output


def _json_refusal(line: str, exit_code: int) -> bool:
    """Whether ``line`` is the JSON refusal ``--json`` asks for, with the exit code."""
    try:
        said = json.loads(line)
    except ValueError:
        return False
    return isinstance(said, dict) and said.get("error", {}).get("exitCode") == exit_code


def assert_one_bounded_line(message: str, env: Mapping[str, str]) -> None:
    """One non-blank line, of bounded length, quoting at most 100 characters of any value."""
    assert message.strip()
    assert len(message.splitlines()) == 1, message
    assert len(message) <= MAX_MESSAGE_CHARS, message
    # shown() marks a cut value with '...', which a value of dots would run into.
    quoted = message.replace("...'", "'").replace('..."', '"')
    for value in env.values():
        assert not any(window in quoted for window in _windows(value)), message


@functools.lru_cache(maxsize=64)
def _windows(value: str) -> frozenset[str]:
    """Every distinct run of 101 consecutive characters of ``value``."""
    width = SHOWN_CHARS + 1
    return frozenset(value[start : start + width] for start in range(len(value) - width + 1))


_ASCII_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


def _is_ascii_decimal(text: str) -> bool:
    return bool(_ASCII_DECIMAL.fullmatch(text))


def _strings(value: Any) -> list[str]:
    """Every string in a parsed JSON document, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    return []


# --- 1. the environment parser -------------------------------------------------------------


@ENV_FAST
@given(env=environments)
@example(env={SCHEMA: "a\nb", DEPLOY: "DEV\x00" + "\U000e0001" * 200})
@example(env={"LANE_WORKER_CONCURRENCY": "9" * 4300, "VERCEL": "\u2028"})
@example(env={SUFFIX: "." * 101})  # 100 dots quoted, then shown()'s "..."
def test_diagnose_never_raises_and_names_a_known_variable_in_one_line(env: dict[str, str]) -> None:
    """diagnose() returns for any environment; each problem is one short line naming a variable."""
    assume(env_known_bug(env) is None)
    diagnosis = config.diagnose(env)
    for error in diagnosis.errors:
        assert type(error) is LaneConfigError
        assert error.variable in KNOWN_VARIABLES, error
        assert_one_bounded_line(str(error), env)
    for warning in diagnosis.warnings:
        assert_one_bounded_line(warning, env)
    assert diagnosis.exit_code == (78 if diagnosis.errors else 0)
    json.dumps(diagnosis.as_json())  # what doctor --json prints


@ENV_FAST
@given(env=environments)
def test_settings_from_env_raises_only_lane_config_error(env: dict[str, str]) -> None:
    """The boot guard refuses with a LaneConfigError naming a variable, or returns Settings."""
    assume(env_known_bug(env) is None)
    refusal: LaneConfigError | None = None
    try:
        settings_ = config.Settings.from_env(env)
    except LaneConfigError as exc:
        refusal = exc
    errors = config.diagnose(env).errors
    if refusal is not None:
        assert refusal.variable in KNOWN_VARIABLES
        assert errors[0].variable == refusal.variable
    else:
        assert not errors
        secrets = dburl.url_secrets(settings_.database_url)
        assert not any(secret in repr(settings_) for secret in secrets)


@ENV_CLI
@given(env=process_environments, as_json=st.booleans())
def test_doctor_exits_0_or_78_without_traceback(env: dict[str, str], as_json: bool) -> None:
    """doctor exits with diagnose's code; each error is one `lane-worker:` line on stderr."""
    assume(env_known_bug(env) is None)
    result = invoke(["doctor", *(["--json"] if as_json else [])], env)
    assert_documented_exit(result)
    assert result.exit_code == config.diagnose(env).exit_code
    errors = result.stderr.splitlines()
    assert (result.exit_code == 78) == bool(errors)
    if as_json:  # the report on stdout; a refusal is one JSON object on stderr
        assert json.loads(result.stdout)["exitCode"] == result.exit_code
        assert all(json.loads(line)["error"]["exitCode"] == 78 for line in errors)
        assert len(errors) <= 1, result.stderr
    else:
        assert all(line.startswith("lane-worker: ") for line in errors), result.stderr


@functools.cache
def _doctor_text_without_password() -> str:
    """What doctor prints when the URL carries no password: nothing in it is a leak."""
    env = {DATABASE_URL: "postgresql://user@host:5432/db"}
    return invoke(["doctor"], env).output + invoke(["doctor", "--json"], env).output


@SECRETS
@given(password=passwords.map(_settable).filter(lambda pw: len(pw) >= 8), as_json=st.booleans())
@example(password="hunter2%2Fhunter2", as_json=False)
@example(password="00001?0=", as_json=True)  # a port, then a query (B4)
def test_no_output_shows_the_database_password(password: str, as_json: bool) -> None:
    """Neither diagnose's messages nor doctor's output hold the URL's password, raw or decoded."""
    env = {DATABASE_URL: f"postgresql://user:{password}@host:5432/db"}
    baseline = _doctor_text_without_password()
    secrets = {s for s in (password, unquote(password)) if len(s) >= 8 and s not in baseline}
    diagnosis = config.diagnose(env)
    said = [str(e) for e in diagnosis.errors] + list(diagnosis.warnings)
    said += _strings(diagnosis.as_json())
    result = invoke(["doctor", *(["--json"] if as_json else [])], env)
    assert_documented_exit(result)
    said.append(result.output)
    if as_json:
        said += _strings(json.loads(result.stdout))
    for secret in secrets:
        assert not any(secret in text for text in said), (secret, said)


@pytest.mark.parametrize(
    "variables",
    [
        # Everything but the suffix, which outranks the deploy version.
        [name for name in KNOWN_VARIABLES if name != SUFFIX],
        [SUFFIX],
    ],
    ids=["all-but-suffix", "suffix"],
)
def test_doctor_in_a_process_with_non_utf8_bytes(variables: list[str]) -> None:
    """Non-UTF-8 bytes (surrogateescape in Python) are refused or shown: never a traceback."""
    result = _doctor_process({name.encode(): b"ab\x80c\xff" for name in variables})
    assert result.returncode in (0, 78), result.stderr
    assert b"Traceback" not in result.stdout + result.stderr, result.stderr


def _doctor_process(extra: Mapping[bytes, bytes]) -> subprocess.CompletedProcess[bytes]:
    env = {
        b"PATH": os.environb.get(b"PATH", b""),
        b"LANG": b"C.UTF-8",
        DATABASE_URL.encode(): b"postgresql://u:p@h:5432/db",
    }
    return subprocess.run(
        [sys.executable, "-m", "worker", "doctor"],
        cwd=REPO,
        env=env | dict(extra),
        capture_output=True,
        timeout=60,
        check=False,
    )


# --- 2. the command line -------------------------------------------------------------------

REFUSED_ENV = {DATABASE_URL: REFUSED_URL}


@CLI
@given(argv=any_argv, stdin=stdin_bytes)
@example(argv=["submit", "p", "--input", "-"], stdin=b'{"a": "\xff"}')
@example(argv=["submit", "p", "--input", "@/"], stdin=b"")
@example(argv=["lanes", "retire", "r" * 5000], stdin=b"")
def test_every_command_line_exits_with_a_documented_code(argv: list[str], stdin: bytes) -> None:
    """Any argv (and stdin): no traceback, exit 0/1/2/78, and the refused URL's password unsaid."""
    result = invoke(argv, REFUSED_ENV, stdin)
    assert_documented_exit(result)
    # Nothing here reaches a database: the command line is refused (2) or the URL is (78).
    assert result.exit_code in (0, 2, 78), result.output
    assert REFUSED_SECRET not in result.output


@ORACLE
@given(value=clean_objects | st.none(), ascii_only=st.booleans())
def test_a_storable_json_object_is_accepted_as_input(value: Any, ascii_only: bool) -> None:
    """A JSON object of storable values (or null) passes --input: the URL refusal (78) follows."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    result = invoke(["submit", "greet", "--input", text], REFUSED_ENV)
    assert_documented_exit(result)
    assert result.exit_code == 78, result.output


@ORACLE
@given(
    value=any_json,
    command=st.sampled_from(["submit", "signal"]),
    ascii_only=st.booleans(),
    overflow=st.booleans(),
)
def test_input_and_data_refuse_what_cannot_be_stored(
    value: Any, command: str, ascii_only: bool, overflow: bool
) -> None:
    """--input takes an object, --data any value; NaN, infinity, NUL, lone surrogates: exit 2."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    if overflow:  # infinity spelled as a number that overflows, not as a JSON constant
        text = text.replace("Infinity", "1e999")
    storable = not any(_unstorable(v) for v in _scalars(value))
    if command == "submit":
        argv = ["submit", "greet", "--input", text]
        usable = storable and isinstance(value, dict | None)
    else:
        argv = ["signal", "00000000-0000-0000-0000-000000000000", "ev", "--data", text]
        usable = storable
    result = invoke(argv, REFUSED_ENV)
    assert_documented_exit(result)
    assert result.exit_code == (78 if usable else 2), result.output


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [s for item in value for s in _scalars(item)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_scalars(v)]]
    return [value]


def _unstorable(scalar: Any) -> bool:
    if isinstance(scalar, float):
        return not math.isfinite(scalar)
    return isinstance(scalar, str) and ("\x00" in scalar or _has_surrogate(scalar))


@ORACLE
@given(timeout=timeout_texts)
@example(timeout="1" + "0" * 309)  # overflows to infinity (B6)
@example(timeout="0." + "0" * 400 + "1")  # underflows to 0
def test_timeout_is_refused_unless_a_finite_number_above_zero(timeout: str) -> None:
    """--wait --timeout T: exit 2 unless T is a finite ASCII decimal above 0 (then 78)."""
    text = timeout.strip()
    number = float(text) if _is_ascii_decimal(text) else math.nan
    result = invoke(["submit", "greet", "--wait", "--timeout", timeout], REFUSED_ENV)
    assert_documented_exit(result)
    if not 0 < number < math.inf:
        assert result.exit_code == 2, result.output
    elif len(text) <= 20:
        assert result.exit_code == 78, result.output
    # A finite decimal of more than 20 characters may be refused as absurd, or accepted.


@ORACLE
@given(
    key=arg_text
    | st.integers(min_value=250, max_value=260).map(lambda n: " k" * (n // 2) + "k" * (n % 2))
)
def test_idempotency_keys_are_refused_as_documented(key: str) -> None:
    """A key is usable iff non-blank, at most 255 characters, no NUL, no lone surrogate."""
    usable = bool(key.strip()) and len(key) <= 255 and not _unstorable(key)
    result = invoke(["submit", "greet", "--idempotency-key", key], REFUSED_ENV)
    assert_documented_exit(result)
    assert result.exit_code == (78 if usable else 2), result.output


# --- bugs these properties found: minimal counterexamples ----------------------------------
# B1..B6 were found on the tree this file was written against; all are fixed.

URL_OK = "postgresql://u:p@h:5432/db"


def test_bug_b1_schema_with_a_lone_surrogate() -> None:
    """A non-UTF-8 byte in the schema (os.environ holds it as a lone surrogate) is refused."""
    diagnosis = config.diagnose({DATABASE_URL: URL_OK, SCHEMA: "\udc80"})
    assert [e.variable for e in diagnosis.errors][:1] == [SCHEMA]


def test_bug_b1_doctor_schema_with_a_non_utf8_byte() -> None:
    """In a process: `DEEPLINE_RUNTIME_SCHEDULER_SCHEMA=$'\\x80' lane-worker doctor` exits 78."""
    result = _doctor_process({SCHEMA.encode(): b"\x80"})
    assert result.returncode == 78, result.stderr
    assert b"Traceback" not in result.stderr


def test_bug_b2_whole_number_of_4301_digits() -> None:
    """A whole-number variable past int()'s 4300-digit limit is refused, not a ValueError."""
    diagnosis = config.diagnose({DATABASE_URL: URL_OK, "LANE_WORKER_CONCURRENCY": "9" * 4301})
    assert [e.variable for e in diagnosis.errors] == ["LANE_WORKER_CONCURRENCY"]


@pytest.mark.parametrize("password", ["0000000[", "pa]ssword"])
def test_bug_b3_bracket_in_the_password(password: str) -> None:
    """A '[' or ']' in the password is refused (it made urlsplit raise ValueError)."""
    diagnosis = config.diagnose({DATABASE_URL: f"postgresql://user:{password}@host:5432/db"})
    assert [e.variable for e in diagnosis.errors] == [DATABASE_URL]


@pytest.mark.parametrize("password", ["00001?0=", "12345?x=yyyy", "1234/a?b=c"])
def test_bug_b4_password_read_as_a_port(password: str) -> None:
    """A password whose head reads as a port ('00001') and tail as a query is never shown."""
    env = {DATABASE_URL: f"postgresql://user:{password}@host:5432/db"}
    result = invoke(["doctor"], env)
    assert_documented_exit(result)
    assert password not in result.output


@pytest.mark.parametrize("option", ["--input", "--data"])
def test_bug_b5_deeply_nested_json(option: str) -> None:
    """JSON nested 1000 deep is a usage error (exit 2), not a RecursionError traceback."""
    command = ["submit", "p"] if option == "--input" else ["signal", str(uuid.UUID(int=0)), "k"]
    result = invoke([*command, option, _nested(1000, "list")], REFUSED_ENV)
    assert_documented_exit(result)
    assert result.exit_code == 2, result.output


def test_bug_b6_timeout_that_overflows_to_infinity() -> None:
    """`--wait --timeout 1e309` spelled in digits is no finite number of seconds: exit 2."""
    result = invoke(["submit", "p", "--wait", "--timeout", "1" + "0" * 309], REFUSED_ENV)
    assert_documented_exit(result)
    assert result.exit_code == 2, result.output
