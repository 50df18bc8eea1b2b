"""``lane-worker submit --from FILE``: one run per JSON line, all in one transaction.

Real processes against a real database, as an operator runs them (see ``support.cli``).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.cli import UNSERVED_WARNING, one_error_line, run_cli

RELEASE_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-b"}
API = {"baseUrl": "https://app.example/api", "executorToken": "tok-9c2"}


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    """This test's fresh database and a release; the schemas installed."""
    made = {"WORKFLOW_RUNTIME_POSTGRES": database_url, **RELEASE_ENV}
    assert run_cli(made, "migrate").returncode == 0
    return made


def lines(*values: Any) -> bytes:
    return "".join(v if isinstance(v, str) else json.dumps(v) + "\n" for v in values).encode()


def listed(env: dict[str, str]) -> list[dict[str, Any]]:
    """Every run in the store, newest first (``runs --json``)."""
    result = run_cli(env, "runs", "--json")
    assert result.returncode == 0, result.stderr
    runs: list[dict[str, Any]] = json.loads(result.stdout)["runs"]
    return runs


def status(env: dict[str, str], run_id: str) -> dict[str, Any]:
    result = run_cli(env, "status", run_id, "--json")
    assert result.returncode == 0, result.stderr
    said: dict[str, Any] = json.loads(result.stdout)
    return said


def test_a_file_submits_one_run_a_line_and_prints_their_ids(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Blank lines skipped; each run on its lane with its input and key; ids in line order."""
    path = tmp_path / "runs.jsonl"
    path.write_bytes(lines(
        {"play": "greet", "input": {"name": "ada"}},
        "\n",
        {"play": "bill", "idempotencyKey": "order-1", "queueSuffix": "pr-7", "runtimeApi": API},
        {"play": "greet", "input": None, "idempotencyKey": None},
    ))  # fmt: skip
    result = run_cli(env, "submit", "--from", str(path))
    assert result.returncode == 0, result.stderr
    # Once per lane nobody serves (migration 0029), after the ids.
    assert [line.split(" (")[0] for line in result.stderr.splitlines()] == [
        f"{UNSERVED_WARNING}runs_rel_b",
        f"{UNSERVED_WARNING}runs_pr_7",
    ]
    ids = result.stdout.splitlines()
    assert [str(uuid.UUID(i)) for i in ids] == ids
    assert len(set(ids)) == 3
    shown = [status(env, i) for i in ids]
    assert [(s["play"], s["releaseId"], s["queue"], s["status"]) for s in shown] == [
        ("greet", "rel-b", "runs_rel_b", "queued"),
        ("bill", "dev-pr_7", "runs_pr_7", "queued"),
        ("greet", "rel-b", "runs_rel_b", "queued"),
    ]
    # Again with --json: the keyed line answers its run, the others are new.
    again = run_cli(env, "submit", "--from", str(path), "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)["runs"]
    assert [r["created"] for r in report] == [True, False, True]
    assert report[1] == {"runId": ids[1], "releaseId": "dev-pr_7", "queue": "runs_pr_7",
                         "created": False, "served": False,
                         "warning": report[1]["warning"]}  # fmt: skip
    assert "DEEPLINE_ABSURD_QUEUE_SUFFIX=pr_7" in report[1]["warning"]
    assert again.stderr == ""  # --json: the warnings are in the report
    assert len(listed(env)) == 5


def test_stdin_is_read_for_a_dash(env: dict[str, str]) -> None:
    result = run_cli(env, "submit", "--from", "-", "--json",
                     stdin=lines({"play": "a"}, {"play": "b", "input": {"n": 2}}))  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["runs"]
    assert [status(env, r["runId"])["play"] for r in report] == ["a", "b"]
    empty = run_cli(env, "submit", "--from", "-", stdin=b"\n")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")


BAD_LINES: list[tuple[str, bytes, int, str]] = [
    ("not-json", lines({"play": "a"}, "\n", "{play: 1}\n"), 2,
     "line 3: the line is not valid JSON"),
    ("not-object", lines({"play": "a"}, ["a"]), 2, "line 2: a submit is a JSON object"),
    ("unknown", lines({"play": "a", "inputs": {}}), 2, "line 1: a submit has no field 'inputs'"),
    ("play-number", lines({"play": "a"}, {"play": 1}), 2, "line 2: play must be a JSON string"),
    ("no-play", lines({"play": "a"}, {"input": {}}), 2, "line 2: submit needs a play name"),
    ("list-input", lines({"play": "a"}, {"play": "b", "input": [1]}), 2,
     "line 2: a run's input must be a JSON object"),
    ("no-lane", lines({"play": "a"}, {"play": "b", "queueSuffix": "--"}), 2,
     "line 2: queueSuffix '--' names no queue"),
    ("release-and-suffix", lines({"play": "b", "releaseId": "r", "queueSuffix": "x"}), 2,
     "line 1: releaseId and queueSuffix each name the lane: give one."),
    ("blank-release", lines({"play": "a"}, {"play": "b", "releaseId": " "}), 2,
     "line 2: releaseId: a release id must not be blank."),
    ("attempts-zero", lines({"play": "b", "maxAttempts": 0}), 2,
     "line 1: maxAttempts must be a whole number from 1 to 1000."),
    ("attempts-text", lines({"play": "b", "maxAttempts": "3"}), 2,
     "line 1: maxAttempts must be a whole number"),
    ("nan", lines({"play": "a"}, '{"play": "b", "input": {"x": NaN}}\n'), 2,
     "line 2: NaN is not JSON"),
    ("not-utf8", lines({"play": "a"}) + b'{"play": "\xff"}\n', 2, "line 2: not UTF-8 text"),
    # Refused by the store (submit_runs), after every line parsed.
    ("api-ftp", lines({"play": "a"}, "\n", {"play": "b", "runtimeApi": {**API,
     "baseUrl": "ftp://h"}}), 2, "line 3: the runtime API context's baseUrl must be"),
    ("key-conflict", lines({"play": "a", "idempotencyKey": "k"}, {"play": "b",
     "idempotencyKey": "k"}), 1, "line 2: idempotency key 'k' already names run "),
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "code", "says"), [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES]
)
def test_a_bad_line_is_refused_by_its_number_and_nothing_is_submitted(
    env: dict[str, str], tmp_path: Path, content: bytes, code: int, says: str
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(content)
    results = [run_cli(env, "submit", "--from", str(path))]
    if b"\xff" not in content:  # run_cli sends stdin as text
        results.append(run_cli(env, "submit", "--from", "-", stdin=content))
    for result in results:
        assert result.returncode == code, result.stderr
        assert result.stdout == ""
        where = str(path) if "-" not in result.args else "-"
        assert one_error_line(result).startswith(f"lane-worker: --from {where}, {says}")
        assert API["executorToken"] not in result.stderr
    assert listed(env) == []


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "p", "--from", "-"),
        ("submit", "--from", "-", "--input", "{}"),
        ("submit", "--from", "-", "--wait"),
        ("submit", "--from", "/nonexistent/runs.jsonl"),
        ("submit",),
    ],
)
def test_from_with_other_arguments_or_no_file_is_a_usage_error(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    result: subprocess.CompletedProcess[str] = run_cli(env, *args, stdin=lines({"play": "a"}))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert listed(env) == []
