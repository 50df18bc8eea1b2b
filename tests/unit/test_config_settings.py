"""The environment contract: Settings, the boot guard and what doctor reports."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker import lanes
from worker.config.dburl import redact_url
from worker.config.settings import EXIT_CONFIG, EXIT_OK, Settings, diagnose
from worker.errors import LaneConfigError

DB = "postgresql://postgres@127.0.0.1:5432/postgres"
PREVIEW_SUFFIX = hashlib.sha256(b"pr_123").hexdigest()[:12]


def test_defaults_resolve_the_dev_lane() -> None:
    """With only a database URL the worker serves the dev lane on queue runs."""
    settings = Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB})
    assert (settings.release_id, settings.launch_release_id, settings.queue) == (
        "dev",
        "dev",
        "runs",
    )
    assert settings.scheduler_schema == "runtime_scheduler"
    assert not settings.isolated
    assert settings.suffix_source == "default"
    assert settings.tuning.concurrency == 8
    assert settings.tuning.claim_timeout_s == 60
    assert settings.tuning.poll_interval_s == 1.0
    assert settings.tuning.drain_s == 25.0
    assert settings.tuning.health_port == 8080
    assert settings.tuning.max_attempts == 5
    assert settings.tuning.log_format == "auto"


def test_settings_are_frozen() -> None:
    """Settings cannot be changed after boot."""
    settings = Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.queue = "runs_other"  # type: ignore[misc]


def test_deploy_version_gives_a_release_lane() -> None:
    """A baked deploy version names the lane (its sanitized segment); the release id is
    the trimmed slug as deployed, the one every output and store row carries."""
    slug = "main-" + "0123456789abcdef" * 2 + "01234567"
    settings = Settings.from_env(
        {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_RUNTIME_DEPLOY_VERSION": f" {slug} "}
    )
    assert settings.release_id == settings.launch_release_id == slug
    segment = lanes.current_release_id({"DEEPLINE_RUNTIME_DEPLOY_VERSION": slug})
    assert segment != slug
    assert settings.queue == f"runs_{segment}" == lanes.queue_name_for_release(slug)
    assert settings.suffix_source == "DEEPLINE_RUNTIME_DEPLOY_VERSION"


@given(st.text(max_size=60), st.sampled_from(["", "WT-1", "---"]))
def test_a_release_that_boots_names_its_lane_by_either_spelling(
    deploy_version: str, suffix: str
) -> None:
    """Whatever the deploy version, a worker that boots carries the id the app stamps
    (``launch_release_id``), and that id's lane is the queue the settings derived from
    the segment: the deployed id never moves the queue."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_RUNTIME_DEPLOY_VERSION": deploy_version}
    if suffix:
        env["DEEPLINE_ABSURD_QUEUE_SUFFIX"] = suffix
    diagnosis = diagnose(env)
    if diagnosis.refused:
        return
    assert diagnosis.release_id == lanes.launch_release_id(env)
    assert diagnosis.queue == lanes.queue_name_for_release(lanes.current_release_id(env))
    assert diagnosis.queue == lanes.queue_name_for_release(diagnosis.release_id)


def test_isolated_schema_without_suffix_is_refused() -> None:
    """An isolated scheduler schema with no queue suffix refuses boot, naming the suffix."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_123"}
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == "DEEPLINE_ABSURD_QUEUE_SUFFIX"
    assert "DEEPLINE_ABSURD_QUEUE_SUFFIX" in str(caught.value)
    assert PREVIEW_SUFFIX in str(caught.value)
    assert diagnose(env).exit_code == EXIT_CONFIG


def test_isolated_schema_with_suffix_boots_on_its_queue() -> None:
    """With the suffix set, the isolated worker drains runs_<suffix>."""
    env = {
        "WORKFLOW_RUNTIME_POSTGRES": DB,
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_123",
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": PREVIEW_SUFFIX,
    }
    settings = Settings.from_env(env)
    assert settings.queue == f"runs_{PREVIEW_SUFFIX}"
    assert settings.release_id == f"dev-{PREVIEW_SUFFIX}"
    assert settings.isolated
    assert diagnose(env).warnings == ()


def test_isolated_suffix_that_differs_from_the_apps_is_a_warning() -> None:
    """A suffix other than the one the app derives for the schema is reported, not refused."""
    env = {
        "WORKFLOW_RUNTIME_POSTGRES": DB,
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_123",
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": "my_branch",
    }
    diagnosis = diagnose(env)
    assert diagnosis.exit_code == EXIT_OK
    assert any(PREVIEW_SUFFIX in w and "my_branch" in w for w in diagnosis.warnings)


def test_missing_database_url_is_refused() -> None:
    """No WORKFLOW_RUNTIME_POSTGRES refuses boot, naming it."""
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env({})
    assert caught.value.variable == "WORKFLOW_RUNTIME_POSTGRES"
    assert "WORKFLOW_RUNTIME_POSTGRES" in str(caught.value)


def test_blank_database_url_counts_as_missing() -> None:
    """A blank value is the same as an unset one."""
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": "   "})
    assert caught.value.variable == "WORKFLOW_RUNTIME_POSTGRES"


def test_non_postgres_url_is_refused_without_echoing_it() -> None:
    """A URL of another scheme is refused and its password never appears in the message."""
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": "mysql://root:hunter2@db/x"})
    assert caught.value.variable == "WORKFLOW_RUNTIME_POSTGRES"
    assert "hunter2" not in str(caught.value)
    assert "'mysql'" in str(caught.value)


def test_deploy_version_that_sanitizes_to_nothing_is_refused() -> None:
    """A deploy version with no [a-z0-9_] character refuses boot, naming the variable."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_RUNTIME_DEPLOY_VERSION": "-/-"}
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == "DEEPLINE_RUNTIME_DEPLOY_VERSION"
    assert diagnose(env).queue is None


