"""Drain: SIGTERM with 20 runs mid-step; each finishes or is handed back, no attempt spent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support.apps.faults import executions
from support.daemon import Daemons, queue_of
from support.runtime import connect, eventually, open_client
from worker.config.stopping import longest_stop_s

RELEASE = "drain-rel"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = queue_of(RELEASE)
APP = "support.apps.faults:app"
DRAIN_S = 3
RUNS = 20
SHORT_S = 0.5  # after the gate opens (at SIGTERM): ends inside the drain window
LONG_S = 3600  # cannot: handed back (a stop that waited for it would take an hour)
# The stop is judged against its documented bound (longest_stop_s) plus this much for a
# busy machine: the defects (waiting for a step that takes an hour) are far beyond.
BUSY_SLACK_S = 30


async def engine_view(conn: asyncpg.Connection[Any], run_ids: list[str]) -> dict[str, Any]:
    """Return, per run id, the store row, the engine task and its latest engine run."""
    rows = await conn.fetch(
        f"""
        select r.run_id::text, r.status, t.state as task_state, t.attempts as task_attempts,
               e.state as run_state, e.attempt as run_attempt
          from runtime_scheduler.runs r
          join absurd."t_{QUEUE}" t on t.task_id = r.task_id
          join absurd."r_{QUEUE}" e on e.run_id = t.last_attempt_run
         where r.run_id = any($1::uuid[])
        """,
        run_ids,
    )
    return {row["run_id"]: dict(row) for row in rows}


@pytest.mark.timeout(180)
async def test_sigterm_with_20_runs_in_flight_finishes_or_hands_back_each_on_attempt_1(
    database_url: str, tmp_path: Path
) -> None:
    """SIGTERM mid-step: short runs complete, long ones are handed back on attempt 1, exit 0."""
    directory = str(tmp_path)
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        first = pool.start(
            RELEASE,
            name="draining",
            app=APP,
            LANE_WORKER_CONCURRENCY="24",
            LANE_WORKER_DRAIN_SECONDS=str(DRAIN_S),
        )
        await first.ready()
        short: list[str] = []
        long: list[str] = []
        keys: dict[str, str] = {}
        # The short runs' step holds until the gate opens, so all 20 are surely mid-step
        # when SIGTERM lands, however slowly the machine started them.
        gate = tmp_path / "gate"
        for i in range(RUNS):
            params: dict[str, Any] = {"dir": directory, "key": f"r{i}", "rerun_seconds": 0.2}
            if i % 2 == 0:
                params.update(seconds=SHORT_S, gate=str(gate))
            else:
                params.update(seconds=LONG_S)
            run = await client.submit("stepper", params)
            (short if i % 2 == 0 else long).append(run.run_id)
            keys[run.run_id] = f"r{i}"

        async def all_mid_step() -> bool:
            """Tell whether every run's long step has started (once)."""
            return all(executions(directory, key, "long") == 1 for key in keys.values())

        await eventually(all_mid_step, timeout_s=60, what="all 20 long steps to start")
        assert not first.events("run.completed"), "a run finished before SIGTERM"
        signalled = time.monotonic()
        first.terminate()
        gate.touch()
        code = await first.wait_exit(timeout_s=longest_stop_s(DRAIN_S) + BUSY_SLACK_S + 10)
        took = time.monotonic() - signalled
        print(f"SIGTERM with {RUNS} in flight, drain {DRAIN_S} s: exit {code} after {took:.1f} s")
        assert code == 0, first.tail()
        assert took <= longest_stop_s(DRAIN_S) + BUSY_SLACK_S, f"stop took {took:.1f} s"
        (stopping,) = first.events("worker.stopping")
        assert stopping["in_flight"] >= RUNS, f"{stopping['in_flight']} runs in flight at SIGTERM"
        assert first.events("worker.stopped")

        conn = await connect(database_url)
        try:
            view = await engine_view(conn, short + long)
        finally:
            await conn.close()
        problems = []
        for run_id in short:
            status = await client.status(run_id)
            attempts = [(a.attempt, a.outcome) for a in status.attempts]
            if status.status != "completed" or attempts != [(1, "completed")]:
                problems.append(f"short {run_id}: {status.status} {attempts}")
            if status.facts != ("run.completed",):
                problems.append(f"short {run_id}: facts {status.facts}")
        for run_id in long:
            status = await client.status(run_id)
            attempts = [(a.attempt, a.disposition, a.outcome) for a in status.attempts]
            row = view[run_id]
            if (
                status.status != "queued"
                or attempts != [(1, "own", "handed_back")]
                or row["run_state"] not in ("sleeping", "pending")
                or (row["run_attempt"], row["task_attempts"]) != (1, 1)
                or status.facts
            ):
                problems.append(f"long {run_id}: {status.status} {attempts} {row} {status.facts}")
            if not first.events("run.handed_back", run_id=run_id):
                problems.append(f"long {run_id}: no run.handed_back logged")
        assert not problems, "after the drain:\n" + "\n".join(problems)

        second = pool.start(RELEASE, name="resuming", app=APP, LANE_WORKER_CONCURRENCY="24")
        await second.ready()

        async def all_completed() -> bool:
            """Tell whether every handed-back run has completed."""
            statuses = [await client.status(run_id) for run_id in long]
            return all(s.status == "completed" for s in statuses)

        await eventually(all_completed, timeout_s=60, what="the handed-back runs to complete")
        conn = await connect(database_url)
        try:
            view = await engine_view(conn, short + long)
        finally:
            await conn.close()
        problems = []
        for run_id in short + long:
            key = keys[run_id]
            status = await client.status(run_id)
            interrupted = 1 if run_id in long else 0
            counts = {step: executions(directory, key, step) for step in ("a", "long", "b")}
            expected = {"a": 1, "long": interrupted + 1, "b": 1}
            engine_attempts = [a.attempt for a in status.attempts]
            row = view[run_id]
            if (
                counts != expected
                or status.status != "completed"
                or set(engine_attempts) != {1}
                or (row["run_attempt"], row["task_attempts"], row["task_state"])
                != (1, 1, "completed")
                or status.facts != ("run.completed",)
            ):
                problems.append(
                    f"{key} {run_id}: executions {counts} (expected {expected}), "
                    f"{status.status}, attempts {engine_attempts}, engine {row}, "
                    f"facts {status.facts}"
                )
        assert not problems, "after the resume:\n" + "\n".join(problems)
        for run_id in long:
            status = await client.status(run_id)
            assert [(a.worker_id, a.outcome) for a in status.attempts] == [
                (first.worker_id, "handed_back"),
                (second.worker_id, "completed"),
            ]
        second.terminate()
        assert await second.wait_exit(timeout_s=longest_stop_s(DRAIN_S) + BUSY_SLACK_S) == 0
        assert first.malformed_lines() == []
        assert second.malformed_lines() == []


