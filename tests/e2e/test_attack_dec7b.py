"""Attacks of 2026-12-07 (b) on dev lanes standing apart, idle dev lanes and their neighbours.

Each xfail(strict) test is a defect found against real Postgres and real daemons:
it fails on the code of its commit and passes once the defect is fixed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from support.builds import build
from support.cli import lane_worker
from support.daemon import TESTS_DIR, Daemon, Daemons, base_env
from support.db import execute, sql
from support.runtime import SCHEMA, open_client
from support.scaler import passes_seen, scaler_running


async def finished_by(daemons: tuple[Daemon, ...], run_id: str) -> Daemon:
    """The daemon that logs the run's completion first (whichever of them)."""
    while True:
        for daemon in daemons:
            if daemon.events("run.completed", run_id=run_id):
                return daemon
        await asyncio.sleep(0.05)


SHARED = "foo"  # a release id and a worktree suffix that both give queue runs_foo
QUEUE_SHARED = "runs_foo"
NEWER = "rel-newer"


async def test_a_worktree_on_a_release_s_queue_never_runs_the_release_s_parked_run(
    database_url: str,
) -> None:
    """Release foo parks a run and retires behind rel-newer; a worktree with suffix foo boots.

    The run must be adopted by rel-newer (or the worktree refused): never executed by
    the worktree's code, never stranded.
    """
    rel_env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": SHARED}
    async with Daemons(database_url) as pool, open_client(database_url, rel_env) as client:
        rel = pool.start(SHARED, name="rel-foo")
        assert (await rel.ready())["queue"] == QUEUE_SHARED
        run = await client.submit("waiter", {})
        await rel.wait_for("run.parked", run_id=run.run_id)
        rel.terminate()
        assert await rel.wait_exit(timeout_s=15) == 0

        newer = pool.start(NEWER, name="rel-newer")
        await newer.ready()
        assert await client.retire_release(SHARED) == QUEUE_SHARED

        dev = pool.start(
            f"dev-{SHARED}", name="worktree", DEEPLINE_ABSURD_QUEUE_SUFFIX=SHARED,
            DEEPLINE_RUNTIME_DEPLOY_VERSION=None,
        )  # fmt: skip
        # The worktree is refused (78), saying the queue, the release and the remedy.
        assert not await ready_or_exited(dev)
        assert dev.proc.returncode == 78, dev.tail()
        said = dev.stderr
        assert QUEUE_SHARED in said, said
        assert repr(SHARED) in said, said
        assert "DEEPLINE_ABSURD_QUEUE_SUFFIX" in said, said
        assert not (await client.signal(run.run_id, "go", {"by": "attack"})).duplicate
        await finished_by((newer,), run.run_id)
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert status.adopted_release_id == NEWER
        assert not dev.events(run_id=run.run_id)
        newer.terminate()
        await newer.wait_exit(timeout_s=15)
        rows = await sql(
            database_url, f"select release_ids from {SCHEMA}.releases where queue = $1",
            QUEUE_SHARED,
        )  # fmt: skip
        assert rows == [SHARED]  # the lane stays a release lane: no dev spelling joined


SLEEPER = "sleeper"
QUEUE_SLEEPER = "runs_sleeper"
AGED = {"LANE_WORKER_DEV_LANE_IDLE_AFTER": "3600", "LANE_WORKER_PRUNE_AFTER": "60"}


async def age_lane(database_url: str, queue: str) -> None:
    """Two hours pass on lane ``queue`` with no heartbeat (a laptop asleep, a stopped VM)."""
    for statement in (
        f"update {SCHEMA}.releases set updated_at = now() - interval '2 hours',"
        " retired_at = case when retired_at is not null then now() - interval '2 hours' end"
        " where queue = $1",
        f"update {SCHEMA}.workers set heartbeat_at = now() - interval '2 hours' where queue = $1",
    ):
        await execute(database_url, statement, queue)


