"""Hostile and careless environments: ``settings.diagnose``, ``lane-worker doctor``, ``connect``.

No database: ``doctor`` never connects, and ``LaneClient.connect`` refuses before it would.
``doctor`` runs in process through click's CliRunner with a hermetic environment (every
variable of the test process unset, then exactly the case's).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from click.testing import CliRunner, Result

from worker.cli import cli
from worker.client import LaneClient
from worker.config import settings
from worker.config.settings import diagnose
from worker.errors import SHOWN_CHARS, LaneConfigError

PASSWORD = "hunter2-s3cret"
DB = f"postgresql://app:{PASSWORD}@db.internal:5432/runtime"
# Nothing listens on port 1: a client that tried to connect would fail differently.
UNREACHABLE = f"postgresql://app:{PASSWORD}@127.0.0.1:1/runtime"
BASE = {"WORKFLOW_RUNTIME_POSTGRES": DB}

WHOLE = [
    settings.CONCURRENCY_ENV,
    settings.CLAIM_TIMEOUT_ENV,
    settings.HEALTH_PORT_ENV,
    settings.MAX_ATTEMPTS_ENV,
]
DECIMAL = [settings.POLL_INTERVAL_ENV, settings.DRAIN_SECONDS_ENV]
# Each is in range if read as a number: only the spelling is wrong.
BAD_SPELLINGS = [
    "1_000",
    "\uff18",  # full-width 8
    "\u0665",  # Arabic-Indic 5
    "+5",
    "1e3",
    "nan",
    "NaN",
    "inf",
    "Infinity",
    "0x10",
    "5 5",
    "1,000",
    "ten",
]
BAD_WHOLE_ONLY = ["5.0", "5.", ".5"]


def refusals(env: dict[str, str], variable: str) -> list[str]:
    """Return the messages of the errors diagnose reports for ``variable``."""
    return [str(e) for e in diagnose({**BASE, **env}).errors if e.variable == variable]


def doctor(env: dict[str, str], *args: str) -> Result:
    """Run ``lane-worker doctor`` in process with exactly ``env``."""
    hermetic: dict[str, str | None] = dict.fromkeys(os.environ)
    hermetic.update(env)
    return CliRunner().invoke(cli, ["doctor", *args], env=hermetic, prog_name="lane-worker")


def longest_run(text: str, char: str) -> int:
    """Return the length of the longest run of ``char`` in ``text``."""
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", text)), default=0)


# --- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", WHOLE + DECIMAL)
@pytest.mark.parametrize("value", BAD_SPELLINGS)
def test_numbers_are_ascii_digits_only(variable: str, value: str) -> None:
    """Spellings int() or float() would take are refused, naming the variable and the form."""
    (message,) = refusals({variable: value}, variable)
    assert message.startswith(f"{variable}={value!r} is not valid: set it to ")
    assert "in ASCII digits" in message
    assert message.endswith("or unset it.")


@pytest.mark.parametrize("variable", WHOLE + DECIMAL)
def test_a_refusal_states_its_bounds_as_a_user_writes_them(variable: str) -> None:
    """``between 0 and 31536000 ... (default 86400)``, never ``86400.0``."""
    (message,) = refusals({variable: "-1"}, variable)
    assert not re.search(r"\d\.0\b", message), message


@pytest.mark.parametrize("variable", WHOLE)
@pytest.mark.parametrize("value", BAD_WHOLE_ONLY)
def test_whole_numbers_have_no_decimal_point(variable: str, value: str) -> None:
    """A count or a port is a whole number."""
    assert refusals({variable: value}, variable)


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        (settings.CONCURRENCY_ENV, " 5 ", "concurrency", 5),
        (settings.CONCURRENCY_ENV, "\t12\n", "concurrency", 12),
        (settings.CONCURRENCY_ENV, "007", "concurrency", 7),
        (settings.MAX_ATTEMPTS_ENV, "1000", "max_attempts", 1000),
        (settings.HEALTH_PORT_ENV, "0", "health_port", 0),
        (settings.POLL_INTERVAL_ENV, ".5", "poll_interval_s", 0.5),
        (settings.POLL_INTERVAL_ENV, "2.", "poll_interval_s", 2.0),
        (settings.POLL_INTERVAL_ENV, " 0.01 ", "poll_interval_s", 0.01),
        (settings.DRAIN_SECONDS_ENV, "0", "drain_s", 0.0),
        (settings.CONCURRENCY_ENV, "", "concurrency", 8),
        (settings.CONCURRENCY_ENV, "   ", "concurrency", 8),
        (settings.POLL_INTERVAL_ENV, " ", "poll_interval_s", 1.0),
    ],
)
def test_numbers_blank_stripped_or_blank_for_default(
    variable: str, value: str, field: str, expected: float
) -> None:
    """Surrounding blanks are stripped; a blank value is the default; leading zeros are fine."""
    diagnosis = diagnose({**BASE, variable: value})
    assert diagnosis.errors == ()
    assert getattr(diagnosis.tuning, field) == expected


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (settings.CONCURRENCY_ENV, "0"),
        (settings.CONCURRENCY_ENV, "1001"),
        (settings.CLAIM_TIMEOUT_ENV, "4"),
        (settings.HEALTH_PORT_ENV, "65536"),
        (settings.MAX_ATTEMPTS_ENV, "5000"),
        (settings.POLL_INTERVAL_ENV, "0.001"),
        (settings.DRAIN_SECONDS_ENV, "3600.5"),
    ],
)
def test_numbers_outside_their_bounds_are_refused(variable: str, value: str) -> None:
    """A well-spelt number outside the documented range is refused, naming the range."""
    (message,) = refusals({variable: value}, variable)
    assert " between " in message


# --- yes/no: VERCEL --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "serverless"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" True ", True),
        ("yes", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("FALSE", False),
        ("no", False),
        ("off", False),
        ("", False),
        ("   ", False),
        (None, False),
    ],
)
def test_vercel_sets_the_client_pool(value: str | None, serverless: bool) -> None:
    """1/true (any case) is serverless, one client connection; 0/false/blank/unset is not."""
    env = dict(BASE) if value is None else {**BASE, "VERCEL": value}
    result = doctor(env, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["serverless"] is serverless
    assert report["clientPoolSize"] == (1 if serverless else 2)
    assert report["workerPoolSize"] == 2


@pytest.mark.parametrize("value", ["maybe", "2", "-1", "1.0", "y", "n", "enabled", "tru", "yes!"])
def test_vercel_other_values_are_refused(value: str) -> None:
    """Anything but the yes/no spellings refuses (78) with one sentence naming VERCEL."""
    (message,) = refusals({"VERCEL": value}, "VERCEL")
    assert message.startswith(f"VERCEL={value!r} is not valid: set it to 1 or true")
    result = doctor({**BASE, "VERCEL": value})
    assert result.exit_code == settings.EXIT_CONFIG
    assert result.stderr.splitlines() == [f"lane-worker: {message}"]


# --- at most 100 characters of a value --------------------------------------------------------


LONG = 5000


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (settings.CONCURRENCY_ENV, "x" * LONG),
        (settings.CONCURRENCY_ENV, "9" * LONG),
        (settings.MAX_ATTEMPTS_ENV, "9" * LONG),
        (settings.HEALTH_PORT_ENV, "9" * LONG),
        (settings.CLAIM_TIMEOUT_ENV, "9" * LONG),
        (settings.POLL_INTERVAL_ENV, "9" * LONG),
        (settings.DRAIN_SECONDS_ENV, "x" * LONG),
        (settings.LOG_FORMAT_ENV, "x" * LONG),
        (settings.EVENT_LOOP_ENV, "x" * LONG),
        (settings.PGBOUNCER_ENV, "x" * LONG),
        ("VERCEL", "x" * LONG),
        ("DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", "x" * LONG),
        ("DEEPLINE_ABSURD_QUEUE_SUFFIX", "-" * LONG),
        ("DEEPLINE_RUNTIME_DEPLOY_VERSION", "x" * LONG),
        ("DEEPLINE_RUNTIME_DEPLOY_VERSION", "-" * LONG),
    ],
    ids=lambda v: v if len(v) < 50 else f"{v[0]}*{len(v)}",
)
def test_a_refusal_quotes_at_most_100_characters_of_the_value(variable: str, value: str) -> None:
    """A pasted 5000-character value is refused in a sentence of bounded length."""
    diagnosis = diagnose({**BASE, variable: value})
    (error,) = [e for e in diagnosis.errors if e.variable == variable]
    message = str(error)
    assert longest_run(message, value[0]) <= SHOWN_CHARS
    assert len(message) < 500
    result = doctor({**BASE, variable: value})
    assert result.exit_code == settings.EXIT_CONFIG
    assert "Traceback" not in result.output
    assert f"lane-worker: {message}" in result.stderr.splitlines()
    assert longest_run(result.stderr, value[0]) <= SHOWN_CHARS


@pytest.mark.parametrize(
    "variable", ["DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", "DEEPLINE_RUNTIME_DEPLOY_VERSION"]
)
def test_doctor_text_shows_at_most_100_characters_of_a_pasted_value(variable: str) -> None:
    """doctor's table is read on a terminal too: a pasted value must not fill it."""
    result = doctor({**BASE, variable: "x" * LONG})
    assert result.exit_code == settings.EXIT_CONFIG
    assert longest_run(result.stdout, "x") <= SHOWN_CHARS, result.stdout[:600]


