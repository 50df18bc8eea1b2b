"""Fuzz the CLI's database commands against a real PostgreSQL (hypothesis).

The requirement: no traceback, every exit code documented (0 success, 1 failure, 2 usage
error, 78 configuration refused). ``tests/unit/test_fuzz_input.py`` fuzzes the parsing with
a refused URL; here the same commands reach a real database, so the arguments are mostly
well formed (a run id that exists, a release that has a lane, a key used before) with
garbage mixed in. One database for the module, migrated once by ``lane-worker migrate``,
on a dedicated store schema and queue suffix.

How each property can fail: a command that lets an exception through (``result.exception``
is then no ``SystemExit``), exits with an undocumented code, prints a refusal or failure
without the ``lane-worker:`` prefix, prints ``--json`` output that is not one JSON object, or
echoes the database password.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence

import pytest
import structlog
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from support.cli import said_line
from support.pgfixture import DatabaseFactory
from worker.cli import cli
from worker.config import dburl

STORE_SCHEMA = "fuzz_cli_store"
QUEUE_SUFFIX = "fuzz_cli"
CONTRACT_PREFIXES = ("LANE_WORKER_", "DEEPLINE_", "WORKFLOW_RUNTIME_POSTGRES", "VERCEL")
DOCUMENTED_EXIT_CODES = {0, 1, 2, 78}
# Each example opens a connection or two: keep the module to a few seconds.
DB = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def invoke(argv: Sequence[str], env: Mapping[str, str], stdin: bytes = b"") -> Result:
    """Run ``lane-worker ARGV`` in process with exactly ``env`` for the contract's variables."""
    cleared: dict[str, str | None] = {
        name: None for name in os.environ if name.startswith(CONTRACT_PREFIXES)
    }
    return CliRunner().invoke(
        cli, list(argv), env=cleared | dict(env), input=stdin, prog_name="lane-worker"
    )


def assert_documented_exit(result: Result) -> None:
    """No traceback, a documented exit code, and each kind of failure said the documented way."""
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{exc!r} escaped: {result.exc_info}"
    assert result.exit_code in DOCUMENTED_EXIT_CODES, result.output
    assert "Traceback" not in result.output
    lines = [said_line(line) for line in result.stderr.splitlines()]  # --json: its object
    if result.exit_code == 2:
        # A click usage error, or an InvalidRequestError found after parsing.
        said = "Error:" in result.stderr or result.stderr.startswith("Usage:")
        assert said or lines[-1].startswith("lane-worker:"), result.output
    elif result.exit_code in (1, 78):
        assert lines, result.output
        assert lines[-1].startswith("lane-worker:"), result.output


@pytest.fixture(scope="module")
def fuzz_env(pg_databases: DatabaseFactory) -> Iterator[dict[str, str]]:
    """A migrated database on its own store schema and queue, with one submitted run."""
    saved = structlog.get_config()  # every database command reconfigures structlog
    with pg_databases.fresh_database() as url:
        env = {
            "WORKFLOW_RUNTIME_POSTGRES": url,
            "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": STORE_SCHEMA,
            "DEEPLINE_ABSURD_QUEUE_SUFFIX": QUEUE_SUFFIX,
        }
        try:
            migrated = invoke(["migrate"], env)
            assert migrated.exit_code == 0, migrated.output
            yield env
        finally:
            structlog.configure(**saved)


@pytest.fixture(scope="module")
def run_id(fuzz_env: dict[str, str]) -> str:
    """The id of a run submitted to the fuzz queue (no worker runs it: it stays pending)."""
    result = invoke(["submit", "greet", "--input", '{"name": "ada"}', "--json"], fuzz_env)
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["runId"])


# --- strategies ----------------------------------------------------------------------------

