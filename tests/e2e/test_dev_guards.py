"""``lane-worker dev`` stays a dev tool on a shared database (real processes, real PostgreSQL).

A shell that deployed keeps DEEPLINE_RUNTIME_DEPLOY_VERSION: `dev` run there must not
join that release's lane. And `dev --app` must not run the user's plays on the demo's
inputs when their names collide with the demo's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.test_dev import DevRunner, dev_env

from support.daemon import Daemons
from support.db import sql
from support.runtime import SCHEMA, open_client
from worker import lanes
from worker.config.settings import DATABASE_URL_ENV
from worker.errors import EXIT_CONFIG

RELEASE = "rel-prod"


@pytest.fixture
def devs(tmp_path: Path) -> Iterator[DevRunner]:
    runner = DevRunner(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


async def test_dev_with_a_leftover_deploy_version_refuses_and_leaves_the_release_alone(
    database_url: str, devs: DevRunner
) -> None:
    """A release serves its lane with a parked run; `dev` in a shell that still has the
    release's deploy version (no suffix) is refused with one sentence, exit 78, and
    neither registers on the release's lane nor submits anything there."""
    release_env = {lanes.RELEASE_ID_ENV: RELEASE}
    async with Daemons(database_url) as pool, open_client(database_url, release_env) as client:
        rel = pool.start(RELEASE, name="release")
        queue = (await rel.ready())["queue"]
        run = await client.submit("waiter", {})
        await rel.wait_for("run.parked", run_id=run.run_id)

        env = dev_env(**{DATABASE_URL_ENV: database_url, lanes.RELEASE_ID_ENV: RELEASE})
        dev = devs.start("leftover", "--exit-after-demo", env=env)
        assert await dev.wait_exit() == EXIT_CONFIG, dev.tail()
        (said,) = dev.output.strip().splitlines()
        assert said.startswith("lane-worker: lane-worker dev serves a dev lane"), said
        assert "lane-worker run" in said, said
        assert lanes.RELEASE_ID_ENV in said, said

        workers = await sql(
            database_url, f"select array_agg(release_id) from {SCHEMA}.workers where queue = $1",
            queue,
        )  # fmt: skip
        assert workers == [RELEASE]
        assert await sql(database_url, f"select count(*) from {SCHEMA}.runs") == 1
        rel.terminate()
        assert await rel.wait_exit(timeout_s=15) == 0


PLAYS = '''
from typing import Any

from worker import App, TaskContext

app = App()


@app.play("greet")
async def greet(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """The app's own greet: it expects a person, not the demo's input."""
    return {"sent_to": params["person"]}
'''


async def test_dev_with_an_app_submits_no_demo_run_to_its_plays(
    database_url: str, devs: DevRunner
) -> None:
    """`dev --app myproj.plays:app` whose app has a play named `greet` (as the demo's):
    the worker serves the app, and no demo run is submitted to the app's play."""
    package = devs.tmp_path / "myproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plays.py").write_text(PLAYS)
    env = dev_env(**{DATABASE_URL_ENV: database_url, lanes.QUEUE_SUFFIX_ENV: "mine"})
    dev = devs.start("own-app", "--app", "myproj.plays:app", "--exit-after-demo", env=env)
    assert await dev.wait_exit() == 0, dev.tail()
    assert "dev: the demo runs are submitted only with the demo app" in dev.output, dev.tail()
    assert await sql(database_url, f"select count(*) from {SCHEMA}.runs") == 0
    # The worker did serve the app's lane before it stopped.
    assert await sql(
        database_url, f"select count(*) from {SCHEMA}.workers where queue = 'runs_mine'"
    ) == 1  # fmt: skip