# --- unknown LANE_WORKER_* variables -----------------------------------------------------------


def test_an_unknown_lane_worker_variable_is_a_doctor_warning() -> None:
    """A typo is warned about (text and JSON) and does not refuse."""
    env = {**BASE, "LANE_WORKER_CONCURENCY": "4", "LANE_WORKER_POLL_INTERVALL": "1"}
    text = doctor(env)
    assert text.exit_code == 0, text.output
    for name, meant in (
        ("LANE_WORKER_CONCURENCY", "LANE_WORKER_CONCURRENCY"),
        ("LANE_WORKER_POLL_INTERVALL", "LANE_WORKER_POLL_INTERVAL"),
    ):
        assert (
            f"  warning: {name} is set but lane-worker does not read it (a typo of {meant}?); "
            "it is ignored."
        ) in text.stdout.splitlines()
    report = json.loads(doctor(env, "--json").stdout)
    assert len(report["warnings"]) == 2
    assert report["refused"] is False


def test_every_documented_variable_is_known() -> None:
    """The documented LANE_WORKER_* variables draw no warning (so the test above can fail)."""
    env = {
        **BASE,
        settings.CONCURRENCY_ENV: "4",
        settings.CLAIM_TIMEOUT_ENV: "30",
        settings.POLL_INTERVAL_ENV: "0.5",
        settings.DRAIN_SECONDS_ENV: "5",
        settings.HEALTH_PORT_ENV: "0",
        settings.MAX_ATTEMPTS_ENV: "3",
        settings.LOG_FORMAT_ENV: "json",
        settings.PGBOUNCER_ENV: "false",
        settings.TEST_DATABASE_URL_ENV: DB,
    }
    assert diagnose(env).warnings == ()


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("DEEPLINE_ABSURD_QUEUE_SUFIX", "DEEPLINE_ABSURD_QUEUE_SUFFIX"),
        ("DEEPLINE_RUNTIME_DEPLOY_VERISON", "DEEPLINE_RUNTIME_DEPLOY_VERSION"),
        ("DEEPLINE_RUNTIME_SCHEDULER_SCHEMAS", "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"),
        ("WORKFLOW_RUNTIME_POSTGRESS", "WORKFLOW_RUNTIME_POSTGRES"),
    ],
)
def test_a_misspelt_shared_variable_is_warned_naming_the_one_meant(name: str, meant: str) -> None:
    """A suffix spelt with one F joined the shared lane silently: doctor names the real name."""
    env = {**BASE, name: "my_branch"}
    text = doctor(env)
    assert text.exit_code == 0, text.output
    (warning,) = [line for line in text.stdout.splitlines() if line.startswith("  warning: ")]
    assert warning.startswith(
        f"  warning: {name} is set but lane-worker does not read it (a typo of {meant}?)"
    )
    assert json.loads(doctor(env, "--json").stdout)["warnings"] == [warning[len("  warning: ") :]]