def test_suffix_that_normalizes_to_nothing_is_refused() -> None:
    """A set suffix that names no queue refuses boot instead of draining the shared queue."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_ABSURD_QUEUE_SUFFIX": "///"}
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == "DEEPLINE_ABSURD_QUEUE_SUFFIX"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LANE_WORKER_CONCURRENCY", "0"),
        ("LANE_WORKER_CONCURRENCY", "eight"),
        ("LANE_WORKER_CONCURRENCY", "2.5"),
        ("LANE_WORKER_CLAIM_TIMEOUT", "-1"),
        ("LANE_WORKER_CLAIM_TIMEOUT", "1"),
        ("LANE_WORKER_POLL_INTERVAL", "nan"),
        ("LANE_WORKER_POLL_INTERVAL", "inf"),
        ("LANE_WORKER_POLL_INTERVAL", "0"),
        ("LANE_WORKER_DRAIN_SECONDS", "-5"),
        ("LANE_WORKER_PRUNE_AFTER", "24h"),
        ("LANE_WORKER_PRUNE_AFTER", "-1"),
        ("LANE_WORKER_DEV_LANE_IDLE_AFTER", "7d"),
        ("LANE_WORKER_DEV_LANE_IDLE_AFTER", "-1"),
        ("LANE_WORKER_DEV_LANE_IDLE_AFTER", "31536001"),
        ("LANE_WORKER_HEALTH_PORT", "65536"),
        ("LANE_WORKER_HEALTH_PORT", "http"),
        ("LANE_WORKER_MAX_ATTEMPTS", "0"),
        ("LANE_WORKER_LOG_FORMAT", "xml"),
        ("DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", "pr-123; drop table x"),
        ("DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", "s" * 64),
    ],
)
def test_malformed_value_is_refused_naming_its_variable(variable: str, value: str) -> None:
    """Every malformed tuning value refuses boot with a sentence naming the variable."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_ABSURD_QUEUE_SUFFIX": "wt", variable: value}
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(variable)


def test_tuning_values_are_parsed() -> None:
    """Valid tuning values land in Settings with their units."""
    settings = Settings.from_env(
        {
            "WORKFLOW_RUNTIME_POSTGRES": DB,
            "LANE_WORKER_CONCURRENCY": " 16 ",
            "LANE_WORKER_CLAIM_TIMEOUT": "30",
            "LANE_WORKER_POLL_INTERVAL": "0.25",
            "LANE_WORKER_DRAIN_SECONDS": "0",
            "LANE_WORKER_HEALTH_PORT": "0",
            "LANE_WORKER_MAX_ATTEMPTS": "3",
            "LANE_WORKER_LOG_FORMAT": "JSON",
            "LANE_WORKER_PRUNE_AFTER": "0",
            "LANE_WORKER_DEV_LANE_IDLE_AFTER": "3600",
            "LANE_WORKER_DRAIN_SECONDS_IGNORED": "",
        }
    )
    tuning = settings.tuning
    assert (tuning.concurrency, tuning.claim_timeout_s, tuning.poll_interval_s) == (16, 30, 0.25)
    assert (tuning.drain_s, tuning.health_port, tuning.max_attempts) == (0.0, 0, 3)
    assert tuning.log_format == "json"
    assert tuning.prune_after_s == 0.0
    assert Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB}).tuning.prune_after_s == 86_400.0
    assert tuning.dev_lane_idle_after_s == 3600.0
    default = Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB}).tuning
    assert default.dev_lane_idle_after_s == 604_800.0  # a week: a long weekend keeps the lane


def test_blank_tuning_value_means_default() -> None:
    """`NAME=` in an env file keeps the default instead of refusing."""
    settings = Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB, "LANE_WORKER_CONCURRENCY": ""})
    assert settings.tuning.concurrency == 8


def test_unknown_lane_worker_variable_is_a_warning() -> None:
    """A misspelt LANE_WORKER_* variable is reported by doctor but does not refuse boot."""
    diagnosis = diagnose({"WORKFLOW_RUNTIME_POSTGRES": DB, "LANE_WORKER_CONCURENCY": "4"})
    assert diagnosis.exit_code == EXIT_OK
    assert any("LANE_WORKER_CONCURENCY" in w for w in diagnosis.warnings)


