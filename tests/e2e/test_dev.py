"""``lane-worker dev`` as a developer runs it: a real process, real PostgreSQL, the demo runs.

Each process is the installed ``lane-worker`` entry point, started in its own session
(so a Ctrl-C can go to its whole process group, as a terminal sends it) with the
caller's environment minus every lane-worker and database variable, plus what the test
sets. Output goes to a file in ``tmp_path`` (no pipe can fill up while a test waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from support.cli import LANE_WORKER_SCRIPT, cli_argv
from worker import demo, lanes
from worker.config.settings import DATABASE_URL_ENV, TEST_DATABASE_URL_ENV
from worker.dev.embedded import embedded_postgres

DEMO_PLAYS = [play for play, _ in demo.DEMO_RUNS]
# Generous for a loaded CI machine; a demo takes about 3 s (the nap play sleeps 2 s).
DEMO_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
STORE = lanes.PROD_DEFAULT_SCHEMA


def dev_env(**values: str) -> dict[str, str]:
    """Return this environment without lane-worker / database variables, plus ``values``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("LANE_WORKER_", "DEEPLINE_"))
        and name not in (DATABASE_URL_ENV, TEST_DATABASE_URL_ENV)
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(values)
    return env


@dataclass
class Dev:
    """One ``lane-worker dev`` process and the file its stdout and stderr go to."""

    name: str
    proc: subprocess.Popen[bytes]
    output_file: Path
    started_at: float

    @property
    def output(self) -> str:
        """Return everything the process printed so far."""
        return self.output_file.read_text(errors="replace")

    def lines(self, prefix: str = "") -> list[str]:
        """Return the printed lines that start with ``prefix``."""
        return [line for line in self.output.splitlines() if line.startswith(prefix)]

    def tail(self, lines: int = 40) -> str:
        """Return the last printed lines, for failure messages."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited {code}"
        text = "\n".join(self.output.splitlines()[-lines:])
        return f"--- lane-worker dev {self.name} (pid {self.proc.pid}, {state}) ---\n{text}"

    async def wait_for(self, text: str, timeout_s: float = DEMO_TIMEOUT_S) -> None:
        """Wait until ``text`` is in the output; fail with the tail on timeout or exit."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc.poll() is not None and text not in self.output:
                raise AssertionError(f"{self.name} exited without printing {text!r}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {text!r} in {timeout_s} s\n{self.tail()}")
            await asyncio.sleep(0.05)

    async def wait_exit(self, timeout_s: float = DEMO_TIMEOUT_S) -> int:
        """Wait for the process to exit; return its exit code (fail with the tail on timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} still running after {timeout_s} s\n{self.tail()}"
                )
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def ctrl_c(self) -> None:
        """Send SIGINT to the process group, as Ctrl-C in a terminal does."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)

    def kill(self) -> None:
        """SIGKILL the process group if it still runs, and reap the process."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


class DevRunner:
    """Starts ``lane-worker dev`` processes; kills what still runs at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Dev] = []

    def start(self, name: str, *args: str, env: dict[str, str]) -> Dev:
        """Start ``lane-worker dev ARGS`` in ``tmp_path`` with exactly ``env``."""
        output_file = self.tmp_path / f"dev-{name}-{len(self.started) + 1}.log"
        with output_file.open("wb") as out:
            proc = subprocess.Popen(
                cli_argv("dev", *args, script=LANE_WORKER_SCRIPT.exists()),
                cwd=self.tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        dev = Dev(name, proc, output_file, time.monotonic())
        self.started.append(dev)
        return dev

    def close(self) -> None:
        """Kill and reap every process that still runs."""
        for dev in self.started:
            with contextlib.suppress(Exception):
                dev.kill()


@pytest.fixture
def devs(tmp_path: Path) -> Iterator[DevRunner]:
    """A DevRunner whose processes never outlive the test (request it after database_url)."""
    runner = DevRunner(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


def assert_demo_completed(dev: Dev, queue: str) -> None:
    """Check the output: every demo play completed on ``queue`` and the lanes table printed."""
    out = dev.output
    assert f"dev: submitted {len(DEMO_PLAYS)} demo runs to {queue}" in out, dev.tail()
    for play in DEMO_PLAYS:
        completed = [line for line in dev.lines(f"dev: {play} ") if "  completed -> " in line]
        assert len(completed) == 1, f"{play}: {completed}\n{dev.tail()}"
        # The whole run id, which status, signal and cancel take (never a prefix).
        uuid.UUID(completed[0].split()[2])
    assert "dev: every demo run completed" in out, dev.tail()
    headers = [line for line in out.splitlines() if line.split()[:2] == ["RELEASE", "QUEUE"]]
    assert len(headers) == 1, dev.tail()
    lines = out.splitlines()
    row = lines[lines.index(headers[0]) + 1 :]
    assert any(line.split()[1:2] == [queue] for line in row[:10]), f"no {queue} row\n{dev.tail()}"


def processes_mentioning(path: Path) -> list[str]:
    """Return ``pid: cmdline`` of every other process whose command line names ``path``."""
    needle = str(path.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # the process is gone, or not ours to read
            continue
        cmdline = " ".join(a.decode(errors="replace") for a in argv if a)
        if needle in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def stop_leftover_postgres(data_dir: Path) -> None:
    """Stop a PostgreSQL a failed test left running in ``data_dir`` (fast shutdown)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # raises once it is gone
            time.sleep(0.1)


@pytest.fixture
def pg_data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data dir for ``dev --data-dir``; no server left in it and removed after the test.

    As root, embedded_postgres chowns it to the user ``embedded_postgres`` (root may still
    delete it); it is removed here so a 40 MB cluster per run does not pile up in pytest's
    kept temp dirs.
    """
    data_dir = (tmp_path / "pg").resolve()
    try:
        yield data_dir
    finally:
        stop_leftover_postgres(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_dev_exit_after_demo_completes_every_demo_run(
    database_url: str, devs: DevRunner
) -> None:
    """`dev --exit-after-demo` on a given database completes each demo play and exits 0."""
    dev = devs.start("demo", "--exit-after-demo", env=dev_env(**{DATABASE_URL_ENV: database_url}))
    assert await dev.wait_exit() == 0, dev.tail()
    assert_demo_completed(dev, "runs")
    # A configured database is used as is: no embedded PostgreSQL, and its URL is not echoed.
    assert "embedded PostgreSQL" not in dev.output
    assert not (devs.tmp_path / ".pg").exists()
    assert "dev: lanes page at http://127.0.0.1:" in dev.output
    assert "from another terminal: (with your WORKFLOW_RUNTIME_POSTGRES) lane-worker" in dev.output
    assert database_url not in dev.output


@pytest.mark.db  # no database_url, but it runs PostgreSQL all the same
async def test_dev_embedded_postgres_stops_on_exit_and_is_reused(
    devs: DevRunner, pg_data_dir: Path
) -> None:
    """Embedded dev exits 0 leaving no server behind; a second run reuses the same cluster."""
    env = dev_env()
    first = devs.start("embedded-1", "--exit-after-demo", "--data-dir", str(pg_data_dir), env=env)
    assert await first.wait_exit() == 0, first.tail()
    first_s = time.monotonic() - first.started_at
    assert_demo_completed(first, "runs")
    assert f"dev: starting embedded PostgreSQL in {pg_data_dir}" in first.output
    assert "dev: PostgreSQL stopped" in first.output
    # Where a second terminal reaches the embedded server (no password: a unix socket).
    (told,) = [line for line in first.output.splitlines() if "from another terminal" in line]
    assert "WORKFLOW_RUNTIME_POSTGRES='postgresql://" in told, told
    assert processes_mentioning(pg_data_dir) == []
    assert not (pg_data_dir / "postmaster.pid").exists(), "PostgreSQL did not shut down cleanly"

    version = pg_data_dir / "PG_VERSION"
    assert version.exists(), "the first run did not initialise the data dir"
    before = version.stat()
    second = devs.start("embedded-2", "--exit-after-demo", "--data-dir", str(pg_data_dir), env=env)
    assert await second.wait_exit() == 0, second.tail()
    second_s = time.monotonic() - second.started_at
    assert_demo_completed(second, "runs")
    assert processes_mentioning(pg_data_dir) == []
    after = version.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), (
        "the second run initialised the data dir again"
    )

    # The cluster kept the first run's data: both demos' runs are in its store.
    with embedded_postgres(pg_data_dir) as url:
        conn = await asyncpg.connect(url)
        try:
            statuses = await conn.fetch(
                f"select status, count(*) as n from {STORE}.runs group by status"
            )
        finally:
            await conn.close()
    assert {r["status"]: r["n"] for r in statuses} == {"completed": 2 * len(DEMO_PLAYS)}
    assert processes_mentioning(pg_data_dir) == []
    print(f"embedded dev: first run {first_s:.1f} s (initdb), second run {second_s:.1f} s")


async def test_a_dev_sharing_embedded_postgres_says_it_left_it_running(
    devs: DevRunner, pg_data_dir: Path
) -> None:
    """A second user of the embedded server (here this test) keeps it up: dev says so on exit,
    never that it stopped it (issue 31)."""
    with embedded_postgres(pg_data_dir) as url:
        dev = devs.start(
            "sharing", "--exit-after-demo", "--data-dir", str(pg_data_dir), env=dev_env()
        )
        assert await dev.wait_exit() == 0, dev.tail()
        assert f"dev: PostgreSQL is up, shared with process {os.getpid()}" in dev.output
        assert f"dev: PostgreSQL left running for process {os.getpid()}" in dev.output
        assert "dev: PostgreSQL stopped" not in dev.output, dev.tail()
        conn = await asyncpg.connect(url)  # it did keep running
        await conn.close()
    assert processes_mentioning(pg_data_dir) == []


async def test_two_worktrees_share_a_database_on_separate_lanes(
    database_url: str, devs: DevRunner
) -> None:
    """Two worktrees' dev workers on one database each run their own demo on their own lane."""
    worktrees = {"wt_one": "runs_wt_one", "wt_two": "runs_wt_two"}
    started = {
        suffix: devs.start(
            suffix,
            "--exit-after-demo",
            # A blank port (an env file's `NAME=`) is unset: each dev picks a free port.
            env=dev_env(
                **{
                    DATABASE_URL_ENV: database_url,
                    lanes.QUEUE_SUFFIX_ENV: suffix,
                    "LANE_WORKER_HEALTH_PORT": "",
                }
            ),
        )
        for suffix in worktrees
    }
    for dev in started.values():
        assert await dev.wait_exit() == 0, dev.tail()
    for suffix, dev in started.items():
        assert_demo_completed(dev, worktrees[suffix])

    conn = await asyncpg.connect(database_url)
    try:
        runs = await conn.fetch(f"select run_id, play, queue, release_id, status from {STORE}.runs")
        attempts = await conn.fetch(
            f"select a.run_id, r.queue, a.release_id, a.worker_id"
            f" from {STORE}.attempts a join {STORE}.runs r using (run_id)"
        )
    finally:
        await conn.close()

    for suffix, queue in worktrees.items():
        release = f"dev-{suffix}"
        assert lanes.queue_name_for_release(release) == queue
        mine = [r for r in runs if r["queue"] == queue]
        assert sorted(r["play"] for r in mine) == sorted(DEMO_PLAYS), mine
        assert {(r["release_id"], r["status"]) for r in mine} == {(release, "completed")}
        on_queue = [a for a in attempts if a["queue"] == queue]
        assert {a["run_id"] for a in on_queue} == {r["run_id"] for r in mine}, "a run never ran"
        # Every attempt on this lane was made by this worktree's worker, none by the other's.
        assert {a["release_id"] for a in on_queue} == {release}, on_queue
        assert all(a["worker_id"].startswith(f"{release}@") for a in on_queue), on_queue
        worker_pid = started[suffix].proc.pid
        assert {a["worker_id"].split(":")[1] for a in on_queue} == {str(worker_pid)}
    assert {r["queue"] for r in runs} == set(worktrees.values()), "a run on another queue"


async def test_dev_ctrl_c_drains_and_exits_zero(database_url: str, devs: DevRunner) -> None:
    """Ctrl-C (SIGINT to the process group) after the demo drains the worker and exits 0."""
    dev = devs.start("ctrl-c", env=dev_env(**{DATABASE_URL_ENV: database_url}))
    await dev.wait_for("dev: every demo run completed")
    assert_demo_completed(dev, "runs")
    await asyncio.sleep(0.5)
    assert dev.proc.poll() is None, f"dev exited without --exit-after-demo\n{dev.tail()}"

    dev.ctrl_c()
    sent = time.monotonic()
    assert await dev.wait_exit(STOP_TIMEOUT_S) == 0, dev.tail()
    stopped_s = time.monotonic() - sent
    signalled = [line for line in dev.lines() if "worker.signal" in line]
    assert signalled, dev.tail()
    assert "signal=SIGINT" in signalled[0], dev.tail()
    assert [line for line in dev.lines() if "worker.stopped" in line], dev.tail()
    # No exception escaped (its traceback starts a line); the demo's flaky play logs
    # its attempt's traceback inside run.attempt_failed's error, on purpose.
    assert not [line for line in dev.lines() if line.startswith("Traceback")], dev.tail()

    conn = await asyncpg.connect(database_url)
    try:
        workers = await conn.fetch(f"select worker_id, stopped_at from {STORE}.workers")
    finally:
        await conn.close()
    assert len(workers) == 1, workers
    assert workers[0]["stopped_at"] is not None, "the worker did not record its stop"
    print(f"dev Ctrl-C: exited {stopped_s:.2f} s after SIGINT")


async def test_dev_roll_shows_a_rolling_deploy_end_to_end(
    database_url: str, devs: DevRunner
) -> None:
    """`dev --roll`: A's parked runs adopted by B, A drained and its machine removed; exit 0."""
    dev = devs.start("roll", "--roll", env=dev_env(**{DATABASE_URL_ENV: database_url}))
    assert await dev.wait_exit(timeout_s=180) == 0, dev.tail()
    said = [line for line in dev.output.splitlines() if line.startswith("roll: ")]
    assert any("is retired (draining: parked runs go to" in line for line in said), said
    adopted = [line for line in said if ": completed (adopted by roll-b-" in line]
    assert len(adopted) == 3, said  # two naps and the approval
    assert said[-1].startswith("roll: roll-a-"), said
    assert "is drained: its machine was stopped and removed. Rolled out to roll-b-" in said[-1]
    assert not list(devs.tmp_path.glob(".pg/roll-machines-*"))
    assert not (devs.tmp_path / ".pg" / "dev-roll").exists(), "the roll's database was left"
    # The database the environment names is never the roll's: it would deploy and
    # retire releases in a database that may be a team's.
    assert any(f"{DATABASE_URL_ENV} is not used" in line for line in said), said
    conn = await asyncpg.connect(database_url)
    try:
        registry = await conn.fetchval(f"select to_regclass('{STORE}.deployments')::text")
        deployed = 0 if registry is None else await conn.fetchval(
            f"select count(*) from {STORE}.deployments")  # fmt: skip
    finally:
        await conn.close()
    assert deployed == 0, "the roll deployed releases into the environment's database"


async def test_dev_roll_stops_on_the_first_ctrl_c(devs: DevRunner) -> None:
    """Ctrl-C mid-roll ends it at once (exit 1), its machines and its database removed."""
    dev = devs.start("roll-ctrl-c", "--roll", env=dev_env())
    await dev.wait_for("is ready; submitting work to its lane")
    dev.ctrl_c()
    assert await dev.wait_exit(STOP_TIMEOUT_S) == 1, dev.tail()
    assert "roll: interrupted" in dev.output, dev.tail()
    assert not list(devs.tmp_path.glob(".pg/roll-machines-*"))
    assert not (devs.tmp_path / ".pg").exists()  # its database, machines, all removed
