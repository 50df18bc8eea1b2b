"""``submit --release`` / ``--max-attempts``, and run ids the CLI refuses (issue 31 §3, §4).

The real CLI against a fresh database; what a submit wrote is read back from the
store's ``runs`` row. A short or partial run id is refused before any database is
read (exit 2), naming what a run id is and where to find one.
"""

from __future__ import annotations

import json
import uuid

import pytest

from support.cli import operator_env, run_cli
from support.db import fetch
from worker.client import LaneClient, SubmitRequest
from worker.errors import InvalidRequestError


def ok_json(env: dict[str, str], *args: str) -> dict[str, object]:
    result = run_cli(env, *args, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    return report


async def stored(database_url: str, run_id: object) -> tuple[str, str, int]:
    (row,) = await fetch(
        database_url,
        "select release_id, queue, max_attempts from runtime_scheduler.runs where run_id = $1",
        uuid.UUID(str(run_id)),
    )
    return row["release_id"], row["queue"], row["max_attempts"]


async def test_submit_release_and_max_attempts_are_stored(database_url: str) -> None:
    """--release names the lane over the deploy version; --max-attempts the run's budget."""
    env = operator_env(database_url, DEEPLINE_RUNTIME_DEPLOY_VERSION="rel-a")
    made = ok_json(env, "submit", "p", "--release", " Rel-B ", "--max-attempts", "2")
    assert (made["releaseId"], made["queue"]) == ("Rel-B", "runs_rel_b")
    assert await stored(database_url, made["runId"]) == ("Rel-B", "runs_rel_b", 2)
    # Without them: this process's release and LANE_WORKER_MAX_ATTEMPTS (default 5).
    plain = ok_json({**env, "LANE_WORKER_MAX_ATTEMPTS": "7"}, "submit", "p")
    assert await stored(database_url, plain["runId"]) == ("rel-a", "runs_rel_a", 7)


async def test_explicit_values_stand_for_unusable_variables(database_url: str) -> None:
    """--release and --max-attempts replace the variables they override, bad or not."""
    env = operator_env(
        database_url, DEEPLINE_RUNTIME_DEPLOY_VERSION="dev", LANE_WORKER_MAX_ATTEMPTS="many"
    )
    made = ok_json(env, "submit", "p", "--release", "rel-c", "--max-attempts", "1")
    assert await stored(database_url, made["runId"]) == ("rel-c", "runs_rel_c", 1)
    # Either one alone still reads (and refuses) the other's variable.
    refused = run_cli(env, "submit", "p", "--release", "rel-c")
    assert refused.returncode == 78
    assert "LANE_WORKER_MAX_ATTEMPTS" in refused.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--max-attempts", "0"), "0 is not in the range 1<=x<=1000"),
        (("--max-attempts", "1001"), "1001 is not in the range"),
        (("--max-attempts", "two"), "'two' is not a valid integer"),
        (("--release", "  "), "a release id must not be blank"),
        (("--release", "rel-b", "--queue-suffix", "x"), "--release and --queue-suffix"),
    ],
)
async def test_unusable_submit_options_exit_2_and_submit_nothing(
    database_url: str, args: tuple[str, ...], says: str
) -> None:
    env = operator_env(database_url)
    assert run_cli(env, "migrate").returncode == 0
    result = run_cli(env, "submit", "p", *args)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert await fetch(database_url, "select 1 from runtime_scheduler.runs") == []


def test_from_refuses_the_new_flags(database_url: str) -> None:
    result = run_cli(operator_env(database_url), "submit", "--from", "-", "--release", "r")
    assert result.returncode == 2
    assert "--from takes every submit from its lines, not from --release" in result.stderr


async def test_the_python_client_takes_release_id_and_max_attempts(database_url: str) -> None:
    env = operator_env(database_url)
    async with await LaneClient.connect(env=env) as client:
        run = await client.submit("p", release_id="rel-d", max_attempts=3)
        assert await stored(database_url, run.run_id) == ("rel-d", "runs_rel_d", 3)
        for kwargs in (
            {"max_attempts": 0},
            {"max_attempts": True},
            {"release_id": " "},
            {"release_id": "rel-d", "queue_suffix": "x"},
        ):
            with pytest.raises(InvalidRequestError):
                await client.submit("p", **kwargs)  # type: ignore[arg-type]
    assert len(await fetch(database_url, "select 1 from runtime_scheduler.runs")) == 1


SHORT = "61412800"


@pytest.mark.parametrize(
    "args",
    [
        ("status", SHORT),
        ("signal", SHORT, "approved"),
        ("cancel", SHORT),
        ("runner-result", SHORT, "1", "--data", "{}"),
        ("runs", "fail", SHORT, "--reason", "x"),
        ("runs", "retry", SHORT),
        ("status", "61412800-f530-406b-ab4c"),
    ],
)
def test_a_short_run_id_asks_for_the_full_one(
    empty_database_url: str, args: tuple[str, ...]
) -> None:
    """Exit 2 before any database read (an empty one here), saying where full ids are."""
    result = run_cli(operator_env(empty_database_url), *args)
    assert result.returncode == 2, result.stderr
    said = " ".join(result.stderr.split())
    assert "is not a run id: give the full run id, a UUID" in said
    assert "submit prints it; `lane-worker runs` lists them" in said
    assert "migrate" not in said


async def test_a_full_run_id_is_read_in_any_case_and_spacing(database_url: str) -> None:
    env = operator_env(database_url)
    made = ok_json(env, "submit", "p")
    shown = ok_json(env, "status", f" {str(made['runId']).upper()} ")
    assert shown["runId"] == made["runId"]


async def test_from_lines_take_release_id_and_max_attempts(database_url: str) -> None:
    """--from lines name them as submit_runs' items do (releaseId, maxAttempts); a line
    without them takes the process's, and only then are their variables read."""
    env = operator_env(database_url, DEEPLINE_RUNTIME_DEPLOY_VERSION="dev")  # unusable
    lines = (
        '{"play": "a", "releaseId": "rel-e", "maxAttempts": 4}\n'
        '{"play": "b", "releaseId": "rel-f", "maxAttempts": 1}\n'
    )
    made = run_cli(env, "submit", "--from", "-", "--json", stdin=lines.encode())
    assert made.returncode == 0, made.stderr
    runs = json.loads(made.stdout)["runs"]
    assert [await stored(database_url, r["runId"]) for r in runs] == [
        ("rel-e", "runs_rel_e", 4),
        ("rel-f", "runs_rel_f", 1),
    ]
    own = run_cli(env, "submit", "--from", "-", stdin=b'{"play": "c", "maxAttempts": 2}\n')
    assert own.returncode == 78, own.stderr
    assert "DEEPLINE_RUNTIME_DEPLOY_VERSION" in own.stderr


async def test_submit_many_takes_release_id_and_max_attempts(database_url: str) -> None:
    async with await LaneClient.connect(env=operator_env(database_url)) as client:
        made = await client.submit_many(
            [SubmitRequest("p", release_id="rel-g", max_attempts=9), SubmitRequest("q")]
        )
        assert [await stored(database_url, m.run_id) for m in made] == [
            ("rel-g", "runs_rel_g", 9),
            ("dev", "runs", 5),
        ]
        with pytest.raises(InvalidRequestError, match="item 1: max_attempts must be"):
            await client.submit_many([SubmitRequest("p"), SubmitRequest("p", max_attempts=-1)])