def test_vercel_shrinks_the_client_pool_only() -> None:
    """In serverless the client holds one connection; a worker still holds two."""
    settings = Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB, "VERCEL": "1"})
    assert settings.client_pool_size == 1
    assert (
        diagnose({"WORKFLOW_RUNTIME_POSTGRES": DB, "VERCEL": "1"}).as_json()["workerPoolSize"] == 2
    )
    assert Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB}).client_pool_size == 2


def test_all_problems_are_listed_and_the_first_refuses() -> None:
    """diagnose lists every problem; Settings raises the first (the lane comes first)."""
    env = {"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_9", "LANE_WORKER_CONCURRENCY": "x"}
    variables = [e.variable for e in diagnose(env).errors]
    assert variables == [
        "DEEPLINE_ABSURD_QUEUE_SUFFIX",
        "LANE_WORKER_CONCURRENCY",
        "WORKFLOW_RUNTIME_POSTGRES",
    ]
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == "DEEPLINE_ABSURD_QUEUE_SUFFIX"


def test_password_never_in_repr_or_diagnosis() -> None:
    """The database password appears in neither the settings repr nor the doctor JSON."""
    url = "postgresql://app:hunter2@db.internal:6432/runtime?sslmode=require&password=hunter3"
    settings = Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": url})
    assert settings.database_url == url
    assert "hunter" not in repr(settings)
    assert "hunter" not in settings.database_url_redacted
    assert "hunter" not in str(diagnose({"WORKFLOW_RUNTIME_POSTGRES": url}).as_json())


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@h:5432/d", "postgresql://u:***@h:5432/d"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        (
            "postgresql://u:p:q@h/d?password=x&sslmode=require",
            "postgresql://u:***@h/d?password=***&sslmode=require",
        ),
        ("postgresql:///d?host=/var/run/postgresql", "postgresql:///d?host=/var/run/postgresql"),
        ("postgresql://u:p@[::1", "<malformed URL, not shown>"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    """redact_url hides passwords in the userinfo and the query string."""
    assert redact_url(url) == expected


@pytest.mark.parametrize("deploy_version", ["DEV", "dev-foo", "-dev-", " Dev "])
def test_deploy_version_spelled_like_a_dev_lane_is_refused(deploy_version: str) -> None:
    """A release id whose launch slug and worker id would name two queues refuses boot."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_RUNTIME_DEPLOY_VERSION": deploy_version}
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == "DEEPLINE_RUNTIME_DEPLOY_VERSION"
    assert "dev-" in str(caught.value)


def test_suffix_cut_before_an_underscore_is_a_warning() -> None:
    """A 33-char suffix cut to end in '_' boots (the app agrees) but doctor warns."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, "DEEPLINE_ABSURD_QUEUE_SUFFIX": "a" * 31 + "-b"}
    diagnosis = diagnose(env)
    assert diagnosis.exit_code == EXIT_OK
    assert diagnosis.queue == "runs_" + "a" * 31
    assert any("at most 31 characters" in w for w in diagnosis.warnings)


def test_the_store_schema_is_the_scheduler_schema_unless_lane_worker_store_schema_is_set() -> None:
    """A store of its own changes where the tables live, never the lane rules."""
    base = {"WORKFLOW_RUNTIME_POSTGRES": "postgresql://u@h/db"}
    default = diagnose(base)
    assert (default.scheduler_schema, default.store_schema) == ("runtime_scheduler",) * 2
    own = diagnose({**base, "LANE_WORKER_STORE_SCHEMA": "lane_worker_store"})
    assert (own.store_schema, own.scheduler_schema, own.isolated, own.queue) == (
        "lane_worker_store", "runtime_scheduler", False, "runs",
    )  # fmt: skip
    assert (own.errors, own.warnings) == ((), ())
    for bad in ("absurd", "1abc", "a-b", "pg_x"):
        (error,) = diagnose({**base, "LANE_WORKER_STORE_SCHEMA": bad}).errors
        assert error.variable == "LANE_WORKER_STORE_SCHEMA"
        assert str(error).startswith(f"LANE_WORKER_STORE_SCHEMA={bad!r} is ")


@pytest.mark.parametrize(
    ("value", "loop"), [(None, "uvloop"), ("", "uvloop"), ("AsyncIO", "asyncio")]
)
def test_the_event_loop_defaults_to_uvloop(value: str | None, loop: str) -> None:
    """LANE_WORKER_EVENT_LOOP: uvloop unless asyncio is asked for (any case); blank is unset."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB}
    if value is not None:
        env["LANE_WORKER_EVENT_LOOP"] = value
    assert Settings.from_env(env).tuning.event_loop == loop


def test_an_unknown_event_loop_is_refused_naming_the_variable() -> None:
    """A value that names no loop is refused (78), not guessed."""
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB, "LANE_WORKER_EVENT_LOOP": "tokio"})
    assert caught.value.variable == "LANE_WORKER_EVENT_LOOP"
    assert "'tokio' is not valid: set it to uvloop or asyncio" in str(caught.value)