# Lone surrogates only as a real command line has them: U+DC80..U+DCFF, the
# surrogateescape spelling of a non-UTF-8 byte. NUL and control characters stay.
text_char = st.characters(exclude_categories=["Cs"]) | st.characters(
    min_codepoint=0xDC80, max_codepoint=0xDCFF
)
arg_text = st.one_of(
    st.text(text_char, max_size=16),
    st.sampled_from(["", " ", "-", "--", "--json", "\x00", "x" * 256, "r" * 201]),
)
clean_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8
)
clean_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | clean_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(clean_text, children, max_size=3)
    ),
    max_leaves=8,
)
good_objects = st.dictionaries(clean_text, clean_json, max_size=4).map(json.dumps)
good_json = clean_json.map(json.dumps)
json_texts = st.one_of(
    good_objects,
    good_json,
    st.sampled_from(['{"a": NaN}', '{"a": "\\u0000"}', "[1]", "{", "null", "-", "@/nonexistent"]),
    arg_text,
)
good_keys = st.sampled_from(["order-1", "order-2", "k"])
keys = good_keys | arg_text
good_suffixes = st.sampled_from([QUEUE_SUFFIX, "fuzz_cli_other", "Fuzz CLI Other", "..."])
suffixes = good_suffixes | arg_text
good_releases = st.sampled_from([f"dev-{QUEUE_SUFFIX}", "fuzz-release-a", "Fuzz.Release.A", "dev"])
wait_timeouts = st.sampled_from(["0.05", "0.2", ".1", "0", "-1", "nan", "1e3", "soon"])
run_ids = st.uuids().map(str) | st.uuids().map(lambda u: u.hex.upper()) | arg_text


def _options(
    draw: st.DrawFn, choices: Sequence[tuple[str, st.SearchStrategy[str] | None]]
) -> list[str]:
    picked: list[list[str]] = []
    for option, values in choices:
        if draw(st.booleans()):
            picked.append([option] if values is None else [option, draw(values)])
    return [arg for group in draw(st.permutations(picked)) for arg in group]


@st.composite
def commands(draw: st.DrawFn, real_run_id: str) -> list[str]:
    """A command line for one of the database commands: three in four well formed."""

    def pick(good: st.SearchStrategy[str], any_: st.SearchStrategy[str]) -> str:
        return draw(good if well_formed else good | any_)

    well_formed = draw(st.integers(0, 3)) > 0
    kind = draw(st.sampled_from(["submit", "signal", "cancel", "status", "lanes", "retire",
                                 "activate", "show", "wait", "garbage"]))  # fmt: skip
    json_value = good_json if well_formed else json_texts
    run_id = pick(st.sampled_from([real_run_id, str(uuid.UUID(int=0))]), run_ids)
    release = pick(good_releases, arg_text)
    if kind == "submit":
        options = _options(
            draw,
            [("--input", good_objects if well_formed else json_texts),
             ("--idempotency-key", good_keys if well_formed else keys),
             ("--queue-suffix", good_suffixes if well_formed else suffixes), ("--json", None)],
        )  # fmt: skip
        if draw(st.booleans()):  # a short wait: no worker runs the run, so it times out
            options += ["--wait", "--timeout", draw(wait_timeouts)]
        return ["submit", pick(st.sampled_from(["greet", "approval"]), arg_text), *options]
    if kind == "signal":
        event = pick(st.sampled_from(["approved", "k"]), arg_text)
        return [
            "signal",
            run_id,
            event,
            *_options(draw, [("--data", json_value), ("--json", None)]),
        ]
    if kind in ("cancel", "status"):
        return [kind, run_id, *_options(draw, [("--json", None)])]
    if kind == "lanes":
        return ["lanes", *_options(draw, [("--json", None)])]
    if kind in ("retire", "activate"):
        options = _options(draw, [("--force", None), ("--json", None)])
        return ["lanes", kind, release, *options]
    if kind == "show":
        return ["lanes", "show", release, *_options(draw, [("--json", None)])]
    if kind == "wait":  # a short wait: a retired lane with pending runs does not drain here
        options = _options(draw, [("--json", None)])
        return ["lanes", "wait", release, "--timeout", draw(wait_timeouts), *options]
    words = st.sampled_from(["submit", "signal", "cancel", "status", "lanes", "retire",
                             "activate", "show", "--json", "--force", real_run_id])  # fmt: skip
    argv = draw(st.lists(words | arg_text, max_size=5))
    # `run` and `dev` start a daemon (and `dev` an embedded PostgreSQL), and `lanes wait`
    # without --timeout may wait 15 minutes: not fuzzed here.
    return [word for word in argv if word not in ("run", "dev", "wait")]