def test_the_apps_own_deepline_variables_are_not_called_typos() -> None:
    """The TypeScript app reads DEEPLINE_* names lane-worker does not: far from ours, no warning.

    Nor are the platforms' and the shell's own names, whole-name close or not.
    """
    env = {
        **BASE,
        "DEEPLINE_API_KEY": "k",
        "DEEPLINE_APP_URL": "https://app.example.com",
        "DEEPLINE_RUNTIME_API_URL": "https://app.example.com/api",
        "DEEPLINE_RUNTIME_DEPLOY_ENV": "production",
        "deepline_runtime_deploy_env": "production",
        "WORKFLOW_RUNTIME_ENGINE": "absurd",
        "DAYTONA_API_KEY": "d",
        "VERCEL": "1",
        "VERCEL_ENV": "preview",
        "VERCEL_URL": "x.vercel.app",
        "FLY_MACHINE_ID": "m",
        "FLY_MACHINE_VERSION": "v",
        "FLY_PRIVATE_IP": "fdaa::1",
        "FLY_REGION": "ams",
        "DATABASE_URL": DB,
        "NODE_ENV": "production",
        "PATH": "/usr/bin",
        "http_proxy": "http://proxy:3128",
    }
    assert diagnose(env).warnings == ()


@pytest.mark.parametrize(
    ("name", "meant", "why"),
    [
        ("DEEPLNE_ABSURD_QUEUE_SUFFIX", "DEEPLINE_ABSURD_QUEUE_SUFFIX", "a typo of"),
        ("DEEPLIN_RUNTIME_DEPLOY_VERSION", "DEEPLINE_RUNTIME_DEPLOY_VERSION", "a typo of"),
        ("WORKFLOWRUNTIME_POSTGRES", "WORKFLOW_RUNTIME_POSTGRES", "a typo of"),
        ("LANEWORKER_CONCURRENCY", "LANE_WORKER_CONCURRENCY", "a typo of"),
        ("LANE_WORKR_CONCURRENCY", "LANE_WORKER_CONCURRENCY", "a typo of"),
        (
            "deepline_absurd_queue_suffix",
            "DEEPLINE_ABSURD_QUEUE_SUFFIX",
            "names are case-sensitive:",
        ),
        (
            "Deepline_Absurd_Queue_Suffix",
            "DEEPLINE_ABSURD_QUEUE_SUFFIX",
            "names are case-sensitive:",
        ),
        ("deepline_absurd_queue_sufix", "DEEPLINE_ABSURD_QUEUE_SUFFIX", "a typo of"),
        ("lane_worker_concurrency", "LANE_WORKER_CONCURRENCY", "names are case-sensitive:"),
        ("workflow_runtime_postgres", "WORKFLOW_RUNTIME_POSTGRES", "names are case-sensitive:"),
    ],
)
def test_a_name_close_to_one_lane_worker_reads_is_warned_whatever_its_prefix_or_case(
    name: str, meant: str, why: str
) -> None:
    """A typo in the prefix, or the right name in lower case, served the shared lane silently.

    The whole name is compared, upper-cased, with every name lane-worker reads:
    doctor and the boot's diagnosis warn, naming the one meant.
    """
    env = {**BASE, name: "me"}
    (warning,) = diagnose(env).warnings
    assert warning.startswith(f"{name} is set but lane-worker does not read it ({why} {meant}?)")
    text = doctor(env)
    assert text.exit_code == 0, text.output
    assert f"  warning: {warning}" in text.stdout.splitlines()


