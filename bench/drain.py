"""Backlog drain throughput of a trivial play, side by side on one Postgres.

Each case gets its own queue in one scratch database, a backlog of N runs
written before its worker starts, then an ANALYZE; the clock runs from the
worker's ready line to the last engine completion. Cases, per backlog size:

- ``raw``: the floor/ceiling reference, in this process: 2 asyncpg connections,
  each looping claim_task (qty 16), then set_task_checkpoint_state and
  complete_run per task. No store, no framework.
- ``absurd-sdk`` / ``absurd-sdk-async``: the official Python SDK's worker
  (threaded / asyncio) at concurrency 16, run from a throwaway venv.
- ``lane-worker``: the real daemon (`python -m worker run`), concurrency 16,
  JSON logs to a file; the backlog submitted with LaneClient.submit.
- ``lane-worker-nolog``: the same with its two per-run info lines dropped.
- ``lane-worker-asyncio``: the same on asyncio's own event loop instead of uvloop.
- ``lane-worker-2p``: ``LANE_WORKER_PROCESSES=2``, each process with half the
  concurrency (8), so 16 runs in flight in all, as in the other cases.

Usage: .venv/bin/python bench/drain.py [--sizes 3000,30000] [--only raw,lane-worker]
Exits 1 when a drain did not finish within --timeout (the table is printed first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import statements
from common import (
    TRIVIAL_PLAY,
    Session,
    add_common_args,
    connect,
    parse_args,
    print_table,
    run_main,
    session,
    transactions,
)
from procs import (
    SDK_WORKER,
    BenchError,
    Child,
    PgCpuMeter,
    daemon_argv,
    daemon_env,
    timestamp_s,
)

from worker.client import LaneClient
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.lanes import PROD_DEFAULT_SCHEMA, RELEASE_ID_ENV, queue_name_for_release

CASES = (
    "raw",
    "absurd-sdk",
    "absurd-sdk-async",
    "lane-worker",
    "lane-worker-nolog",
    "lane-worker-2p",
    "lane-worker-asyncio",
)
STORE = "runtime_scheduler"
SUBMITTERS = 8
POLL_S = 0.1


@dataclass
class Result:
    """One case's figures."""

    case: str
    backlog: int
    seconds: float
    worker_cpu_s: float
    pg_cpu_s: float
    xacts_per_run: float
    log_bytes_per_run: float | None = None
    done: int = -1  # runs completed; less than the backlog when the drain timed out

    @property
    def runs(self) -> int:
        return self.backlog if self.done < 0 else self.done

    @property
    def rate(self) -> float:
        return self.runs / self.seconds

    @property
    def timed_out(self) -> bool:
        return 0 <= self.done < self.backlog


async def spawn_backlog(url: str, queue: str, n: int) -> None:
    """Create ``queue`` and spawn ``n`` trivial tasks with absurd.spawn_task (one statement)."""
    conn = await connect(url)
    try:
        await conn.execute("select absurd.create_queue($1)", queue)
        await conn.execute(
            "select count(*) from (select absurd.spawn_task($1, $2, jsonb_build_object('i', g),"
            " '{\"max_attempts\": 5}'::jsonb) from generate_series(1, $3) g) s",
            queue, TRIVIAL_PLAY, n,
        )  # fmt: skip
    finally:
        await conn.close()


async def submit_backlog(url: str, release_id: str, n: int) -> None:
    """Submit ``n`` runs with LaneClient.submit from a few concurrent tasks (store + engine)."""
    db = await Database.open(PoolOptions(url=url, max_size=SUBMITTERS, application_name="bench"))
    client = LaneClient(db, Store(PROD_DEFAULT_SCHEMA), env={RELEASE_ID_ENV: release_id})
    numbers = iter(range(n))

    async def feed() -> None:
        for i in numbers:
            await client.submit(TRIVIAL_PLAY, {"i": i})

    started = time.monotonic()
    try:
        await asyncio.gather(*(feed() for _ in range(SUBMITTERS)))
    finally:
        await client.close()
    took = time.monotonic() - started
    print(f"  submitted {n} runs with LaneClient.submit in {took:.1f} s ({n / took:.0f}/s)")


async def settle_stats(bench: Session) -> int:
    """ANALYZE (as autovacuum would soon), let stats flush, return the transaction count."""
    conn = await connect(bench.url)
    try:
        await conn.execute("analyze")
        if bench.args.statements:
            await statements.reset(conn)  # before the sleep: its transaction is flushed too
    finally:
        await conn.close()
    await asyncio.sleep(1.2)  # backends flush their counters at most once a second
    return await transactions(bench.admin, bench.database)


async def wait_drained(bench: Session, open_sql: str, child: Child) -> tuple[int, int]:
    """Poll ``open_sql`` until nothing is open or --timeout passes; return (polls, still open)."""
    conn = await asyncpg.connect(bench.url)
    deadline = time.monotonic() + bench.args.timeout
    polls = 0
    try:
        while True:
            polls += 1
            left: int = await conn.fetchval(open_sql)
            if left == 0:
                return polls, 0
            child.check_alive()
            if time.monotonic() > deadline:
                print(f"  TIMEOUT: {left} runs still open after {bench.args.timeout:g} s")
                return polls, left
            await asyncio.sleep(POLL_S)
    finally:
        await conn.close()