async def stop_between_transactions(database_url: str, daemon: Daemon) -> None:
    """SIGSTOP ``daemon`` when none of its sessions is inside a statement or transaction.

    Frozen mid-transaction (its heartbeat's, say) it would hold its row locks, and the
    maintenance this test waits for would wait on them for good.
    """
    names = [f"lane-worker dev-{SLEEPER}", f"lane-worker-report dev-{SLEEPER}"]
    while True:
        os.kill(daemon.pid, signal.SIGSTOP)
        busy = await sql(
            database_url,
            "select count(*) from pg_stat_activity where datname = current_database()"
            " and application_name = any($1) and state <> 'idle'",
            names,
        )
        if busy == 0:
            return
        os.kill(daemon.pid, signal.SIGCONT)
        await asyncio.sleep(0.05)


# Three daemons boot in turn and two maintenance passes must act: on a loaded machine that
# outlasts the suite's 120 s default (CI, embedded PostgreSQL 18, once).
@pytest.mark.timeout(300)
async def test_a_dev_worker_that_wakes_after_its_lane_was_pruned_serves_it_again(
    database_url: str,
) -> None:
    """SIGSTOP a worktree worker, let maintenance retire and prune its lane, SIGCONT it.

    The worker is alive and serving: its lane must claim again and a run submitted
    there must complete, as if its worker had booted again.
    """
    dev_env = {"DEEPLINE_ABSURD_QUEUE_SUFFIX": SLEEPER}
    async with Daemons(database_url) as pool, open_client(database_url, dev_env) as client:
        dev = pool.start(
            f"dev-{SLEEPER}", name="sleeper", DEEPLINE_ABSURD_QUEUE_SUFFIX=SLEEPER,
            DEEPLINE_RUNTIME_DEPLOY_VERSION=None,
        )  # fmt: skip
        assert (await dev.ready())["queue"] == QUEUE_SLEEPER
        first = await client.submit("plain", {})
        await dev.wait_for("run.completed", run_id=first.run_id)
        await stop_between_transactions(database_url, dev)
        try:
            await age_lane(database_url, QUEUE_SLEEPER)
            keeper = pool.start("rel-keeper", name="keeper", **AGED)
            await keeper.wait_for("lane.dev_retired", queue=QUEUE_SLEEPER)
            keeper.terminate()
            await keeper.wait_exit(timeout_s=15)
            await age_lane(database_url, QUEUE_SLEEPER)
            keeper = pool.start("rel-keeper", name="keeper-again", **AGED)
            await keeper.wait_for("lane.pruned", queue=QUEUE_SLEEPER)
            keeper.terminate()
            await keeper.wait_exit(timeout_s=15)
        finally:
            os.kill(dev.pid, signal.SIGCONT)
        # The worker wakes and reads its lane again (it logs what it finds).
        await dev.wait_for("lane.drained")
        # Its lane retired under it: it makes the lane claim again, as its boot would.
        await dev.wait_for("lane.dev_activated", queue=QUEUE_SLEEPER)
        status = await sql(
            database_url, f"select status from {SCHEMA}.releases where queue = $1", QUEUE_SLEEPER
        )
        assert status == "claiming"
        again = await client.submit("plain", {})
        await dev.wait_for("run.completed", run_id=again.run_id)
        dev.terminate()
        await dev.wait_exit(timeout_s=15)


SCALER_PASSWORD = "s3cr3t-scaler-pw-7731"
FLY_TOKEN = "FlyV1 fm2_attack_token_0042"


