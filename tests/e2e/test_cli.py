"""The operator commands as an operator runs them: real processes against a real database.

Every test runs ``python -m worker ...`` with exactly the environment it gives
(plus PATH, see ``support.cli``) against its own fresh database. ``submit --wait`` up to a finished
run needs a running worker, so it is covered with the daemon tests, not here.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import click
import pytest

from support.cli import one_error_line, run_cli, submitted_id
from worker.cli import cli as root_command

RELEASE = "Release-2026.12.02"
RELEASE_QUEUE = "runs_release_2026_12_02"
SECRET = "secretpw"
UNREACHABLE = f"postgresql://u:{SECRET}@127.0.0.1:1/x"


def ok(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run a command that must succeed silently on stderr."""
    result = run_cli(env, *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result


def ok_json(env: dict[str, str], *args: str) -> Any:
    """Run a command with ``--json`` and return the one object it prints."""
    return json.loads(ok(env, *args, "--json").stdout)


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    """The environment of the commands: this test's fresh database, nothing else."""
    return {"WORKFLOW_RUNTIME_POSTGRES": database_url}


@pytest.fixture
def empty_env(empty_database_url: str) -> dict[str, str]:
    """The environment of the commands on a fresh database without lane-worker's schemas."""
    return {"WORKFLOW_RUNTIME_POSTGRES": empty_database_url}


@pytest.fixture
def migrated(env: dict[str, str]) -> dict[str, str]:
    """``env`` after ``lane-worker migrate``."""
    ok(env, "migrate")
    return env


def test_migrate_installs_then_reports_current(empty_env: dict[str, str]) -> None:
    """The first migrate installs both schemas; a second one finds them current."""
    env = empty_env
    first = ok(env, "migrate").stdout
    assert "engine schema: installed" in first
    assert "applied 0001" in first
    again = ok_json(env, "migrate")
    assert again["engine"] == "current"
    assert again["storeSchema"] == "runtime_scheduler"
    assert again["storeApplied"] == []
    assert again["storeVersion"] >= 1


def test_status_before_migrate_says_to_migrate(empty_env: dict[str, str]) -> None:
    """On a database without the store, status exits 1 and names migrate as the remedy."""
    result = run_cli(empty_env, "status", str(uuid.uuid4()))
    assert result.returncode == 1
    assert "lane-worker migrate" in one_error_line(result)


def test_submit_prints_the_run_id(empty_env: dict[str, str]) -> None:
    """Without --json, submit prints only the new run's UUID (installing the schemas first)."""
    out = submitted_id(empty_env, "enrich-company")
    assert str(uuid.UUID(out)) == out
    assert ok_json(empty_env, "status", out)["status"] == "queued"


def test_submit_json_stamps_the_release_and_its_queue(env: dict[str, str]) -> None:
    """--json gives runId, the raw deploy version as releaseId, and the queue derived from it."""
    report = ok_json({**env, "DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}, "submit", "p")
    uuid.UUID(report["runId"])
    assert report["releaseId"] == RELEASE
    assert report["queue"] == RELEASE_QUEUE
    assert report["created"] is True


def test_submit_queue_suffix_goes_to_that_dev_lane(env: dict[str, str]) -> None:
    """--queue-suffix outranks the deploy version: dev-<suffix> on runs_<suffix>."""
    release_env = {**env, "DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
    report = ok_json(release_env, "submit", "p", "--queue-suffix", "PR-7")
    assert (report["releaseId"], report["queue"]) == ("dev-pr_7", "runs_pr_7")


def test_submit_with_idempotency_key_twice_returns_the_same_run(env: dict[str, str]) -> None:
    """A repeated idempotency key returns the first run and says it was not created."""
    args = ("submit", "p", "--input", '{"n": 1}', "--idempotency-key", "order-42")
    first = ok_json(env, *args)
    second = ok_json(env, *args)
    assert second["runId"] == first["runId"]
    assert (first["created"], second["created"]) == (True, False)
    # As text: the id alone on stdout (scripts read it), a note on stderr that it is old.
    again = run_cli(env, *args)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == first["runId"]
    assert "nothing new was submitted" in again.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("submit", "p", "--input", "{not json"), "--input"),
        (("signal", str(uuid.uuid4()), "approved", "--data", "[1,"), "--data"),
    ],
)
def test_bad_json_is_a_usage_error(env: dict[str, str], args: tuple[str, ...], flag: str) -> None:
    """Malformed JSON in --input or --data exits 2 naming the flag, before touching the database."""
    result = run_cli(env, *args)
    assert result.returncode == 2
    assert flag in result.stderr
    assert "is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "  "),
        ("submit", "p", "--timeout", "5"),
        ("submit", "p", "--wait", "--timeout", "0"),
        ("submit", "p", "--queue-suffix", "..."),
        ("lanes", "retire", " "),
        ("run", "--app", "no-attribute"),
    ],
)
def test_unusable_arguments_are_usage_errors(env: dict[str, str], args: tuple[str, ...]) -> None:
    """A blank play or release, --timeout without --wait, a suffix naming no queue: exit 2."""
    result = run_cli(env, *args)
    assert result.returncode == 2, result.stderr
    assert "Error:" in result.stderr
    assert "Traceback" not in result.stderr