# --- the property --------------------------------------------------------------------------


# Options whose value click takes from the next word, even one spelled like a flag.
_VALUED = {"--input", "--idempotency-key", "--queue-suffix", "--timeout", "--data", "--status",
           "--lane", "--play", "--limit", "--reason", "--to", "--older-than"}  # fmt: skip


def _json_flag(argv: list[str]) -> bool:
    """Tell whether ``--json`` is a flag in ``argv``.

    Not the value of the option before it, nor an argument after ``--``.
    """
    flags = argv[: argv.index("--")] if "--" in argv else argv
    return any(
        word == "--json" and (i == 0 or flags[i - 1] not in _VALUED) for i, word in enumerate(flags)
    )


@DB
@given(data=st.data())
def test_database_commands_exit_with_a_documented_code(
    fuzz_env: dict[str, str], run_id: str, data: st.DataObject
) -> None:
    """Any command against a real database: no traceback, exit 0/1/2/78, --json is JSON."""
    argv = data.draw(commands(run_id), label="argv")
    result = invoke(argv, fuzz_env)
    known = ("submit", "signal", "cancel", "status", "lanes")
    event(f"{argv[0] if argv and argv[0] in known else 'other'} exit {result.exit_code}")
    assert_documented_exit(result)
    if result.exit_code == 0 and _json_flag(argv) and "--help" not in argv and "-h" not in argv:
        report = json.loads(result.stdout)
        assert isinstance(report, dict)
    secrets = dburl.url_secrets(fuzz_env["WORKFLOW_RUNTIME_POSTGRES"])
    assert not any(secret in result.output for secret in secrets)


def test_each_outcome_of_the_database_commands(fuzz_env: dict[str, str]) -> None:
    """Fixed command lines through each outcome: ok, ignored, conflict, timeout, unknown."""
    submitted = invoke(["submit", "greet", "--json"], fuzz_env)
    assert submitted.exit_code == 0, submitted.output
    run = str(json.loads(submitted.stdout)["runId"])
    steps = [
        (["status", run, "--json"], 0),
        (["signal", run, "approved", "--data", '{"by": "ada"}'], 0),
        (["signal", run, "approved", "--data", '{"by": "bob"}'], 0),  # duplicate: ignored
        (["submit", "greet", "--idempotency-key", "fuzz-same", "--input", '{"a": 1}'], 0),
        (["submit", "greet", "--idempotency-key", "fuzz-same", "--input", '{"a": 2}'], 1),
        (["submit", "greet", "--wait", "--timeout", "0.05"], 1),  # no worker: times out
        (["lanes", "retire", "fuzz-never-seen"], 1),  # no lane ever had it
        (["lanes", "retire", "fuzz-never-seen", "--force", "--json"], 0),
        (["lanes", "activate", "Fuzz.Never.Seen"], 0),  # another spelling of the same lane
        (["lanes", "--json"], 0),
        (["lanes", "show", "fuzz-never-seen", "--json"], 0),
        (["lanes", "wait", "fuzz-never-seen", "--timeout", "0.2"], 1),  # claiming: never drains
        (["lanes", "retire", "fuzz-never-seen"], 0),
        (["lanes", "wait", "fuzz-never-seen", "--timeout", "0.2"], 0),  # nothing on it: drained
        (["cancel", run], 0),
        (["cancel", run], 0),  # already cancelled: nothing to do
        (["signal", run, "late"], 0),  # the run has ended: ignored
        (["status", "not-a-uuid"], 2),  # not a run id: a usage error
        (["status", str(uuid.UUID(int=1))], 1),
    ]
    for argv, code in steps:
        result = invoke(argv, fuzz_env)
        assert_documented_exit(result)
        assert result.exit_code == code, (argv, result.output)