async def finish(bench: Session, done_sql: str) -> tuple[int, float]:
    """Return how many runs completed and the Unix time of the last completion."""
    conn = await asyncpg.connect(bench.url)
    try:
        completed, last = await conn.fetchrow(done_sql)
    finally:
        await conn.close()
    return completed, last.timestamp() if last is not None else time.time()


async def raw_loop(conn: asyncpg.Connection[Any], queue: str, worker_id: str) -> None:
    """Claim 16 at a time; per task: one checkpoint, then complete. Stop when the queue is empty."""
    while True:
        tasks = await conn.fetch(
            "select run_id, task_id, params from absurd.claim_task($1, $2, 60, 16)",
            queue, worker_id,
        )  # fmt: skip
        if not tasks:
            return
        for t in tasks:
            await conn.execute(
                "select absurd.set_task_checkpoint_state($1, $2, 'echo', $3, $4, 60)",
                queue, t["task_id"], {"echo": t["params"]}, t["run_id"],
            )  # fmt: skip
            await conn.execute(
                "select absurd.complete_run($1, $2, $3)", queue, t["run_id"], {"echo": 1}
            )


def _engine_sql(queue: str) -> tuple[str, str]:
    runs = f'absurd."r_{queue}"'
    return (
        f"select count(*) from {runs} where state in ('pending', 'running', 'sleeping')",
        f"select count(*) filter (where state = 'completed'), max(completed_at) from {runs}",
    )


async def case_raw(bench: Session, n: int, tag: str = "") -> Result:
    queue = f"raw_{n}{tag}"
    await spawn_backlog(bench.url, queue, n)
    before = await settle_stats(bench)
    conns = [await connect(bench.url) for _ in range(2)]
    try:
        async with PgCpuMeter() as pg_meter:
            cpu0, started = time.process_time(), time.time()
            loops = (raw_loop(c, queue, f"raw-{i}") for i, c in enumerate(conns))
            await asyncio.wait_for(asyncio.gather(*loops), timeout=bench.args.timeout)
            cpu = time.process_time() - cpu0
        pg = pg_meter.seconds
    except TimeoutError:
        raise BenchError(f"raw: drain of {n} not finished after {bench.args.timeout:g} s") from None
    finally:
        for conn in conns:
            await conn.close()
    completed, ended = await finish(bench, _engine_sql(queue)[1])
    if completed != n:
        raise BenchError(f"raw: only {completed} of {n} runs completed")
    await asyncio.sleep(1.2)
    # Minus finish()'s query (prepare + execute).
    xacts = await transactions(bench.admin, bench.database) - before - 2
    return Result("raw", n, ended - started, cpu, pg, xacts / n)


async def run_child(
    bench: Session, case: str, n: int, child: Child, open_sql: str, done_sql: str, before: int
) -> Result:
    """Time a worker process from its ready line until nothing is open (or the timeout)."""
    try:
        ready = await child.wait_event("worker.ready", timeout_s=60)
        async with PgCpuMeter() as pg_meter:
            cpu0 = child.cpu_s()
            polls, left = await wait_drained(bench, open_sql, child)
            cpu = child.cpu_s() - cpu0
        pg = pg_meter.seconds
        stopped = time.time()
    finally:
        await child.stop()
    completed, ended = await finish(bench, done_sql)
    if not left and completed != n:
        raise BenchError(f"{case}: only {completed} of {n} runs completed (the rest failed?)")
    await asyncio.sleep(1.2)
    # Minus the probes: each poll, the first one and finish() also preparing.
    xacts = await transactions(bench.admin, bench.database) - before - polls - 3
    log_bytes = child.log_path.stat().st_size / n if case.startswith("lane-worker") else None
    seconds = (stopped if left else ended) - timestamp_s(ready)
    done = max(completed, 1)
    return Result(case, n, seconds, cpu, pg, xacts / done, log_bytes, done=completed)


async def case_sdk(bench: Session, n: int, mode: str, tag: str = "") -> Result:
    assert bench.sdk is not None
    case = "absurd-sdk" if mode == "sync" else "absurd-sdk-async"
    queue = f"sdk_{mode}_{n}{tag}"
    await spawn_backlog(bench.url, queue, n)
    before = await settle_stats(bench)
    argv = [bench.sdk, str(SDK_WORKER), bench.url, queue, "--mode", mode, "--concurrency", "16"]
    child = Child(f"{case}-{n}{tag}", argv, {"PATH": os.environ.get("PATH", "")}, bench.log_dir)
    return await run_child(bench, case, n, child, *_engine_sql(queue), before)


