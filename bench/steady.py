"""Steady load: a producer keeps ~4,000 runs queued while W workers drain them (issue 30).

Each case runs in a scratch database of its own (created, migrated, dropped), so
no case reads tables an earlier one filled. A producer in this process keeps
``--depth`` runs pending on the case's engine queue: one probe connection reads
the queue's pending count every 50 ms and hands out that many submissions short
of the target to ``--producers`` submitter connections, each sending one call
per run, as an app would; only while that does not hold the queue (below 95% of the
target) do they put more runs in one statement, doubling up to ``--batch`` (32; 1:
never), and halving again once the queue is full:

- ``lane-worker``: ``runtime_scheduler.submit_run(play, input, release)``, the
  store's SQL API (store row + engine task in one transaction), drained by the
  real daemon with ``LANE_WORKER_CONCURRENCY=W``.
- ``absurd-sdk-async``: ``absurd.spawn_task(queue, play, params, options)``, the
  statement absurd-sdk's ``spawn`` sends (same options: ``max_attempts`` 5),
  drained by the SDK's ``AsyncAbsurd.start_worker(concurrency=W)``.

Each run is one step of about 1 ms of work: ``--work sleep`` (default) awaits
``asyncio.sleep(0.001)`` on the event loop, as a step waiting on I/O would;
``--work busy`` spins 1 ms of CPU on it. Both are async step bodies on both
sides. The queue is filled to the target before the worker starts; after its
ready line the producer runs ``--warmup`` seconds, then the window of
``--window`` seconds is measured: runs completed with their end time inside it
(``runs.finished_at`` / the engine's ``completed_at``, the server's clock), the
queue depth the probe saw (min / mean / max), and CPU of the worker and of Postgres.
Rounds alternate (lane-worker, sdk; then sdk, lane-worker; ...) at each worker count.

Usage: .venv/bin/python bench/steady.py [--workers 16,64] [--warmup 20] [--window 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common import (
    Session,
    add_common_args,
    connect,
    install_schemas,
    parse_args,
    print_table,
    run_main,
    scratch_database,
    session,
)
from procs import SDK_WORKER, BenchError, Child, PgCpuMeter, daemon_argv, daemon_env

from worker.lanes import queue_name_for_release

LANE, SDK = "lane-worker", "absurd-sdk-async"
CASES = (LANE, SDK)
STORE = "runtime_scheduler"
PLAYS = {"sleep": "sleep_ms", "busy": "busy_ms"}
PROBE_S = 0.05
SPAWN_OPTIONS = {"max_attempts": 5}  # what the SDK's spawn sends by default


@dataclass
class Steady:
    """One case's figures over its measured window."""

    case: str
    workers: int
    round: int
    seconds: float
    completed: int
    failed: int
    submitted_per_s: float
    runs_per_statement: float
    depth_min: int
    depth_mean: float
    depth_max: int
    worker_cpu_s: float
    pg_cpu_s: float

    @property
    def rate(self) -> float:
        return self.completed / self.seconds


