"""The CLI's argument checks and its exception-to-exit-code mapping, without a database."""

from __future__ import annotations

import asyncpg
import pytest
from click.testing import CliRunner

from worker.cli import cli
from worker.cli.exits import ConfigRefused, Failure, failure_for, scrub
from worker.errors import (
    EngineSchemaError,
    LaneConfigError,
    RunNotFoundError,
    StoreSchemaError,
)

URL = "postgresql://app:hunter2@db:5432/runtime"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (LaneConfigError("bad lane"), 78),
        (EngineSchemaError("too new", found="9", expected="1"), 78),
        (StoreSchemaError("unknown migration", found=9, known=1), 78),
        (RunNotFoundError("no run x"), 1),
        (ConnectionRefusedError(111, "Connection refused"), 1),
        (TimeoutError(), 1),
        (asyncpg.UndefinedTableError('relation "runs" does not exist'), 1),
        (asyncpg.InvalidPasswordError("password authentication failed"), 1),
        (RuntimeError("boom"), 1),
    ],
)
def test_failure_for_maps_each_error_to_its_exit_code(exc: Exception, code: int) -> None:
    """Config, engine and store schema errors exit 78; everything else exits 1."""
    failure = failure_for(exc, URL)
    assert isinstance(failure, Failure)
    assert failure.exit_code == code
    assert (code == 78) == isinstance(failure, ConfigRefused)
    assert "\n" not in failure.format_message()


def test_failure_for_never_echoes_the_password() -> None:
    """A driver message that repeats the URL or the password is scrubbed."""
    failure = failure_for(RuntimeError(f"could not use {URL} (password hunter2)"), URL)
    assert "hunter2" not in failure.format_message()
    assert "app:***@db" in failure.format_message()


def test_unreachable_names_the_host_not_the_password() -> None:
    """A connection error names the redacted URL and the reason."""
    message = failure_for(ConnectionRefusedError(111, "Connection refused"), URL).format_message()
    assert message.startswith("cannot reach the runtime database at postgresql://app:***@db:5432")
    assert "Connection refused" in message


def test_missing_schema_points_at_migrate() -> None:
    """A missing store table tells the operator to run migrate."""
    message = failure_for(asyncpg.UndefinedTableError("no relation"), URL).format_message()
    assert "lane-worker migrate" in message


def test_scrub_leaves_text_without_secrets_alone() -> None:
    """Scrubbing text that holds neither URL nor password changes nothing."""
    assert scrub("plain words", URL) == "plain words"
    assert scrub("plain words", "") == "plain words"


RUN = "9b6c1f2e-5d4a-4e3b-8c7d-0a1b2c3d4e5f"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["submit", "p", "--input", "{"], "is not valid JSON"),
        (["signal", RUN, "k", "--data", "nope"], "is not valid JSON"),
        (["signal", "r", "k"], "'r' is not a run id: give the full run id"),
        (["submit", "p", "--max-attempts", "0"], "0 is not in the range 1<=x<=1000"),
        (["submit", "p", "--release", "..."], "names no lane"),
        (["submit", " "], "needs a play name"),
        (["submit", "p", "--idempotency-key", " "], "must be a non-blank string"),
        (["submit", "p", "--queue-suffix", "..."], "names no queue"),
        (["submit", "p", "--timeout", "3"], "only applies together with --wait"),
        (["lanes", "retire", "..."], "names no lane"),
        (["lanes", "activate", " "], "must not be blank"),
        (["run", "--app", "module.only"], "is not MODULE:ATTRIBUTE"),
        (["run", "--app", "myproj.plays"], "(for example myproj.plays:app, if the App is named"),
        (["run", "--app", "myproj/plays.py"], "(for example myproj.plays:app, if the App"),
    ],
)
def test_unusable_arguments_exit_2_before_any_connection(args: list[str], needle: str) -> None:
    """Bad arguments are usage errors (exit 2) found before the environment is even read."""
    result = CliRunner().invoke(cli, args, env={"WORKFLOW_RUNTIME_POSTGRES": ""})
    assert result.exit_code == 2, result.output
    assert needle in result.output


def test_lanes_group_lists_its_subcommands_in_help() -> None:
    """`lanes --help` shows --json and both subcommands."""
    result = CliRunner().invoke(cli, ["lanes", "--help"])
    assert result.exit_code == 0
    for word in ("--json", "retire", "activate"):
        assert word in result.output