def test_submit_wait_times_out_without_a_worker(env: dict[str, str]) -> None:
    """--wait with no worker running exits 1 after the timeout and says the run goes on."""
    result = run_cli(env, "submit", "p", "--wait", "--timeout", "0.5", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert (report["status"], report["timedOut"]) == ("queued", True)
    assert "did not finish within 0.5 s" in json.loads(result.stderr)["error"]["message"]


def test_status_json_of_a_new_run(env: dict[str, str]) -> None:
    """status --json reports exactly the design's fields for a run no worker has claimed."""
    submitted = ok_json(env, "submit", "p", "--input", '{"domain": "example.com"}')
    report = ok_json(env, "status", submitted["runId"])
    assert isinstance(report["maxAttempts"], int)
    assert report["maxAttempts"] >= 1
    assert report == {
        "runId": submitted["runId"],
        "play": "p",
        "status": "queued",
        "releaseId": "dev",
        "adoptedReleaseId": None,
        "queue": "runs",
        "attempts": 0,  # spent, as `runs` counts them; each worker's take is a claim
        "maxAttempts": report["maxAttempts"],
        "claims": [],
        "waitsFor": None,  # a parked run's wait (kind, eventKey, wakeAtMs, deadlineMs)
        "output": None,
        "error": None,
        "retryOf": None,
        "steps": [],
        "facts": [],
    }


def test_status_text_is_a_readable_summary(env: dict[str, str]) -> None:
    """Without --json, status prints one labelled line per field."""
    run_id = submitted_id(env, "enrich")
    out = ok(env, "status", run_id).stdout
    for label, value in [
        ("run", run_id),
        ("play", "enrich"),
        ("status", "queued"),
        ("release", "dev"),
        ("queue", "runs"),
        ("claims", "(none yet)"),
    ]:
        assert any(line.split(None, 1) == [label, value] for line in out.splitlines()), out
    assert "adopted release" in out
    [spent] = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("attempts")]
    assert spent.startswith("0 of "), out


def test_status_of_an_unknown_run_exits_1(migrated: dict[str, str]) -> None:
    """An unknown run id exits 1 with one 'no run' line (not a UUID: exit 2, see
    test_cli_submit_options)."""
    result = run_cli(migrated, "status", "9b6c1f2e-5d4a-4e3b-8c7d-0a1b2c3d4e5f")
    assert result.returncode == 1
    assert one_error_line(result).startswith("lane-worker: no run ")
    assert result.stdout == ""


def test_signal_then_duplicate_is_ignored(env: dict[str, str]) -> None:
    """The first signal is delivered; a second for the same key says ignored and exits 0."""
    run_id = submitted_id(env, "p")
    first = ok(env, "signal", run_id, "approved", "--data", '{"by": "ops"}').stdout
    assert "delivered" in first
    again = ok(env, "signal", run_id, "approved", "--data", '{"by": "someone else"}').stdout
    assert "ignored" in again
    report = ok_json(env, "signal", run_id, "approved")
    assert (report["runId"], report["eventKey"], report["duplicate"]) == (run_id, "approved", True)
    assert report["runEnded"] is None


def test_signal_to_an_ended_run_is_kept_for_a_retry(env: dict[str, str]) -> None:
    """A signal to a cancelled run says it ended and is kept for a retry, exits 0; --json too."""
    run_id = submitted_id(env, "p")
    ok(env, "cancel", run_id)
    text = ok(env, "signal", run_id, "approved").stdout
    assert text.startswith(f"kept: run {run_id} has already ended (cancelled)")
    assert f"lane-worker runs retry {run_id}" in text
    report = ok_json(env, "signal", run_id, "other")
    assert (report["duplicate"], report["runEnded"]) == (False, "cancelled")
    assert (report["keptForRetry"], report["deliveredTo"]) == (True, run_id)
    again = ok_json(env, "signal", run_id, "approved")  # kept already: first wins
    assert (again["duplicate"], again["keptForRetry"]) == (True, False)