@pytest.mark.timeout(180)
async def test_a_blocking_sync_step_does_not_hold_the_process_past_its_stop_bound(
    database_url: str, tmp_path: Path
) -> None:
    """A sync step blocking for an hour at SIGTERM: handed back, the process exits in bound."""
    directory = str(tmp_path)
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        first = pool.start(RELEASE, name="blocked", app=APP, LANE_WORKER_DRAIN_SECONDS="1")
        await first.ready()
        run = await client.submit("blocking", {"dir": directory, "key": "k", "seconds": 3600})
        await first.wait_for("run.started", run_id=run.run_id)
        await eventually(
            lambda: _async_true(executions(directory, "k", "block") == 1),
            what="the sync step to start",
        )
        signalled = time.monotonic()
        first.terminate()
        code = await first.wait_exit(timeout_s=longest_stop_s(1) + BUSY_SLACK_S + 10)
        took = time.monotonic() - signalled
        assert code == 0, first.tail()
        assert took <= longest_stop_s(1) + BUSY_SLACK_S, (
            f"stop took {took:.1f} s (the step's thread held it)"
        )
        assert first.events("run.handed_back", run_id=run.run_id)

        second = pool.start(RELEASE, name="after", app=APP)
        await second.wait_for("run.completed", run_id=run.run_id)
        status = await client.status(run.run_id)
        assert status.output == 2  # the second execution committed (the first never did)
        assert [(a.attempt, a.outcome) for a in status.attempts] == [
            (1, "handed_back"),
            (1, "completed"),
        ]
        second.terminate()
        assert await second.wait_exit(timeout_s=60) == 0


async def _async_true(value: bool) -> bool:
    """Return ``value`` (for eventually(), which awaits its check)."""
    return value


def ignored_signals(pid: int) -> set[int]:
    """The signals process ``pid`` ignores (``SigIgn`` in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigIgn:")), 16)
    return {n for n in range(1, 65) if mask & 1 << (n - 1)}


@pytest.mark.parametrize(("again", "code"), [(signal.SIGHUP, 0), (signal.SIGTERM, 1)])
@pytest.mark.timeout(180)
async def test_the_stops_last_part_keeps_the_signal_rules(
    database_url: str, again: signal.Signals, code: int
) -> None:
    """SIGHUP drains a daemon as a first SIGTERM does. In the stop's last part (the signal
    receiver closed; leftover hand-backs and the stop mark) the rules still hold: another
    SIGHUP is ignored, a second stop exits at once with 1, not a death by the signal's
    default action (129, 143) before the hand-backs.

    That last part waits here for the worker's row, which another session holds locked.
    """
    env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-hup"}
    async with Daemons(database_url) as pool, open_client(database_url, env):
        d = pool.start("rel-hup", LANE_WORKER_DRAIN_SECONDS="0")
        await d.ready()
        worker_id = d.events("worker.ready")[0]["worker_id"]
        locker = await connect(database_url)
        try:

            async def registered() -> bool:
                found = await locker.fetchval(
                    "select count(*) from runtime_scheduler.workers where worker_id = $1",
                    worker_id,
                )
                return bool(found)

            await eventually(registered, timeout_s=60, what="the worker's row")
            async with locker.transaction():
                await locker.execute(
                    "select 1 from runtime_scheduler.workers where worker_id = $1"
                    " for no key update",
                    worker_id,
                )
                os.kill(d.pid, signal.SIGHUP)

                async def past_the_receiver() -> bool:
                    # The signal receiver is gone (the stop's last part runs) once
                    # SIGHUP is ignored rather than caught.
                    return signal.SIGHUP in ignored_signals(d.pid)

                await eventually(past_the_receiver, timeout_s=60, what="the stop's last part")
                os.kill(d.pid, again)
                if code:
                    assert await d.wait_exit(30) == code
        finally:
            await locker.close()
        assert await d.wait_exit(30) == code
        assert bool(d.events("worker.stopped")) == (code == 0)
        assert bool(d.events("worker.exit_now")) == (code == 1)
