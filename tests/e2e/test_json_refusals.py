"""With ``--json``, every refusal is one JSON object on stderr with the same shape, and the
exit code it would have had (issue 31): bad input (2), an unusable configuration (78), an
unknown run (1), a run that failed to finish under ``--wait`` (1, its report on stdout)."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from support.cli import run_cli

UNKNOWN_RUN = "9b6c1f2e-5d4a-4e3b-8c7d-0a1b2c3d4e5f"


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    return {"WORKFLOW_RUNTIME_POSTGRES": database_url}


def refusal(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """Return the one JSON refusal on stderr; it has the one shape."""
    error = json.loads(result.stderr)["error"]
    assert set(error) == {"code", "exitCode", "message"}, error
    assert error["exitCode"] == result.returncode
    assert isinstance(error["message"], str)
    assert error["message"]
    assert not error["message"].startswith("lane-worker:")
    return error


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("submit", "p", "--input", "{not json"), 2, "--input"),  # a parameter type refuses
        (("submit", "p", "--timeout", "5"), 2, "--wait"),  # the command refuses
        (("status", "not-a-uuid"), 2, "not-a-uuid"),
        (("nosuchcommand",), 2, "nosuchcommand"),  # click's parser refuses
        (("status", UNKNOWN_RUN), 1, "no run"),
        (("releases", "deploy", " ", "--image", "x"), 2, ""),
    ],
)
def test_a_refusal_under_json_is_one_json_object(
    env: dict[str, str], args: tuple[str, ...], code: int, says: str
) -> None:
    result = run_cli(env, *args, "--json")
    assert result.returncode == code, result.stderr
    error = refusal(result)
    assert error["code"] == ("usage" if code == 2 else "failure")
    assert says in str(error["message"])
    assert result.stdout == ""


def test_a_configuration_refusal_under_json_exits_78() -> None:
    result = run_cli({}, "status", str(uuid.uuid4()), "--json")
    assert result.returncode == 78
    error = refusal(result)
    assert error["code"] == "config"
    assert "WORKFLOW_RUNTIME_POSTGRES" in str(error["message"])


def test_doctor_json_refuses_with_the_same_shape() -> None:
    result = run_cli({}, "doctor", "--json")
    assert result.returncode == 78
    assert json.loads(result.stdout)["refused"] is True  # the report stays on stdout
    assert refusal(result)["code"] == "config"


def test_a_wait_that_times_out_keeps_its_report_on_stdout(env: dict[str, str]) -> None:
    result = run_cli(env, "submit", "p", "--wait", "--timeout", "0.5", "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["timedOut"] is True
    assert "did not finish" in str(refusal(result)["message"])


def test_without_json_a_refusal_stays_one_text_line(env: dict[str, str]) -> None:
    result = run_cli(env, "status", UNKNOWN_RUN)
    assert result.returncode == 1
    assert result.stderr.startswith("lane-worker: no run ")
