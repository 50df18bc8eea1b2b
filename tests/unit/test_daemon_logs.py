"""Log lines never carry the database password, whatever text a driver error holds."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from worker.config.dburl import url_secrets

URL = "postgresql://lane:s3cr%2Fet-pass@db:5432/runtime?sslmode=require&password=other-Secret"


def test_url_secrets_names_every_password_spelling() -> None:
    """The userinfo password (decoded and as written) and a password= parameter."""
    assert set(url_secrets(URL)) == {"s3cr/et-pass", "s3cr%2Fet-pass", "other-Secret"}
    assert url_secrets("postgresql://lane@db/runtime") == ()
    # A malformed URL is refused before use; all of it counts as secret meanwhile.
    assert url_secrets("postgresql://[bad") == ("[bad",)


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_secrets_are_masked_in_structlog_and_stdlib_lines(log_format: str) -> None:
    """A secret inside an event value, nested or in a library's warning, is printed as ***."""
    program = textwrap.dedent(
        f"""
        import logging, structlog
        from worker.daemon import logs
        from worker.config.dburl import url_secrets
        logs.configure({log_format!r}, secrets=url_secrets({URL!r}))
        structlog.get_logger("t").warning(
            "db.retry", detail="connect to {URL} failed", nested={{"why": ["s3cr/et-pass"]}}
        )
        logging.getLogger("asyncpg").warning("dsn %s", {URL!r})
        logging.getLogger("asyncpg").warning("bad args %s %s", {URL!r})
        try:
            raise RuntimeError("connect to {URL} failed")
        except RuntimeError:
            logging.getLogger("aiohttp").exception("with a traceback")
        structlog.get_logger("t").warning("obj", error=RuntimeError("pw s3cr/et-pass"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    for secret in url_secrets(URL):
        assert secret not in result.stdout
        assert secret not in result.stderr
    assert "***" in result.stdout
    assert "***" in result.stderr
    assert "db.retry" in result.stdout
    if log_format == "json":
        first, second = (json.loads(line) for line in result.stdout.splitlines())
        assert first["nested"] == {"why": ["***"]}
        assert second["error"] == "pw ***"
    assert "RuntimeError: connect to" in result.stderr  # the traceback is printed, masked


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_an_attempts_traceback_is_a_field_in_json_and_indented_below_in_a_terminal(
    log_format: str,
) -> None:
    """JSON keeps the error as stored; the console prints its traceback under the line."""
    tb = 'Traceback (most recent call last):\n  File "p.py", line 3, in play\nE: boom\n'
    program = textwrap.dedent(
        f"""
        import structlog
        from worker.daemon import logs
        logs.configure({log_format!r})
        error = {{"name": "E", "message": "boom", "traceback": {tb!r}}}
        structlog.get_logger("t").warning("run.attempt_failed", error=error, attempt=1)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    if log_format == "json":
        (line,) = result.stdout.splitlines()
        assert json.loads(line)["error"] == {"name": "E", "message": "boom", "traceback": tb}
        return
    first, *below = result.stdout.splitlines()
    assert "run.attempt_failed" in first
    assert "'message': 'boom'" in first
    assert "traceback" not in first
    assert below == ["    " + x for x in tb.rstrip("\n").splitlines()]
