"""`lane-worker doctor` as an operator runs it: a real process, real exit codes."""

from __future__ import annotations

import json
import subprocess

import pytest

from support.cli import run_cli

DB = "postgresql://x"


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m worker doctor` with exactly ``env`` (plus PATH)."""
    return run_cli(env, "doctor", *args)


def test_isolated_schema_without_suffix_exits_78_naming_the_suffix() -> None:
    """The issue's acceptance check: an isolated schema and no suffix is refused with 78."""
    result = doctor(
        {"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_123", "WORKFLOW_RUNTIME_POSTGRES": DB}
    )
    assert result.returncode == 78
    assert "DEEPLINE_ABSURD_QUEUE_SUFFIX" in result.stderr
    assert "REFUSED" in result.stdout


def test_isolated_schema_with_suffix_exits_0_on_its_queue() -> None:
    """With the suffix set, doctor exits 0 and shows queue runs_<suffix>."""
    result = doctor(
        {
            "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_123",
            "WORKFLOW_RUNTIME_POSTGRES": DB,
            "DEEPLINE_ABSURD_QUEUE_SUFFIX": "pr_123",
        }
    )
    assert result.returncode == 0, result.stderr
    assert "runs_pr_123" in result.stdout
    assert result.stderr == ""


def test_json_output_is_one_object_with_the_topology() -> None:
    """--json prints one JSON object with the resolved topology and the verdict."""
    result = doctor(
        {
            "WORKFLOW_RUNTIME_POSTGRES": "postgresql://app:hunter2@db:5432/runtime",
            "DEEPLINE_RUNTIME_DEPLOY_VERSION": "Release-2026.12.02",
            "VERCEL": "1",
        },
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # The release id as deployed; its lane is the segment's queue (issue 31 §1).
    assert report["releaseId"] == report["launchReleaseId"] == "Release-2026.12.02"
    assert report["queue"] == "runs_release_2026_12_02"
    assert report["schedulerSchema"] == "runtime_scheduler"
    assert report["isolated"] is False
    assert report["suffixSource"] == "DEEPLINE_RUNTIME_DEPLOY_VERSION"
    assert report["workerPoolSize"] == 2
    assert report["clientPoolSize"] == 1
    assert (report["refused"], report["exitCode"], report["errors"]) == (False, 0, [])
    assert "hunter2" not in result.stdout + result.stderr


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_refusal_lists_every_problem_without_secrets(args: tuple[str, ...]) -> None:
    """A refused configuration names each bad variable, and never prints the password."""
    result = doctor(
        {
            "WORKFLOW_RUNTIME_POSTGRES": "mysql://root:hunter2@db/x",
            "LANE_WORKER_DRAIN_SECONDS": "soon",
        },
        *args,
    )
    assert result.returncode == 78
    assert "WORKFLOW_RUNTIME_POSTGRES" in result.stderr
    assert "LANE_WORKER_DRAIN_SECONDS" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_doctor_never_connects_to_the_database() -> None:
    """Doctor answers at once for a database that does not exist (nothing listens on port 1)."""
    result = doctor({"WORKFLOW_RUNTIME_POSTGRES": "postgresql://u:p@127.0.0.1:1/none"})
    assert result.returncode == 0, result.stderr


def test_help_explains_the_flag() -> None:
    """doctor --help documents --json and the exit code."""
    result = doctor({}, "--help")
    assert result.returncode == 0
    assert "--json" in result.stdout
    assert "78" in result.stdout


@pytest.mark.parametrize(("setting", "shown"), [("true", "no LISTEN"), ("false", "+ 1 LISTEN")])
def test_pool_line_follows_pgbouncer_mode(setting: str, shown: str) -> None:
    """In PgBouncer mode the worker polls instead of holding a LISTEN connection; doctor says so."""
    result = doctor({"WORKFLOW_RUNTIME_POSTGRES": DB, "LANE_WORKER_PGBOUNCER": setting})
    assert result.returncode == 0, result.stderr
    pool_line = next(line for line in result.stdout.splitlines() if line.startswith("pool"))
    assert shown in pool_line


@pytest.mark.parametrize(
    ("env", "prune", "page"),
    [
        ({}, "after 86400 s", "off (read-only page"),
        (
            {"LANE_WORKER_PRUNE_AFTER": "0", "LANE_WORKER_PAGE_TOKEN": "x" * 32},
            "never (`lanes prune` by hand only)",
            "on (LANE_WORKER_PAGE_TOKEN set",
        ),
    ],
)
def test_doctor_shows_auto_prune_and_whether_the_page_acts(
    env: dict[str, str], prune: str, page: str
) -> None:
    """The settings an operator asks about on a bad day: when lanes go, whether the page acts."""
    result = doctor({"WORKFLOW_RUNTIME_POSTGRES": DB, **env})
    assert result.returncode == 0, result.stderr
    lines = {line.split("  ", 1)[0]: line for line in result.stdout.splitlines() if line}
    assert prune in lines["auto-prune"]
    assert page in lines["page actions"]
    assert "x" * 32 not in result.stdout
    report = json.loads(doctor({"WORKFLOW_RUNTIME_POSTGRES": DB, **env}, "--json").stdout)
    assert report["pruneAfterSeconds"] == (0 if env else 86400)
