"""Viewing the lanes page never starves a run's lease, nor readiness, however many look.

A real daemon serves a lane while the database holds a realistic backlog: queued
runs on a lane no live worker claims, 40,000 or more, until one drain report read
takes 0.25 s. Forty clients refresh `/` and `/lanes` as fast as they are answered,
and more ask `/readyz`, while a run's step outlasts two and a half leases.
The run must finish on its first attempt with its step run once, and every
`/readyz` answer must be 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from support.daemon import Daemons, queue_of
from support.runtime import SCHEMA, connect, eventually, open_client
from worker.db.store import Store
from worker.ops.report import read_report

BUSY = "busy"  # the release whose daemon runs the step (and serves the page)
IDLE = "idle"  # a lane with a backlog and no worker
BACKLOG = 40_000  # doubled until one report read takes REPORT_READ_S (at most 3 times)
REPORT_READ_S = 0.25  # as measured in production with 40,000 queued runs
LEASE_S = 5  # LANE_WORKER_CLAIM_TIMEOUT's minimum: extended every 1.7 s
STEP_S = 15  # two and a half leases
PAGE_CLIENTS = 40
READY_CLIENTS = 10


def backlog_sql(queue: str, count: int) -> str:
    """Return SQL that copies the one run on ``queue`` ``count`` times, as submit writes it.

    Each copy gets its own run id, engine task and first engine run, like a submit's
    spawn; only the ids differ from the seed.
    """
    t, r = f"absurd.t_{queue}", f"absurd.r_{queue}"
    return f"""
        with seed as (select * from {SCHEMA}.runs where queue = '{queue}' limit 1),
        ids as materialized (
          select gen_random_uuid() as run_id, gen_random_uuid() as task_id,
                 gen_random_uuid() as engine_run_id
            from generate_series(1, {count})),
        tasks as (
          insert into {t} (task_id, task_name, params, headers, retry_strategy, max_attempts,
                           cancellation, enqueue_at, state, attempts, last_attempt_run)
          select i.task_id, t.task_name, jsonb_build_object('runId', i.run_id::text), t.headers,
                 t.retry_strategy, t.max_attempts, t.cancellation, t.enqueue_at, t.state,
                 t.attempts, i.engine_run_id
            from ids i, {t} t where t.task_id = (select task_id from seed)),
        engine_runs as (
          insert into {r} (run_id, task_id, attempt, state, available_at)
          select i.engine_run_id, i.task_id, r.attempt, r.state, r.available_at
            from ids i, {r} r where r.task_id = (select task_id from seed))
        insert into {SCHEMA}.runs (run_id, play, input, launch, release_id, queue, task_id,
                                   max_attempts, step_keys)
        select i.run_id, s.play, s.input,
               jsonb_set(s.launch, '{{runId}}', to_jsonb(i.run_id::text)), s.release_id,
               s.queue, i.task_id, s.max_attempts, s.step_keys
          from ids i, seed s"""


async def report_read_s(conn: asyncpg.Connection[asyncpg.Record]) -> float:
    """Return how long one drain report read takes now (the median of three)."""
    took = []
    for _ in range(3):
        started = time.monotonic()
        await read_report(conn, Store(SCHEMA))
        took.append(time.monotonic() - started)
    return statistics.median(took)


async def hammer(
    port: int, paths: tuple[str, ...], stop: asyncio.Event, seen: Counter[str]
) -> None:
    """GET ``paths`` in turn, each as soon as the last was answered, until ``stop``."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            for path in paths:
                try:
                    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                        await response.read()
                        seen[f"{path} {response.status}"] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    seen[f"{path} {type(exc).__name__}"] += 1


async def probe_readiness(
    port: int, stop: asyncio.Event, answers: list[tuple[float, int | str, object]]
) -> None:
    """Ask `/readyz` every 0.1 s on a fresh connection; record (time, status, database)."""
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    body = await response.json()
                    answers.append((started, response.status, body.get("database")))
            except (aiohttp.ClientError, TimeoutError) as exc:
                answers.append((started, type(exc).__name__, None))
            await asyncio.sleep(0.1)


async def report_connections(conn: asyncpg.Connection[asyncpg.Record]) -> Counter[str]:
    """Return the daemon's open connections to this database, by application name."""
    rows = await conn.fetch(
        "select application_name from pg_stat_activity"
        " where datname = current_database() and application_name like 'lane-worker%'"
    )
    return Counter(str(row["application_name"]) for row in rows)