def test_signal_to_an_unknown_run_exits_1(migrated: dict[str, str]) -> None:
    """Signalling a run that does not exist exits 1 with one line."""
    result = run_cli(migrated, "signal", str(uuid.uuid4()), "approved")
    assert result.returncode == 1
    assert one_error_line(result).startswith("lane-worker: no run ")


def test_cancel_then_status_shows_cancelled(env: dict[str, str]) -> None:
    """cancel ends a queued run; status shows it cancelled; a second cancel says so, exit 0."""
    run_id = submitted_id(env, "p")
    assert ok_json(env, "cancel", run_id) == {
        "runId": run_id,
        "cancelled": True,
        "status": "cancelled",
    }
    assert ok_json(env, "status", run_id)["status"] == "cancelled"
    # The app's runtime API hears an operator's cancel as one, not as its own client's.
    source = asyncio.run(
        fetch_value(
            env["WORKFLOW_RUNTIME_POSTGRES"],
            "select fact ->> 'source' from runtime_scheduler.ledger where run_id = $1::uuid",
            run_id,
        )
    )
    assert source == "operator"
    again = ok(env, "cancel", run_id).stdout
    assert "already cancelled" in again


async def fetch_value(url: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


def lane(env: dict[str, str], queue: str) -> dict[str, Any]:
    """Return the one lane of ``queue`` in ``lanes --json``."""
    (found,) = [row for row in ok_json(env, "lanes")["lanes"] if row["queue"] == queue]
    return dict(found)


def test_lanes_retire_then_activate(env: dict[str, str]) -> None:
    """retire makes a lane with a queued run draining; activate makes it claiming again."""
    run_id = submitted_id({**env, "DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}, "p")
    # No worker registered the lane yet: its open run still shows, never silently.
    assert lane(env, RELEASE_QUEUE)["status"] == "unregistered"
    retired = ok(env, "lanes", "retire", RELEASE)
    assert RELEASE_QUEUE in retired.stdout
    assert retired.stderr == ""  # a run went to it: not a typo
    row = lane(env, RELEASE_QUEUE)
    assert row == {
        "releaseId": RELEASE,
        "queue": RELEASE_QUEUE,
        "status": "draining",  # retired, with a run only its release may run
        "liveWorkers": 0,
        "claimingWorkers": 0,
        "claimHealthUnknownWorkers": 0,
        "queued": 1,
        "running": 0,
        "waiting": 0,
        "adoptable": 0,
        "workers": [],
        "counts": {
            "inFlight": 0,
            "fresh": 1,
            "retrying": 0,
            "handedBack": 0,
            "parkedSleep": 0,
            "parkedEvent": 0,
            "deferred": 0,
            "oldestWaitSeconds": None,
            "oldestDeferralSeconds": None,
            "adoptedBy": {},
        },
        "safeToStop": False,
        "blockedBy": [
            {
                "reason": "fresh",
                "count": 1,
                "remedy": row["blockedBy"][0]["remedy"],
                "runIds": [run_id],
            }
        ],
        "pruned": False,
        "ledger": {"pending": 0, "failed": 0},
        "sandboxCleanup": {"pending": 0, "failed": 0, "failedSandboxes": [], "remedy": None},
        "stranded": True,  # work only its release may run, and no worker of it is live
        "release": {"role": None, "machinesDesired": None, "machinesLive": 0, "scaler": None},
        "asOf": row["asOf"],
        "drainingSeconds": row["drainingSeconds"],
        "foreignTasks": 0,  # no other system's task on its queue
        "dev": False,  # a release lane, not a worktree's
        "mixed": False,  # no worktree shares its queue
        "lastSeen": row["lastSeen"],
    }
    assert row["drainingSeconds"] >= 0  # since the retire a moment ago
    assert "no live worker of" in row["blockedBy"][0]["remedy"]
    activated = ok_json(env, "lanes", "activate", RELEASE)
    assert activated == {"releaseId": RELEASE, "queue": RELEASE_QUEUE, "status": "claiming"}
    claiming = lane(env, RELEASE_QUEUE)
    assert (claiming["status"], claiming["drainingSeconds"]) == ("claiming", 0)


def test_retiring_a_lane_nothing_ever_used_is_refused_unless_forced(env: dict[str, str]) -> None:
    """A release id no worker and no run ever used is a likely typo: exit 1, unless --force."""
    ok(env, "migrate")
    refused = run_cli(env, "lanes", "retire", "rel-typo", "--json")
    assert refused.returncode == 1, refused.stderr
    sentence = one_error_line(refused)
    assert sentence.startswith("lane-worker: no lane has ever had release 'rel-typo'")
    assert "--force" in sentence
    assert refused.stdout == ""
    assert all(row["queue"] != "runs_rel_typo" for row in ok_json(env, "lanes")["lanes"])
    forced = run_cli(env, "lanes", "retire", "rel-typo", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["known"] is False
    assert lane(env, "runs_rel_typo")["status"] in ("retired", "drained")


def test_lanes_table_shows_a_retired_empty_lane_drained(env: dict[str, str]) -> None:
    """A retired lane with nothing left to finish is listed as drained, in a table."""
    ok(env, "migrate")
    assert "no lanes" in ok(env, "lanes").stdout
    # Nothing has used the lane yet, so the retire needs --force (tested above).
    assert run_cli(env, "lanes", "retire", "dev", "--force").returncode == 0
    header, row, verdict = ok(env, "lanes").stdout.splitlines()
    assert header.split() == [
        "RELEASE",
        "QUEUE",
        "STATUS",
        "LIVE",
        "IN-FLIGHT",
        "FRESH",
        "RETRYING",
        "HANDED-BACK",
        "PARKED",
        "DEFERRED",
        "SAFE-TO-STOP",
    ]
    assert row.split() == ["dev", "runs", "drained", "0", "0", "0", "0", "0", "0", "0", "yes"]
    assert verdict == "dev: safe to stop its machines (drained)."


@pytest.mark.parametrize(
    "args",
    [
        ("migrate",),
        ("submit", "p"),
        ("status", str(uuid.uuid4())),
        ("lanes",),
        ("lanes", "retire", "r1"),
        ("signal", str(uuid.uuid4()), "k"),
        ("cancel", str(uuid.uuid4())),
    ],
)
def test_missing_database_url_exits_78_naming_it(args: tuple[str, ...]) -> None:
    """Without WORKFLOW_RUNTIME_POSTGRES every database command exits 78 naming it."""
    result = run_cli({}, *args)
    assert result.returncode == 78
    assert "WORKFLOW_RUNTIME_POSTGRES" in one_error_line(result)


@pytest.mark.parametrize(
    "url", [f"mysql://root:{SECRET}@db/x", f"postgresql://u:{SECRET}@db:port/x"]
)
def test_unusable_database_url_exits_78_without_the_password(url: str) -> None:
    """A URL that is not postgresql://, or that the driver cannot parse, exits 78."""
    result = run_cli({"WORKFLOW_RUNTIME_POSTGRES": url}, "lanes")
    assert result.returncode == 78
    assert "WORKFLOW_RUNTIME_POSTGRES" in one_error_line(result)
    assert SECRET not in result.stdout + result.stderr


def test_isolated_schema_without_suffix_refuses_submit(env: dict[str, str]) -> None:
    """submit in an isolated store with no queue suffix exits 78 naming the suffix variable."""
    result = run_cli({**env, "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_9"}, "submit", "p")
    assert result.returncode == 78
    assert "DEEPLINE_ABSURD_QUEUE_SUFFIX" in one_error_line(result)


def test_unreachable_database_exits_1_without_the_password() -> None:
    """Nothing listens on port 1: exit 1 with one sentence, in bounded time, no password."""
    # Its 10 s of retries end it; one that retried for ever fails on this limit (no
    # tighter bound on wall time: the start of a Python process is what load slows).
    some_run = str(uuid.uuid4())
    result = run_cli({"WORKFLOW_RUNTIME_POSTGRES": UNREACHABLE}, "status", some_run, timeout=90)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "cannot reach the runtime database" in line
    assert "127.0.0.1:1" in line
    assert SECRET not in result.stdout + result.stderr


def commands(
    group: click.Group = root_command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Yield every command of the CLI with the words that invoke it."""
    yield path, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


ALL_COMMANDS = list(commands())


@pytest.mark.parametrize(
    ("path", "command"), ALL_COMMANDS, ids=[" ".join(path) or "-" for path, _ in ALL_COMMANDS]
)
def test_help_explains_every_flag(path: tuple[str, ...], command: click.Command) -> None:
    """`lane-worker [COMMAND] --help` exits 0 and lists each of its flags with help text."""
    result = run_cli({}, *path, "--help")
    assert result.returncode == 0, result.stderr
    assert (command.help or "").split("\n")[0].strip()[:40] in " ".join(result.stdout.split())
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{param.name} has no help text"
            for flag in param.opts:
                assert flag in result.stdout, f"{flag} missing from {' '.join(path)} --help"
    if isinstance(command, click.Group):
        for name in command.commands:
            assert name in result.stdout


def test_submit_records_a_runtime_api_from_a_file_and_never_shows_its_token(
    env: dict[str, str], tmp_path: Any
) -> None:
    """--runtime-api @FILE is recorded; no output shows the token; a bad one exits 2."""
    token = "cli-exec-token-93d1"
    api = tmp_path / "api.json"
    api.write_text(json.dumps({"baseUrl": "https://app.example/rt", "executorToken": token}))
    submitted = ok_json(env, "submit", "p", "--runtime-api", f"@{api}")
    outputs = [
        ok(env, "status", submitted["runId"], "--json").stdout,
        ok(env, "status", submitted["runId"]).stdout,
        ok(env, "runs", "--json").stdout,
        ok(env, "cancel", submitted["runId"], "--reason", "done with it").stdout,
    ]
    assert all(token not in out for out in outputs)
    facts = ok_json(env, "status", submitted["runId"])["facts"]
    assert [f["type"] for f in facts] == ["run.cancelled"]

    api.write_text(json.dumps({"baseUrl": "ftp://app.example", "executorToken": token}))
    refused = run_cli(env, "submit", "p", "--runtime-api", f"@{api}")
    assert refused.returncode == 2
    assert "baseUrl must be an http:// or https:// URL" in one_error_line(refused)
    assert token not in refused.stdout + refused.stderr
    api.write_text("[1]")
    refused = run_cli(env, "submit", "p", "--runtime-api", f"@{api}")
    assert refused.returncode == 2
    assert (
        "--runtime-api must be a JSON object (baseUrl, executorToken, ...), not a JSON array"
        in (refused.stderr)
    )


def test_runner_result_for_an_attempt_nobody_launched_exits_1_naming_it(
    env: dict[str, str],
) -> None:
    """runner-result RUN ATTEMPT: an attempt the run never launched is refused in one sentence."""
    run_id = submitted_id(env, "p")
    refused = run_cli(env, "runner-result", run_id, "2", "--data", '{"ok": true}')
    assert refused.returncode == 1
    assert f"run {run_id} has no runner attempt 2" in one_error_line(refused)
    usage = run_cli(env, "runner-result", run_id, "0")
    assert usage.returncode == 2


def test_run_finds_the_app_in_the_current_directory_and_shows_an_import_error(
    env: dict[str, str], tmp_path: Any
) -> None:
    """`--app plays:app` from the project's directory; an app that raises shows its traceback."""
    (tmp_path / "myplays.py").write_text(
        "from worker import App\napp = App()\n\n@app.play('hi')\nasync def hi(ctx, params):\n"
        "    return 'hi'\n"
    )
    (tmp_path / "broken.py").write_text("import json\nraise RuntimeError('config missing')\n")
    run_env = {**env, "DEEPLINE_RUNTIME_DEPLOY_VERSION": "cwd-app", "LANE_WORKER_HEALTH_PORT": "0"}
    broken = subprocess.run(
        [sys.executable, "-m", "worker", "run", "--app", "broken:app"],
        cwd=tmp_path, env={**os.environ, **run_env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert broken.returncode == 2
    assert "Traceback" in broken.stderr
    assert "RuntimeError: config missing" in broken.stderr
    assert "importing broken raised RuntimeError: config missing" in broken.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "worker", "run", "--app", "nowhere:app"],
        cwd=tmp_path, env={**os.environ, **run_env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "no module 'nowhere'" in missing.stderr
    assert "Traceback" not in missing.stderr
    with subprocess.Popen(
        [sys.executable, "-m", "worker", "run", "--app", "myplays:app"],
        cwd=tmp_path, env={**os.environ, **run_env, "LANE_WORKER_LOG_FORMAT": "json"},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as started:  # fmt: skip
        try:
            assert started.stdout is not None
            assert any('"worker.ready"' in line for line in started.stdout)
        finally:
            started.terminate()
            started.wait(timeout=30)


def test_a_database_that_does_not_exist_says_how_to_make_it(env: dict[str, str]) -> None:
    """The walk of 2026-12-07: `database "x" does not exist` alone, with no next step."""
    parts = urlsplit(env["WORKFLOW_RUNTIME_POSTGRES"])
    missing = urlunsplit(parts._replace(path="/lane_worker_no_such_db"))
    result = run_cli({"WORKFLOW_RUNTIME_POSTGRES": missing}, "lanes")
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert 'database "lane_worker_no_such_db" does not exist' in line
    assert "create it (createdb, or CREATE DATABASE) and run lane-worker migrate" in line