async def test_the_deploy_time_app_check_never_shows_the_scaler_s_secrets(
    database_url: str, tmp_path: Path
) -> None:
    """The scaler's environment has a password and a token the deployer does not have.

    A release whose app fails at import with an error naming them is refused (exit 2),
    and neither secret reaches the deployer's output.
    """
    app_dir = tmp_path / "apps"
    app_dir.mkdir()
    (app_dir / "leaky_import.py").write_text(
        "import os\n"
        "raise RuntimeError('cannot start: ' + os.environ['WORKFLOW_RUNTIME_POSTGRES']"
        " + ' token ' + os.environ.get('FLY_API_TOKEN', ''))\n"
    )
    # Trust authentication here: the password is carried, never checked.
    scheme, rest = database_url.split("://", 1)
    user, host = rest.split("@", 1)
    with_password = f"{scheme}://{user.split(':', 1)[0]}:{SCALER_PASSWORD}@{host}"
    state = tmp_path / "machines"
    async with scaler_running(
        database_url, state, tmp_path / "scaler.log",
        WORKFLOW_RUNTIME_POSTGRES=with_password, FLY_API_TOKEN=FLY_TOKEN,
        PYTHONPATH=f"{TESTS_DIR}{os.pathsep}{app_dir}",
    ):  # fmt: skip
        await passes_seen(database_url, 1)
        done = await lane_worker(
            database_url, "releases", "deploy", "leak-a", "--image", "leaky_import:app"
        )
    assert done.returncode == 2, (done.stdout, done.stderr)
    said = done.stdout + done.stderr
    assert "was not deployed" in said, said
    assert SCALER_PASSWORD not in said, said
    assert "fm2_attack_token_0042" not in said, said


OLD_BUILD = "395febb"  # main's last commit of 0.2.1 (support.builds.OLDER_BUILDS)
OLD_SUFFIX = "oldwt"
QUEUE_OLD_WT = "runs_oldwt"


NEW_SUFFIX = "newwt"
QUEUE_NEW_WT = "runs_newwt"


async def test_an_older_build_s_worktree_lane_is_never_retired_idle_and_it_boots_again(
    database_url: str,
) -> None:
    """A worktree runs the 0.2.1 build, another HEAD; both lanes go idle past the limit.

    Only a HEAD worker's boot activates a retired dev lane again, and a 0.2.1 worker
    coming back to a retired lane refuses as a drained release would: maintenance
    retires the HEAD worktree's idle lane, never the older build's (its last worker's
    recorded version says which), and the 0.2.1 worktree boots again and serves.
    """
    old = build(OLD_BUILD)
    env = {
        **base_env(database_url, "unused"),
        "PYTHONPATH": str(old.tests_dir),
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": OLD_SUFFIX,
    }
    env.pop("DEEPLINE_RUNTIME_DEPLOY_VERSION")
    argv = old.argv("run", "--app", "support.apps.basic:app")
    async with Daemons(database_url) as pool:
        wt = pool.start_raw("old-worktree", env, argv=argv, cwd=old.root)
        assert (await wt.ready())["queue"] == QUEUE_OLD_WT
        wt.terminate()
        assert await wt.wait_exit(timeout_s=15) == 0
        new = pool.start(
            f"dev-{NEW_SUFFIX}", name="head-worktree", DEEPLINE_ABSURD_QUEUE_SUFFIX=NEW_SUFFIX,
            DEEPLINE_RUNTIME_DEPLOY_VERSION=None,
        )  # fmt: skip
        assert (await new.ready())["queue"] == QUEUE_NEW_WT
        new.terminate()
        assert await new.wait_exit(timeout_s=15) == 0

        for queue in (QUEUE_OLD_WT, QUEUE_NEW_WT):
            await age_lane(database_url, queue)
        keeper = pool.start("rel-keeper", name="keeper", **AGED)
        # The pass that retired the HEAD worktree's lane listed both idle lanes.
        await keeper.wait_for("lane.dev_retired", queue=QUEUE_NEW_WT)
        passed = await keeper.wait_for("maintenance.passed", since=keeper.index_of(
            "lane.dev_retired", queue=QUEUE_NEW_WT))  # fmt: skip
        assert passed["dev_retired"] == 1, passed
        assert not keeper.events("lane.dev_retired", queue=QUEUE_OLD_WT)
        keeper.terminate()
        await keeper.wait_exit(timeout_s=15)
        status = await sql(
            database_url, f"select status from {SCHEMA}.releases where queue = $1", QUEUE_OLD_WT
        )
        assert status == "claiming"

        back = pool.start_raw("old-worktree-back", env, argv=argv, cwd=old.root)
        await back.ready()
        run_id = await sql(
            database_url,
            f"select ({SCHEMA}.submit_run('plain', '{{}}'::jsonb, $1))->>'runId'",
            f"dev-{OLD_SUFFIX}",
        )
        await back.wait_for("run.completed", run_id=run_id)
        back.terminate()
        await back.wait_exit(timeout_s=15)