async def test_many_page_viewers_never_cost_a_lease_nor_readiness(
    database_url: str, tmp_path: Path
) -> None:
    """40 clients on `/` and `/lanes`, 10 on `/readyz`: one attempt, one step, readiness 200."""
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}) as idle,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": BUSY}) as client,
    ):
        await idle.submit("plain", {"n": 0})
        conn = await connect(database_url)
        try:
            backlog, wanted, read_s = 1, BACKLOG, 0.0
            for _ in range(4):  # a faster machine gets a larger backlog
                await conn.execute(backlog_sql(queue_of(IDLE), wanted - backlog))
                backlog = wanted
                await conn.execute("analyze")
                read_s = await report_read_s(conn)
                print(f"one drain report read with {backlog} queued runs: {read_s:.3f} s")
                if read_s >= REPORT_READ_S:
                    break
                wanted *= 2
            assert read_s >= REPORT_READ_S, f"the backlog does not load the report ({read_s:.3f} s)"

            daemon = pool.start(BUSY, LANE_WORKER_CLAIM_TIMEOUT=str(LEASE_S))
            await daemon.ready()
            port = daemon.health_port
            run = await client.submit("slow", {"dir": str(tmp_path), "seconds": STEP_S})
            two = tmp_path / "two.log"

            async def step_started() -> bool:
                return two.exists() and bool(two.read_text())

            await eventually(step_started, what="step two to start")

            stop = asyncio.Event()
            seen: Counter[str] = Counter()
            answers: list[tuple[float, int | str, object]] = []
            tasks = [
                *(
                    asyncio.create_task(hammer(port, ("/", "/lanes"), stop, seen))
                    for _ in range(PAGE_CLIENTS)
                ),
                *(
                    asyncio.create_task(hammer(port, ("/readyz",), stop, seen))
                    for _ in range(READY_CLIENTS)
                ),
                asyncio.create_task(probe_readiness(port, stop, answers)),
            ]
            connections: list[Counter[str]] = []
            try:
                # Ends when the run does; the limit only stops a stuck one (generous: a
                # busy machine runs the step late, not wrong).
                deadline = time.monotonic() + STEP_S + 60
                while time.monotonic() < deadline:
                    status = await client.status(run.run_id)
                    if status.finished:
                        break
                    connections.append(await report_connections(conn))
                    await asyncio.sleep(0.5)
            finally:
                stop.set()
                for task in tasks:
                    with contextlib.suppress(Exception):
                        await task

            lanes = await lanes_json(port)
        finally:
            await conn.close()

        print(f"answers while the step ran: {dict(sorted(seen.items()))}")
        status = await client.status(run.run_id)
        attempts = [(a.disposition, a.outcome) for a in status.attempts]
        executions = len(two.read_text().splitlines())
        not_ready = [(round(t - answers[0][0], 1), s, d) for t, s, d in answers if s != 200]
        problems = []
        if status.status != "completed" or attempts != [("own", "completed")]:
            problems.append(f"the run ended {status.status} after attempts {attempts}")
        if executions != 1:
            problems.append(f"the step body ran {executions} times")
        if not_ready:
            problems.append(f"/readyz (seconds in, status, database): {not_ready[:10]}")
        if any(k.startswith("/readyz") and k != "/readyz 200" for k in seen):
            problems.append(f"/readyz answers of the hammering clients: {seen}")
        if daemon.events("lease.extend_failed"):
            problems.append("a lease extension failed")
        report_pool = max(c[f"lane-worker-report {BUSY}"] for c in connections)
        hot_pool = max(c[f"lane-worker {BUSY}"] for c in connections)
        if report_pool != 1 or hot_pool > 2:
            problems.append(f"connections: report {report_pool} (1 wanted), daemon {hot_pool}")
        assert not problems, "\n".join(problems)

        assert seen["/ 200"] >= PAGE_CLIENTS, seen
        assert seen["/lanes 200"] >= PAGE_CLIENTS, seen
        assert len(answers) >= STEP_S, f"too few /readyz answers: {len(answers)}"
        assert lanes[queue_of(IDLE)]["counts"]["fresh"] == backlog


async def lanes_json(port: int) -> dict[str, dict[str, Any]]:
    """Return `/lanes` by queue."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{port}/lanes") as response,
    ):
        assert response.status == 200, await response.text()
        body = await response.json()
    return {lane["queue"]: lane for lane in body["lanes"]}
