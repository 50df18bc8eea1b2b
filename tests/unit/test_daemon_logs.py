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