def test_an_unknown_lane_worker_variable_far_from_every_name_is_still_warned() -> None:
    """Lane-worker's own family: every name it does not read is a mistake, near one or not."""
    (warning,) = diagnose({**BASE, "LANE_WORKER_XYZZY": "1"}).warnings
    assert warning == (
        "LANE_WORKER_XYZZY is set but lane-worker does not read it (a typo?); it is ignored."
    )


# --- the deploy version -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["dev", " dev ", "dev-", "DEV", "-dev-", "Dev", "dev-x", "DEV-"])
def test_a_deploy_version_spelled_like_a_dev_lane_is_refused(value: str) -> None:
    """The app and the worker would disagree on the queue, or share the dev queue: 78."""
    (message,) = refusals(
        {"DEEPLINE_RUNTIME_DEPLOY_VERSION": value}, "DEEPLINE_RUNTIME_DEPLOY_VERSION"
    )
    assert (
        f"DEEPLINE_RUNTIME_DEPLOY_VERSION={value.strip()!r} is spelled like a dev lane" in message
    )
    assert message.endswith("or unset it to serve the dev lane.")
    result = doctor({**BASE, "DEEPLINE_RUNTIME_DEPLOY_VERSION": value})
    assert result.exit_code == settings.EXIT_CONFIG
    assert result.stderr.splitlines() == [f"lane-worker: {message}"]


