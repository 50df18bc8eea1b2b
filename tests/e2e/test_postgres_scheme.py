"""A `postgres://` URL is taken wherever a `postgresql://` one is (issue 31).

Both spellings are the same to libpq, asyncpg and node-postgres; a Heroku or Fly
style `DATABASE_URL` starts with `postgres://`. The daemon, the CLI and the
client must work on it as they do on the other spelling.
"""

from __future__ import annotations

from support.cli import cli_json, lane_worker, lane_worker_json, operator_env
from support.daemon import Daemons
from support.runtime import open_client

RELEASE = "scheme-a"


def short_scheme(url: str) -> str:
    """The same database URL spelled ``postgres://``."""
    scheme, sep, rest = url.partition("://")
    assert sep, url
    assert scheme in ("postgres", "postgresql"), scheme
    return f"postgres://{rest}"


async def test_daemon_cli_and_client_on_a_postgres_scheme_url(database_url: str) -> None:
    url = short_scheme(database_url)
    async with Daemons(url) as pool, open_client(url, {}) as client:
        daemon = pool.start(RELEASE)
        await daemon.ready()
        env = operator_env(url, DEEPLINE_RUNTIME_DEPLOY_VERSION=RELEASE)
        submitted = await cli_json(env, "submit", "plain", "--input", '{"n": 1}')
        done = await client.wait(submitted["runId"], 60)
        assert done.status == "completed", done
        said = await lane_worker_json(url, "status", submitted["runId"])
        assert said["status"] == "completed"
        doctor = await lane_worker(url, "doctor")
        assert doctor.returncode == 0, doctor.stderr
    bad = await lane_worker("postgress://u@127.0.0.1/x", "lanes")
    assert bad.returncode == 78
    assert "is not a postgres:// or postgresql:// URL (scheme 'postgress')" in bad.stderr