async def test_a_refused_app_s_traceback_is_shown_where_the_refusal_says(
    database_url: str, tmp_path: Path
) -> None:
    app_dir = tmp_path / "apps"
    app_dir.mkdir()
    (app_dir / "broken_import.py").write_text(
        "def configure():\n    raise KeyError('SOME_SETTING')\n\nconfigure()\n"
    )
    async with scaler_running(
        database_url, tmp_path / "machines", tmp_path / "scaler.log",
        PYTHONPATH=f"{TESTS_DIR}{os.pathsep}{app_dir}",
    ):  # fmt: skip
        await passes_seen(database_url, 1)
        done = await lane_worker(
            database_url, "releases", "deploy", "tb-a", "--image", "broken_import:app"
        )
    assert done.returncode == 2, (done.stdout, done.stderr)
    said = done.stdout + done.stderr
    assert "KeyError" in said, said
    if "traceback above" in said:
        assert "Traceback (most recent call last)" in said, said
        assert "configure()" in said, said


async def ready_or_exited(daemon: Daemon) -> bool:
    """True once the daemon logged worker.ready, False once it exited without it."""
    while True:
        if daemon.events("worker.ready"):
            return True
        if not daemon.running:
            await daemon.wait_exit()
            return bool(daemon.events("worker.ready"))
        await asyncio.sleep(0.05)


async def test_a_release_machine_never_runs_a_worktree_s_run_on_a_shared_queue(
    database_url: str,
) -> None:
    """A worktree with suffix foo parks a run and stops; a machine of release foo boots.

    The release machine is refused (or leaves the run alone): the worktree's worker,
    started again, is the one that finishes it.
    """
    wt_env = {"DEEPLINE_ABSURD_QUEUE_SUFFIX": SHARED, "DEEPLINE_RUNTIME_DEPLOY_VERSION": None}
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_ABSURD_QUEUE_SUFFIX": SHARED}) as client,
    ):
        wt = pool.start(f"dev-{SHARED}", name="worktree", **wt_env)
        assert (await wt.ready())["queue"] == QUEUE_SHARED
        run = await client.submit("waiter", {})
        await wt.wait_for("run.parked", run_id=run.run_id)
        wt.terminate()
        assert await wt.wait_exit(timeout_s=15) == 0

        rel = pool.start(SHARED, name="release-foo")
        booted = await ready_or_exited(rel)
        # Refused (78), saying the queue, the worktree's id and the remedy.
        assert not booted, rel.tail()
        assert rel.proc.returncode == 78, rel.tail()
        assert QUEUE_SHARED in rel.stderr, rel.stderr
        assert f"'dev-{SHARED}'" in rel.stderr, rel.stderr
        assert "another release id" in rel.stderr, rel.stderr
        assert not (await client.signal(run.run_id, "go", {"by": "attack"})).duplicate
        again = pool.start(f"dev-{SHARED}", name="worktree-again", **wt_env)
        await again.ready()
        done_by = await finished_by((again, rel), run.run_id)
        assert done_by is again, (booted, rel.tail())
        for daemon in (rel, again):
            daemon.terminate()
            await daemon.wait_exit(timeout_s=15)