class Producer:
    """Keeps ``target`` runs pending on one engine queue: a depth probe and N submitters."""

    def __init__(self, url: str, side: Side, target: int, max_batch: int) -> None:
        self.url = url
        self.side = side
        self.depth_sql = f"select count(*) from absurd.\"r_{side.queue}\" where state = 'pending'"
        self.target = target
        self.max_batch = max_batch
        self.batch = 1  # runs a statement now: 1 while one call a run holds the queue
        self.budget = 0
        self.wake = asyncio.Event()
        self.submitted = 0
        self.statements = 0
        self.next_n = target + 1  # the fill took 1..target
        self.depths: list[int] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start_window(self) -> None:
        """Count depth samples and submissions from now on."""
        self.depths, self.submitted, self.statements = [], 0, 0

    async def _probe(self, conn: Any) -> None:
        while True:
            depth: int = await conn.fetchval(self.depth_sql)
            self.depths.append(depth)
            # Below 95% of the target one call a run does not keep up: batch more (up to
            # max_batch); back at the target, fewer again.
            if depth < 0.95 * self.target:
                self.batch = min(self.max_batch, self.batch * 2)
            elif depth >= self.target:
                self.batch = max(1, self.batch // 2)
            # Submissions in flight are not in the count yet: at most a batch per submitter.
            self.budget = max(0, self.target - depth)
            if self.budget:
                self.wake.set()
            await asyncio.sleep(PROBE_S)

    async def _submit(self, conn: Any) -> None:
        while True:
            if self.budget <= 0:
                self.wake.clear()
                await self.wake.wait()
                continue
            k = min(self.budget, self.batch)
            self.budget -= k
            n, self.next_n = self.next_n, self.next_n + k
            if k == 1:
                await conn.fetch(self.side.submit_sql, *self.side.submit_args(n))
            else:
                await conn.fetchval(self.side.batch_sql, n, n + k - 1)
            self.submitted += k
            self.statements += 1

    @contextlib.asynccontextmanager
    async def running(self, submitters: int) -> AsyncIterator[Producer]:
        """Run the probe and ``submitters`` submitters until the block exits."""
        conns = [await connect(self.url) for _ in range(submitters + 1)]
        self._tasks = [asyncio.create_task(self._probe(conns[0]))]
        self._tasks += [asyncio.create_task(self._submit(c)) for c in conns[1:]]
        try:
            yield self
            self.check()
        finally:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for c in conns:
                await c.close()

    def check(self) -> None:
        """Raise ``BenchError`` when a producer task died (with its error)."""
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise BenchError(f"the producer failed: {t.exception()!r}")


@dataclass(frozen=True)
class Side:
    """What differs between the two implementations."""

    queue: str
    batch_sql: str  # runs numbered $1..$2 in one statement (the fill; batches)
    submit_sql: str
    submit_args: Callable[[int], tuple[Any, ...]]  # the call's arguments for run number n
    done_sql: str  # $1, $2: the window's bounds; returns (completed, failed)


def lane_side(release: str, play: str) -> Side:
    queue = queue_name_for_release(release)
    runs = f"{STORE}.runs where queue = '{queue}'"
    return Side(
        queue,
        f"select count(*) from (select {STORE}.submit_run('{play}', jsonb_build_object('i', g),"
        f" '{release}') from generate_series($1::int, $2::int) g) s",
        f"select {STORE}.submit_run($1, $2, $3)",
        lambda n: (play, {"i": n}, release),
        f"select count(*) filter (where status = 'completed'),"
        f" count(*) filter (where status = 'failed') from {runs}"
        f" and finished_at >= $1 and finished_at < $2",
    )  # fmt: skip


def sdk_side(queue: str, play: str) -> Side:
    runs = f'absurd."r_{queue}"'
    return Side(
        queue,
        f"select count(*) from (select absurd.spawn_task('{queue}', '{play}',"
        f" jsonb_build_object('i', g), '{{\"max_attempts\": 5}}'::jsonb)"
        f" from generate_series($1::int, $2::int) g) s",
        # The statement absurd-sdk's spawn sends (one per run, autocommit).
        "select task_id, run_id, attempt from absurd.spawn_task($1, $2, $3, $4)",
        lambda n: (queue, play, {"i": n}, SPAWN_OPTIONS),
        f"select count(*) filter (where state = 'completed' and completed_at >= $1"
        f" and completed_at < $2), count(*) filter (where state = 'failed'"
        f" and failed_at >= $1 and failed_at < $2) from {runs}",
    )  # fmt: skip


def _release(workers: int, rnd: int) -> str:
    return f"steady-{workers}-r{rnd}"


async def prepare(url: str, case: str, workers: int, rnd: int, play: str, depth: int) -> Side:
    """Make the case's queue and fill it to ``depth`` in one statement, then ANALYZE."""
    if case == LANE:
        side = lane_side(_release(workers, rnd), play)
    else:
        side = sdk_side(f"steady_{workers}_r{rnd}", play)
    conn = await connect(url)
    try:
        if case == SDK:
            await conn.execute("select absurd.create_queue($1)", side.queue)
        await conn.fetchval(side.batch_sql, 1, depth)
        await conn.execute("analyze")
    finally:
        await conn.close()
    return side


def start_worker(bench: Session, url: str, case: str, workers: int, rnd: int, side: Side) -> Child:
    """Start the case's worker with ``workers`` concurrency slots."""
    name = f"steady-{case}-{workers}-r{rnd}"
    if case == LANE:
        env = daemon_env(url, _release(workers, rnd), LANE_WORKER_CONCURRENCY=str(workers))
        return Child(name, daemon_argv(), env, bench.log_dir)
    assert bench.sdk is not None
    argv = [bench.sdk, str(SDK_WORKER), url, side.queue, "--mode", "async",
            "--concurrency", str(workers)]  # fmt: skip
    return Child(name, argv, {"PATH": os.environ.get("PATH", "")}, bench.log_dir)


async def server_now(url: str) -> Any:
    """Return the server's clock (the completions are stamped by it)."""
    conn = await connect(url)
    try:
        return await conn.fetchval("select clock_timestamp()")
    finally:
        await conn.close()


async def run_case(
    bench: Session, args: argparse.Namespace, case: str, workers: int, rnd: int
) -> Steady | None:
    """Run one case in a scratch database of its own; return its window's figures."""
    print(f"steady, {case}, {workers} workers, round {rnd}:", flush=True)
    if case == SDK and bench.sdk is None:
        print("  skipped: absurd-sdk is not available (see above)")
        return None
    async with scratch_database(args.url) as (_name, url):
        await install_schemas(url)
        side = await prepare(url, case, workers, rnd, PLAYS[args.work], args.depth)
        producer = Producer(url, side, args.depth, args.batch)
        child = start_worker(bench, url, case, workers, rnd, side)
        try:
            await child.wait_event("worker.ready", timeout_s=60)
            async with producer.running(args.producers):
                await asyncio.sleep(args.warmup)
                child.check_alive()
                producer.check()
                async with PgCpuMeter() as pg_meter:
                    cpu0, started = child.cpu_s(), await server_now(url)
                    producer.start_window()
                    clock0 = time.monotonic()
                    await asyncio.sleep(args.window)
                    ended, seconds = await server_now(url), time.monotonic() - clock0
                    cpu = child.cpu_s() - cpu0
                child.check_alive()
        finally:
            await child.stop()
        conn = await connect(url)
        try:
            completed, failed = await conn.fetchrow(side.done_sql, started, ended) or (0, 0)
        finally:
            await conn.close()
    depths = producer.depths or [0]
    result = Steady(case, workers, rnd, (ended - started).total_seconds(), completed, failed,
                    producer.submitted / seconds,
                    producer.submitted / max(producer.statements, 1), min(depths),
                    statistics.fmean(depths), max(depths), cpu, pg_meter.seconds)  # fmt: skip
    print(f"  {result.rate:.0f} jobs/s; queued min {result.depth_min},"
          f" mean {result.depth_mean:.0f}", flush=True)  # fmt: skip
    if failed:
        print(f"  {failed} runs FAILED in the window (see the worker's log: --keep-logs)")
    return result


async def measure(bench: Session, args: argparse.Namespace) -> list[Steady]:
    """Run ``args.rounds`` rounds at every worker count; each round starts with the next case."""
    results: list[Steady] = []
    cases = [c for c in CASES if c in args.only]
    for rnd in range(1, args.rounds + 1):
        for workers in args.workers:
            shift = (rnd - 1) % len(cases) if cases else 0
            for case in cases[shift:] + cases[:shift]:
                result = await run_case(bench, args, case, workers, rnd)
                if result is not None:
                    results.append(result)
    return results


def median_rate(results: list[Steady], case: str, workers: int) -> float | None:
    """Return the median jobs/s of ``case`` at ``workers`` over the rounds (None: not run)."""
    rates = [r.rate for r in results if r.case == case and r.workers == workers]
    return statistics.median(rates) if rates else None


def medians(
    results: list[Steady], workers: Sequence[int]
) -> list[tuple[int, float | None, float | None]]:
    """Return (workers, lane-worker's median jobs/s, absurd-sdk-async's) per worker count."""
    return [(w, median_rate(results, LANE, w), median_rate(results, SDK, w)) for w in workers]


def held(r: Steady, args: argparse.Namespace) -> bool:
    """Whether the producer held the queue: never under 90% of the target in the window."""
    return bool(r.depth_min >= 0.9 * args.depth)


def _num(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def report(results: list[Steady], args: argparse.Namespace) -> None:
    """Print every case's window, then the medians and their ratio per worker count."""
    print(f"\nsteady load: {args.depth:,} kept queued, 1 ms of {args.work} a run,"
          f" {args.warmup:g} s warm-up, {args.window:g} s measured:")  # fmt: skip
    print_table(
        ["implementation", "workers", "round", "jobs/s", "failed", "submitted/s",
         "runs/submit", "queued min", "queued mean", "queued max", "held", "worker CPU %",
         "PG CPU %"],
        [[r.case, str(r.workers), str(r.round), f"{r.rate:.0f}", str(r.failed),
          f"{r.submitted_per_s:.0f}", f"{r.runs_per_statement:.1f}", str(r.depth_min),
          f"{r.depth_mean:.0f}", str(r.depth_max), "yes" if held(r, args) else "NO",
          f"{100 * r.worker_cpu_s / r.seconds:.0f}", f"{100 * r.pg_cpu_s / r.seconds:.0f}"]
         for r in results],
    )  # fmt: skip
    print("\nmedian jobs/s (target: lane-worker >= 2x absurd-sdk-async at each worker count):")
    print_table(
        ["workers", LANE, SDK, "ratio"],
        [[str(w), _num(lane), _num(sdk), _num(lane / sdk if lane and sdk else None, ".2f")]
         for w, lane, sdk in medians(results, args.workers)],
    )  # fmt: skip


OPTIONS = ("workers", "warmup", "window", "depth", "producers", "batch", "work")


def add_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add the steady-load options (``prefix``, e.g. ``steady-``, where names would clash)."""
    p = f"--{prefix}"
    parser.add_argument(f"{p}workers", default="16,64", help="worker counts (16,64)")
    parser.add_argument(f"{p}warmup", type=float, default=20.0, help="seconds before the window")
    parser.add_argument(f"{p}window", type=float, default=60.0, help="seconds measured (60)")
    parser.add_argument(f"{p}depth", type=int, default=4000, help="runs kept queued (4000)")
    parser.add_argument(f"{p}producers", type=int, default=4, help="submitter connections (4)")
    parser.add_argument(
        f"{p}batch", type=int, default=32,
        help="most runs a submit statement, used only while one a call falls behind (32)",
    )  # fmt: skip
    parser.add_argument(f"{p}work", choices=sorted(PLAYS), default="sleep", help="1 ms of what")


def steady_args(args: argparse.Namespace, prefix: str = "") -> argparse.Namespace:
    """Return a copy of ``args`` with the steady options under their plain names, parsed."""
    out = argparse.Namespace(**vars(args))
    for key in OPTIONS:
        setattr(out, key, getattr(args, prefix.replace("-", "_") + key))
    out.workers = [int(w) for w in str(out.workers).split(",") if w.strip()]
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, CASES)
    parser.add_argument("--rounds", type=int, default=2, help="rounds at each worker count (2)")
    add_args(parser)
    args = steady_args(parse_args(parser, CASES))
    async with session(args) as bench:
        results = await measure(bench, args)
    report(results, args)
    return 0


if __name__ == "__main__":
    run_main(main)
