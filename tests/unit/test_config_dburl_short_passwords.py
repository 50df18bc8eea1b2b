"""A short database password is masked as a whole word, never inside the daemon's own words."""

from __future__ import annotations

from worker.config.dburl import mask_secrets, url_secrets
from worker.config.settings import diagnose

SHORT = "postgresql://postgres:run@127.0.0.1:5432/db"
LONG = "postgresql://postgres:runrunrun@127.0.0.1:5432/db"


def test_a_short_password_is_masked_only_where_it_stands_alone() -> None:
    text = "run.started on runs_rel_c; connect postgres:run@h failed ('run')"
    assert mask_secrets(text, url_secrets(SHORT)) == (
        "***.started on runs_rel_c; connect postgres:***@h failed ('***')"
    )


def test_the_daemon_s_own_names_keep_their_letters() -> None:
    for name in ("runs_rel_c", "runtime_scheduler", "rerun", "run_id"):
        assert mask_secrets(name, url_secrets(SHORT)) == name


def test_a_long_password_is_masked_wherever_it_occurs() -> None:
    assert mask_secrets("xrunrunrunx", url_secrets(LONG)) == "x***x"


def test_doctor_warns_about_a_short_password_only() -> None:
    env = {"WORKFLOW_RUNTIME_POSTGRES": SHORT}
    assert any("shorter than 8" in w for w in diagnose(env).warnings)
    env = {"WORKFLOW_RUNTIME_POSTGRES": LONG}
    assert not any("shorter than 8" in w for w in diagnose(env).warnings)


def test_the_daemon_s_log_lines_keep_their_event_names_and_queues() -> None:
    import structlog
    from structlog.testing import capture_logs

    from worker.daemon import logs

    logs.configure("json", secrets=url_secrets(SHORT))
    try:
        with capture_logs(processors=structlog.get_config()["processors"][:-1]) as lines:
            structlog.get_logger("t").info(
                "run.started", queue="runs_rel_c", error="connect postgres:run@h failed"
            )
    finally:
        logs.configure("json")
    [line] = lines
    assert (line["event"], line["queue"]) == ("run.started", "runs_rel_c")
    assert line["error"] == "connect postgres:***@h failed"