@pytest.mark.parametrize(
    ("value", "queue"),
    [
        ("dev_x", "runs_dev_x"),
        ("develop", "runs_develop"),
        ("devops", "runs_devops"),
        ("Release-2026.12.02", "runs_release_2026_12_02"),
    ],
)
def test_a_deploy_version_that_only_starts_like_dev_is_accepted(value: str, queue: str) -> None:
    """Only dev and dev-... spellings are refused."""
    diagnosis = diagnose({**BASE, "DEEPLINE_RUNTIME_DEPLOY_VERSION": value})
    assert diagnosis.errors == ()
    assert diagnosis.queue == queue


@pytest.mark.parametrize(("length", "refused"), [(200, False), (201, True), (5000, True)])
def test_a_deploy_version_over_200_characters_is_refused(length: int, refused: bool) -> None:
    """A release id is a sha or a slug: over 200 characters it is a pasted mistake."""
    messages = refusals(
        {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "r" * length}, "DEEPLINE_RUNTIME_DEPLOY_VERSION"
    )
    if not refused:
        assert messages == []
        return
    (message,) = messages
    assert message.startswith(f"DEEPLINE_RUNTIME_DEPLOY_VERSION has {length} characters, more than")
    assert "the 200 a release id may have" in message


# --- the store schema --------------------------------------------------------------------------


@pytest.mark.parametrize("schema", ["runtime_scheduler_typo", "runtime_schedular"])
def test_a_mistyped_store_schema_is_an_isolated_topology_without_a_suffix(schema: str) -> None:
    """Any schema but runtime_scheduler is isolated; without a suffix that refuses."""
    (message,) = refusals(
        {"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": schema}, "DEEPLINE_ABSURD_QUEUE_SUFFIX"
    )
    assert f"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA={schema!r} is an isolated topology" in message
    assert "set DEEPLINE_ABSURD_QUEUE_SUFFIX" in message