async def case_lane(
    bench: Session,
    n: int,
    *,
    drop_run_logs: bool,
    tag: str = "",
    processes: int = 1,
    event_loop: str = "uvloop",
) -> Result:
    case = "lane-worker-nolog" if drop_run_logs else "lane-worker"
    case += f"-{processes}p" if processes > 1 else ""
    case += "-asyncio" if event_loop == "asyncio" else ""
    release = f"bench-{n}" + case.removeprefix("lane-worker") + tag.replace("_", "-")
    queue = queue_name_for_release(release)
    await submit_backlog(bench.url, release, n)
    before = await settle_stats(bench)
    env = daemon_env(bench.url, release, LANE_WORKER_POLL_INTERVAL="1")
    env["LANE_WORKER_EVENT_LOOP"] = event_loop
    if drop_run_logs:
        env["LANE_WORKER_BENCH_DROP_RUN_LOGS"] = "1"
    if processes > 1:
        env["LANE_WORKER_PROCESSES"] = str(processes)
        env["LANE_WORKER_CONCURRENCY"] = str(16 // processes)
    profile = bench.args.profile / f"{case}-{n}{tag}.prof" if bench.args.profile else None
    child = Child(f"{case}-{n}{tag}", daemon_argv(profile), env, bench.log_dir)
    runs = f"{STORE}.runs where queue = '{queue}'"
    open_sql = f"select count(*) from {runs} and status not in ('completed', 'failed', 'cancelled')"
    done_sql = f"select count(*) filter (where status = 'completed'), max(finished_at) from {runs}"
    return await run_child(bench, case, n, child, open_sql, done_sql, before)


async def run_case(bench: Session, case: str, n: int, tag: str = "") -> Result | None:
    """Run one drain; ``tag`` (e.g. ``_r2``) keeps a repeated round on queues of its own."""
    print(f"{case}, backlog {n}:", flush=True)
    if case.startswith("absurd-sdk"):
        if bench.sdk is None:
            print("  skipped: absurd-sdk is not available (see above)")
            return None
        result = await case_sdk(bench, n, "sync" if case == "absurd-sdk" else "async", tag)
    elif case == "raw":
        result = await case_raw(bench, n, tag)
    else:
        result = await case_lane(
            bench, n, drop_run_logs=case == "lane-worker-nolog", tag=tag,
            processes=2 if case == "lane-worker-2p" else 1,
            event_loop="asyncio" if case == "lane-worker-asyncio" else "uvloop",
        )  # fmt: skip
    print(f"  {result.seconds:.2f} s, {result.rate:.0f} runs/s", flush=True)
    if bench.args.statements:
        await statements.report(bench.url, case, n)
    if result.timed_out:
        print(f"  (timed out: {result.done} of {n} completed; the rate is over those)")
    return result


def report(results: list[Result]) -> None:
    raw = {r.backlog: r.rate for r in results if r.case == "raw"}
    rows = []
    for r in results:
        ratio = f"{r.rate / raw[r.backlog]:.2f}" if r.backlog in raw else "-"
        rows.append([
            r.case, str(r.backlog), f"{'>' if r.timed_out else ''}{r.seconds:.2f}",
            f"{'~' if r.timed_out else ''}{r.rate:.0f}", ratio,
            f"{r.worker_cpu_s:.1f}", f"{r.worker_cpu_s * 1000 / max(r.runs, 1):.3f}",
            f"{r.pg_cpu_s:.1f}", f"{r.xacts_per_run:.1f}",
            "-" if r.log_bytes_per_run is None else f"{r.log_bytes_per_run:.0f}",
        ])  # fmt: skip
    print()
    print_table(
        ["implementation", "backlog", "seconds", "runs/s", "x raw", "worker CPU s",
         "CPU ms/run", "PG CPU s", "xacts/run", "log B/run"],
        rows,
    )  # fmt: skip
    sizes = sorted({r.backlog for r in results})
    if len(sizes) > 1:
        print(f"\nrate at {sizes[-1]} / rate at {sizes[0]} (target >= 0.9 for lane-worker):")
        for case in dict.fromkeys(r.case for r in results):
            by = {r.backlog: r.rate for r in results if r.case == case}
            if sizes[0] in by and sizes[-1] in by:
                print(f"  {case}: {by[sizes[-1]] / by[sizes[0]]:.2f}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, CASES)
    parser.add_argument("--sizes", default="3000", help="backlog sizes, e.g. 3000,30000")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain (600)")
    parser.add_argument("--profile", type=Path, help="cProfile the daemons into this directory")
    parser.add_argument(
        "--statements", action="store_true",
        help="print the server's time per run by statement (needs pg_stat_statements loaded)",
    )  # fmt: skip
    args = parse_args(parser, CASES)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    async with session(args) as bench:
        if args.statements:
            await statements.enable(bench.url)
        for n in sizes:
            for case in args.only:
                result = await run_case(bench, case, n)
                if result is not None:
                    results.append(result)
    report(results)
    late = [f"{r.case} ({r.backlog})" for r in results if r.timed_out]
    if late:
        print(f"\nFAILED: not drained within {args.timeout:g} s: {', '.join(late)}")
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
