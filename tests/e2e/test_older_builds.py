"""Older builds of lane-worker beside HEAD on one database (issue 29 §1).

Each build of ``support.builds.OLDER_BUILDS`` (earlier commits of this repository,
each in its own environment from its own lock file, running its own code and its
own ``support.apps``) is release OLD; HEAD is release NEW. One story per build,
on a database the old build installs first:

1. roll forward: OLD claims alone, then NEW boots (migrates the store, installs its
   contracts), OLD is retired while it holds runs mid-step and parked waiters;
2. an old machine SIGKILLed mid-drain and restarted: its boot installs its own
   engine objects again (so do the old build's `migrate` and its app's client),
   and NEW's own runs must keep completing after it; OLD
   finishes its runs, NEW adopts OLD's parked waiters once signalled;
3. a late old machine boots after OLD drained (and refuses, after its install);
4. rollback: OLD is activated again and NEW retired; OLD takes the new runs and NEW
   finishes its own while draining.

Judged in the database: every run completed, with exactly one ledger fact, each
step run once (a step cut by the SIGKILL at most twice), and no daemon, old or new,
ever logged ``loop.claim_failed``. On main before versioned contracts, the restarted
old machine of build dd1325a made NEW's every claim fail ("unknown claim mode all").
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from support import builds, step_logged
from support.builds import OLDER_BUILDS, Build, build
from support.cli import cli_env, lane_worker
from support.daemon import Daemon, Daemons, base_env
from support.db import fetch, sql
from support.runtime import SCHEMA, eventually

OLD, NEW = "lw-old", "lw-new"
APP = "support.apps.basic:app"
# Short leases on the old machines: the SIGKILLed one's runs are swept soon.
OLD_ENV = {"LANE_WORKER_CLAIM_TIMEOUT": "5"}
DONE_S = 60.0


class Story:
    """The runs a story submitted (each with its own step-record directory) and its daemons."""

    def __init__(self, url: str, pool: Daemons, old: Build, tmp: Path) -> None:
        self.url, self.pool, self.old, self.tmp = url, pool, old, tmp
        self.dirs: dict[str, Path] = {}
        self.waiters: list[str] = []
        self.cut: set[str] = set()  # runs whose step two a SIGKILL may have cut

    def start_old(self, name: str) -> Daemon:
        """Start a machine of release OLD on the old build (its code, its apps)."""
        env = {**base_env(self.url, OLD), **OLD_ENV, "PYTHONPATH": str(self.old.tests_dir)}
        argv = self.old.argv("run", "--app", APP)
        return self.pool.start_raw(name, env, argv=argv, cwd=self.old.root)

    async def submit(self, release: str, seconds: float = 0) -> str:
        """Submit a `slow` run through the store's SQL API (the app's way, any build's)."""
        directory = self.tmp / f"run{len(self.dirs)}"
        directory.mkdir()
        run_id: str = await sql(
            self.url,
            f"select ({SCHEMA}.submit_run('slow', $1::jsonb, $2))->>'runId'",
            {"dir": str(directory), "seconds": seconds},
            release,
        )
        self.dirs[run_id] = directory
        return run_id

    async def old_cli(self, *args: str) -> str:
        """Run the old build's ``lane-worker ARGS`` as OLD's operator or app; return stdout."""
        proc = await asyncio.create_subprocess_exec(
            *self.old.argv(*args),
            cwd=self.old.root,
            env={**cli_env({}), "WORKFLOW_RUNTIME_POSTGRES": self.url,
                 "DEEPLINE_RUNTIME_DEPLOY_VERSION": OLD},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, (args, out, err)
        return out.decode()

    async def submit_by_old_app(self) -> str:
        """Submit a `slow` run to OLD with the old build's own client (its CLI)."""
        directory = self.tmp / f"run{len(self.dirs)}"
        directory.mkdir()
        params = json.dumps({"dir": str(directory), "seconds": 0})
        run_id: str = json.loads(await self.old_cli("submit", "slow", "--input", params, "--json"))[
            "runId"
        ]
        self.dirs[run_id] = directory
        return run_id

    async def submit_waiter(self) -> str:
        """Submit to OLD a run that parks until event ``go`` (adoptable once OLD retires)."""
        run_id: str = await sql(
            self.url, f"select ({SCHEMA}.submit_run('waiter', '{{}}'::jsonb, $1))->>'runId'", OLD
        )
        self.waiters.append(run_id)
        return run_id

    async def signal(self, run_ids: list[str]) -> None:
        """Send event ``go`` to each run through the store's SQL API."""
        for run_id in run_ids:
            signal = f"select {SCHEMA}.signal_run($1::uuid, 'go', '{{}}'::jsonb)"
            await sql(self.url, signal, run_id)

    async def completed(self, run_ids: list[str], what: str) -> None:
        """Wait until every run of ``run_ids`` completed."""

        async def done() -> bool:
            rows = await fetch(
                self.url,
                f"select count(*) as n from {SCHEMA}.runs"
                " where run_id = any($1::uuid[]) and status = 'completed'",
                run_ids,
            )
            return bool(rows[0]["n"] == len(run_ids))

        await eventually(done, timeout_s=DONE_S, what=what)

    async def steps_started(self, run_ids: list[str]) -> None:
        """Wait until step two of every run began."""

        def begun() -> bool:
            return all(step_logged(self.dirs[r] / "two.log") for r in run_ids)

        async def check() -> bool:
            return begun()

        await eventually(check, timeout_s=DONE_S, what="step two to begin")

    async def parked(self, run_ids: list[str]) -> None:
        """Wait until every run of ``run_ids`` is parked in its wait."""

        async def check() -> bool:
            rows = await fetch(
                self.url,
                f"select count(*) as n from {SCHEMA}.runs"
                " where run_id = any($1::uuid[]) and status = 'waiting'",
                run_ids,
            )
            return bool(rows[0]["n"] == len(run_ids))

        await eventually(check, timeout_s=DONE_S, what="the waiters to park")


async def operator(url: str, *args: str) -> None:
    """Run HEAD's ``lane-worker ARGS`` as the operator; it must succeed."""
    done = await lane_worker(url, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sha", list(OLDER_BUILDS))
async def test_an_older_build_beside_head_every_run_once_no_claim_failing(
    empty_database_url: str, tmp_path: Path, sha: str
) -> None:
    """Roll forward, a killed and restarted old machine, a late one, rollback: all runs once."""
    old = await asyncio.to_thread(build, sha)
    url = empty_database_url
    async with Daemons(url) as pool:
        story = Story(url, pool, old, tmp_path)

        # 1. OLD alone, on a database it installs; then NEW rolls forward.
        a1 = story.start_old("old#1")
        await a1.ready(timeout_s=60)
        alone = [await story.submit(OLD) for _ in range(3)]
        await story.completed(alone, "the old build's first runs")
        waiters = [await story.submit_waiter() for _ in range(2)]
        await story.parked(waiters)
        b = pool.start(NEW, name="new")
        await b.ready(timeout_s=60)
        beside = [await story.submit(NEW) for _ in range(3)]
        await story.completed(beside, "NEW's runs beside OLD")

        # 2. OLD retired mid-step; its machine SIGKILLed and restarted (its install runs).
        held = [await story.submit(OLD, seconds=3600) for _ in range(2)]
        await story.steps_started(held)
        story.cut.update(held)
        await operator(url, "lanes", "retire", OLD)
        a1.kill()
        await a1.wait_exit()
        a2 = story.start_old("old#2")
        await a2.ready(timeout_s=60)
        # And the old build's other installs: its `migrate`, and its app's client.
        await story.old_cli("migrate")
        by_old_app = await story.submit_by_old_app()
        after_old_boot = [await story.submit(NEW) for _ in range(3)]
        await story.completed(after_old_boot, "NEW's runs after an old machine booted")
        await story.signal(waiters)
        await story.completed(
            [*held, *waiters, by_old_app], "OLD's held runs, its adopted waiters, its app's run"
        )
        await operator(url, "lanes", "wait", OLD, "--timeout", "60")
        a2.terminate()
        assert await a2.wait_exit() == 0

        # 3. A late old machine: its lane is drained, so it refuses, after its install.
        a3 = story.start_old("old#3")
        assert await a3.wait_exit(timeout_s=60) == 78
        after_late = [await story.submit(NEW) for _ in range(3)]
        await story.completed(after_late, "NEW's runs after a late old machine")

        # 4. Rollback: OLD claims again, NEW is retired and finishes its own.
        await operator(url, "lanes", "activate", OLD)
        a4 = story.start_old("old#4")
        await a4.ready(timeout_s=60)
        draining = [await story.submit(NEW, seconds=2) for _ in range(2)]
        await story.steps_started(draining)
        await operator(url, "lanes", "retire", NEW)
        rolled_back = [await story.submit(OLD) for _ in range(3)]
        await story.completed(rolled_back + draining, "the rollback's runs")
        await operator(url, "lanes", "wait", NEW, "--timeout", "60")

        await assert_every_run_once(story)
        failing = {d.name: d.events("loop.claim_failed") for d in pool.started}
        assert not any(failing.values()), failing
        await assert_one_spelling(story)


async def assert_one_spelling(story: Story) -> None:
    """HEAD's readers name both releases as deployed (issue 31 §1), whichever build wrote.

    The old build wrote its own release as the segment (``lw_old``) and its rows keep it;
    once the release registry knows OLD, HEAD's ``run_status`` and ``lanes`` show
    ``lw-old`` for them. NEW (HEAD) wrote ``lw-new`` itself.
    """
    waiter = story.waiters[0]
    written = await fetch(
        story.url,
        f"select release_id, disposition from {SCHEMA}.attempts"
        " where run_id = $1::uuid and disposition in ('own', 'adopt') order by attempt_id",
        waiter,
    )
    by = {(r["disposition"], r["release_id"]) for r in written}
    assert ("own", "lw_old") in by, by  # the old build wrote the segment
    assert by <= {("own", "lw_old"), ("adopt", NEW)}, by
    await operator(story.url, "releases", "deploy", OLD, "--image", APP, "--machines", "0")
    said = json.loads(await sql(story.url, f"select {SCHEMA}.run_status($1::uuid)::text", waiter))
    assert said["releaseId"] == OLD
    assert said["adoptedReleaseId"] == (NEW if ("adopt", NEW) in by else None)
    shown = {(a["disposition"], a["releaseId"]) for a in said["attempts"]}
    assert {x for x in shown if x[0] in ("own", "adopt")} == {
        ("own", OLD),
        *((("adopt", NEW),) if ("adopt", NEW) in by else ()),
    }
    done = await lane_worker(story.url, "lanes", "--json")
    assert done.returncode == 0, done.stderr
    named = {lane["queue"]: lane["releaseId"] for lane in json.loads(done.stdout)["lanes"]}
    assert (named["runs_lw_old"], named["runs_lw_new"]) == (OLD, NEW)


async def assert_every_run_once(story: Story) -> None:
    """Every run completed with one ledger fact; each step ran once (a cut one at most twice)."""
    run_ids = [*story.dirs, *story.waiters]
    rows = await fetch(
        story.url,
        f"select r.run_id::text as run_id, r.status,"
        f"       array(select l.type from {SCHEMA}.ledger l where l.run_id = r.run_id) as facts"
        f"  from {SCHEMA}.runs r where r.run_id = any($1::uuid[])",
        run_ids,
    )
    assert {r["run_id"]: (r["status"], r["facts"]) for r in rows} == {
        run_id: ("completed", ["run.completed"]) for run_id in run_ids
    }
    for run_id, directory in story.dirs.items():
        ran = {
            step: len((directory / f"{step}.log").read_text().splitlines())
            for step in ("one", "two")
        }
        assert ran["one"] == 1, (run_id, ran)
        assert ran["two"] == 1 or (run_id in story.cut and ran["two"] == 2), (run_id, ran)


def test_a_checkout_without_an_older_builds_commit_fails_saying_how_to_fetch_it() -> None:
    """A shallow clone gets one sentence naming the commit and the fetch, never a silent skip."""
    with pytest.raises(pytest.fail.Exception) as failed:
        builds.require_commit("0000000000000000000000000000000000000000")
    message = str(failed.value)
    assert "0000000000000000000000000000000000000000" in message
    assert "git fetch --unshallow" in message
    assert "\n" not in message