@pytest.mark.parametrize(
    "variable", ["DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", "LANE_WORKER_STORE_SCHEMA"]
)
@pytest.mark.parametrize("schema", ["Runtime", "Runtime_Scheduler", "RUNTIME_SCHEDULER", "pr_X1"])
def test_a_schema_name_with_upper_case_letters_is_refused(variable: str, schema: str) -> None:
    """`Runtime` made the quoted schema "Runtime"; the app's unquoted Runtime.submit_run missed it.

    Refused at boot (78) naming the variable and the lower-case spelling, by doctor too.
    """
    env = {variable: schema, "DEEPLINE_ABSURD_QUEUE_SUFFIX": "x"}
    (message,) = refusals(env, variable)
    assert message.startswith(f"{variable}={schema!r} has upper-case letters: Postgres folds")
    assert f"set it to {schema.lower()!r}" in message
    result = doctor({**BASE, **env})
    assert result.exit_code == settings.EXIT_CONFIG
    assert result.stderr.splitlines() == [f"lane-worker: {message}"]
    with pytest.raises(LaneConfigError) as caught:
        settings.Settings.from_env({**BASE, **env})
    assert caught.value.variable == variable


def test_the_default_store_schema_blank_stripped_is_not_isolated() -> None:
    """` runtime_scheduler ` is the production default, not a typo."""
    diagnosis = diagnose({**BASE, "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": " runtime_scheduler "})
    assert diagnosis.errors == ()
    assert diagnosis.isolated is False


# --- secrets and LaneClient.connect ---------------------------------------------------------


def test_doctor_never_prints_the_password_even_when_refusing() -> None:
    """Text and JSON, accepted and refused: the URL's password appears nowhere."""
    for env in (BASE, {**BASE, "VERCEL": "maybe", "LANE_WORKER_CONCURRENCY": "1e3"}):
        for args in ((), ("--json",)):
            result = doctor(env, *args)
            assert PASSWORD not in result.output
            assert "app:***@db.internal:5432" in result.stdout


@pytest.mark.parametrize(
    ("env", "variable", "says"),
    [
        ({"VERCEL": "maybe"}, "VERCEL", "VERCEL='maybe' is not valid"),
        ({"LANE_WORKER_PGBOUNCER": "2"}, "LANE_WORKER_PGBOUNCER", "is not valid"),
        (
            {"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "runtime_scheduler_typo"},
            "DEEPLINE_ABSURD_QUEUE_SUFFIX",
            "is an isolated topology",
        ),
        ({"DEEPLINE_ABSURD_QUEUE_SUFFIX": "..."}, "DEEPLINE_ABSURD_QUEUE_SUFFIX", "names no queue"),
        (
            {"WORKFLOW_RUNTIME_POSTGRES": "postgresql://u:p@h:99999/x"},
            "WORKFLOW_RUNTIME_POSTGRES",
            "port",
        ),
        ({"WORKFLOW_RUNTIME_POSTGRES": ""}, "WORKFLOW_RUNTIME_POSTGRES", "is not set"),
    ],
    ids=["vercel", "pgbouncer", "typo-schema", "suffix", "url-port", "url-blank"],
)
async def test_connect_refuses_before_connecting(
    env: dict[str, str], variable: str, says: str
) -> None:
    """LaneClient.connect(env=...) raises LaneConfigError naming the variable; no connect."""
    values: dict[str, Any] = {"WORKFLOW_RUNTIME_POSTGRES": UNREACHABLE, **env}
    with pytest.raises(LaneConfigError) as caught:
        await LaneClient.connect(env=values, retry_for_s=0.1)
    assert caught.value.variable == variable
    assert says in str(caught.value)
    assert PASSWORD not in str(caught.value)


async def test_connect_with_a_good_environment_does_try_to_connect() -> None:
    """A usable environment gets as far as the network (so the test above can fail)."""
    with pytest.raises(ConnectionRefusedError):
        await LaneClient.connect(env={"WORKFLOW_RUNTIME_POSTGRES": UNREACHABLE}, retry_for_s=0.1)
