"""Idle wake latency, idle query rate and RSS of an idle worker, side by side on one Postgres.

For each worker (a lane-worker daemon with LANE_WORKER_POLL_INTERVAL=1, and
as a reference absurd-sdk's worker with its 250 ms poll): start it on a fresh
queue, let it settle, count the scratch database's transactions over an idle
window (pg_stat_database; no other client is connected then) and read its RSS;
then submit one trivial run at a time, K times, spaced 0.25-0.75 s apart at
varying phases of the poll interval, and measure how long each run waits.

Latencies, all wall clock on this machine:
- ``call -> claim``: from just before the submit call to the engine's claim
  (``r_<queue>.started_at``); the submit itself included.
- ``spawn -> claim``: the engine row's ``created_at`` to ``started_at``.
- ``call -> run.started`` (lane-worker): to the daemon's JSON log line, after
  its per-run store reads; what a user waits before the play runs.
- ``signal -> resumed run.started`` (lane-worker): a run parked on an event,
  from just before the signal call to the resumed attempt's log line.
- ``engine-direct -> run.started`` (lane-worker): an app that writes the run's
  store row and spawns its engine task itself, in one transaction, with no
  NOTIFY of its own (what the TypeScript app does through absurd's SDK): from
  just before that transaction to the log line. The daemon polls every 30 s
  while LISTEN holds, so what finds the run is its trigger on the engine table.

Boot to ready (lane-worker): from the exec of the daemon to its ``worker.ready``.

Idle with continuation loops (lane-worker, the idle target's setup): two older
releases each park a run on an event and are retired, then a newer release's
daemon (default tuning, LISTEN up) attaches a continuation loop to each; its
transactions are counted over ``--attached-window`` seconds (120), with
autovacuum kept off the scratch tables, and reported as a mean, since its polls
are 30 s apart.

Usage: .venv/bin/python bench/wake.py [--runs 30] [--idle-window 20] [--only lane-worker]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from common import (
    TRIVIAL_PLAY,
    Session,
    add_common_args,
    parse_args,
    percentile,
    print_table,
    run_main,
    session,
    transactions,
)
from procs import (
    SDK_WORKER,
    BenchError,
    Child,
    daemon_argv,
    daemon_env,
    timestamp_s,
)

from worker.client import LaneClient
from worker.lanes import RELEASE_ID_ENV, queue_name_for_release

CASES = ("lane-worker", "absurd-sdk")
WAITER_PLAY = "waiter"  # bench_app's: parks until signalled
SETTLE_S = 4.0  # boot work done, and its transaction counts flushed
BUCKET_S = 2.0


@dataclass
class Wake:
    """One worker's figures."""

    case: str
    idle_xacts_per_s: float = float("nan")
    idle_mean_xacts_per_s: float = float("nan")
    rss_idle_mb: float = float("nan")
    rss_after_mb: float = float("nan")
    boot_s: float = float("nan")  # exec to worker.ready (lane-worker)
    latencies: dict[str, list[float]] = field(default_factory=dict)


def spacing_s(i: int) -> float:
    """Return the pause before submit ``i``: 0.25-0.75 s, a golden-ratio sweep of phases."""
    return 0.25 + ((i * 0.618034) % 1.0) * 0.5


async def idle_figures(bench: Session, child: Child, wake: Wake) -> None:
    """Measure the idle transaction rate over the window and the RSS.

    Counted per 2 s bucket; the median bucket is reported, so an autovacuum
    visit to the scratch database (its transactions count too) is not charged
    to the worker. Backends flush their counters about once a second.
    """
    ready = await child.wait_event("worker.ready", timeout_s=60)
    if "timestamp" in ready:
        wake.boot_s = timestamp_s(ready) - child.spawned_at
    await asyncio.sleep(SETTLE_S)
    counts = [await transactions(bench.admin, bench.database)]
    for _ in range(max(1, round(bench.args.idle_window / BUCKET_S))):
        await asyncio.sleep(BUCKET_S)
        counts.append(await transactions(bench.admin, bench.database))
    child.check_alive()
    rates = [(b - a) / BUCKET_S for a, b in itertools.pairwise(counts)]
    wake.idle_xacts_per_s = percentile(rates, 0.5)
    wake.idle_mean_xacts_per_s = (counts[-1] - counts[0]) / (BUCKET_S * len(rates))
    wake.rss_idle_mb = child.rss_mb()
    print(
        f"  idle: {wake.idle_xacts_per_s:.2f} transactions/s (median of {len(rates)} buckets; "
        f"mean {wake.idle_mean_xacts_per_s:.2f}), RSS {wake.rss_idle_mb:.0f} MiB"
    )


async def engine_claims(conn: asyncpg.Connection[Any], queue: str, run_id: Any) -> tuple[Any, Any]:
    """Wait until the engine run ``run_id`` is claimed; return (created_at, started_at)."""
    deadline = time.monotonic() + 30
    while True:
        row = await conn.fetchrow(
            f'select created_at, started_at from absurd."r_{queue}" where run_id = $1', run_id
        )
        if row is not None and row["started_at"] is not None:
            return row["created_at"], row["started_at"]
        if time.monotonic() > deadline:
            raise BenchError(f"engine run {run_id} on {queue} not claimed within 30 s")
        await asyncio.sleep(0.005)


def add(wake: Wake, metric: str, seconds: float) -> None:
    wake.latencies.setdefault(metric, []).append(seconds)


async def case_lane(bench: Session) -> Wake:
    wake = Wake("lane-worker")
    release = "bench-wake"
    queue = queue_name_for_release(release)
    poll = f"{bench.args.poll_interval:g}"
    env = daemon_env(bench.url, release, LANE_WORKER_POLL_INTERVAL=poll)
    child = Child("lane-worker-wake", daemon_argv(), env, bench.log_dir)
    try:
        await idle_figures(bench, child, wake)
        client = await LaneClient.connect(bench.url, env={RELEASE_ID_ENV: release})
        probe = await asyncpg.connect(bench.url)
        try:
            for i in range(-1, bench.args.runs):  # i = -1: a warm-up, not counted
                await asyncio.sleep(spacing_s(i))
                called = time.time()
                run = await client.submit(TRIVIAL_PLAY, {"i": i})
                started = await child.wait_event("run.started", timeout_s=30, run_id=run.run_id)
                created, claimed = await probe.fetchrow(
                    f'select r.created_at, r.started_at from absurd."r_{queue}" r'
                    " join runtime_scheduler.runs s on s.task_id = r.task_id"
                    " where s.run_id = $1::uuid",
                    run.run_id,
                )
                if i >= 0:
                    add(wake, "call -> claim", claimed.timestamp() - called)
                    add(wake, "spawn -> claim", (claimed - created).total_seconds())
                    add(wake, "call -> run.started", timestamp_s(started) - called)
            await child.wait_event("run.completed", timeout_s=30, run_id=run.run_id)
            await signal_rounds(bench, client, child, wake)
            await engine_direct_rounds(bench, probe, release, child, wake)
        finally:
            await probe.close()
            await client.close()
        wake.rss_after_mb = child.rss_mb()
    finally:
        await child.stop()
    return wake


STATS_FLUSH_S = 15.0
OLD_RELEASES = ("bench-idle-old-a", "bench-idle-old-b")
ATTACHED_RELEASE = "bench-idle-new"


async def without_autovacuum(url: str) -> None:
    """Keep autovacuum off the scratch database's tables for the window.

    Its visits to the freshly filled tables count as the database's transactions
    (about 0.3/s here), which a mean over the window would charge to the worker.
    """
    conn = await asyncpg.connect(url)
    try:
        tables = await conn.fetch(
            "select format('%I.%I', schemaname, tablename) as name from pg_tables"
            " where schemaname not in ('pg_catalog', 'information_schema')"
        )
        for t in tables:
            await conn.execute(f"alter table {t['name']} set (autovacuum_enabled = false)")
    finally:
        await conn.close()


async def case_lane_attached(bench: Session) -> Wake:
    """Idle with its own loop and two continuation loops attached: the mean rate over the window."""
    wake = Wake("lane-worker +2 continuation loops")
    for release in OLD_RELEASES:
        env = daemon_env(bench.url, release)
        old = Child(f"lane-worker-{release}", daemon_argv(), env, bench.log_dir)
        try:
            await old.wait_event("worker.ready", timeout_s=60)
            async with await LaneClient.connect(bench.url, env={RELEASE_ID_ENV: release}) as client:
                run = await client.submit(WAITER_PLAY, {})
                await old.wait_event("run.parked", timeout_s=30, run_id=run.run_id)
        finally:
            await old.stop()
    async with await LaneClient.connect(bench.url, env={RELEASE_ID_ENV: ATTACHED_RELEASE}) as c:
        for release in OLD_RELEASES:
            await c.retire_release(release)
    env = daemon_env(bench.url, ATTACHED_RELEASE)
    child = Child("lane-worker-attached", daemon_argv(), env, bench.log_dir)
    try:
        await child.wait_event("worker.ready", timeout_s=60)
        for release in OLD_RELEASES:
            queue = queue_name_for_release(release)
            await child.wait_event("loop.attached", timeout_s=60, queue=queue)
        await without_autovacuum(bench.url)
        # A backend that goes idle reports its transactions up to 10 s later
        # (PostgreSQL 15+): the boot's must land before the window opens.
        await asyncio.sleep(STATS_FLUSH_S)
        first = await transactions(bench.admin, bench.database)
        await asyncio.sleep(bench.args.attached_window)
        last = await transactions(bench.admin, bench.database)
        child.check_alive()
        wake.idle_mean_xacts_per_s = (last - first) / bench.args.attached_window
        wake.rss_idle_mb = child.rss_mb()
        print(
            f"  idle: {wake.idle_mean_xacts_per_s:.2f} transactions/s over "
            f"{bench.args.attached_window:g} s, RSS {wake.rss_idle_mb:.0f} MiB"
        )
    finally:
        await child.stop()
    return wake


async def signal_rounds(bench: Session, client: LaneClient, child: Child, wake: Wake) -> None:
    """K runs parked on an event, each signalled: signal call to its resumed ``run.started``."""
    for i in range(-1, bench.args.runs):
        run = await client.submit(WAITER_PLAY, {})
        await child.wait_event("run.parked", timeout_s=30, run_id=run.run_id)
        await asyncio.sleep(spacing_s(i))
        after = len(child.records)
        called = time.time()
        await client.signal(run.run_id, "go", {"i": i})
        resumed = await child.wait_event(
            "run.started", timeout_s=30, after=after, run_id=run.run_id
        )
        if i >= 0:
            add(wake, "signal -> resumed run.started", timestamp_s(resumed) - called)


ENGINE_DIRECT_RUN_ROW = """
insert into runtime_scheduler.runs (run_id, play, input, launch, release_id, queue, max_attempts)
values ($1::uuid, $2::text, $3::jsonb,
        jsonb_build_object('absurdReleaseId', $4::text, 'play', $2::text, 'runId', $1::text),
        $4::text, $5::text, 5)
"""
ENGINE_DIRECT_TASK = """
update runtime_scheduler.runs set task_id = (
  select task_id from absurd.spawn_task($2::text, 'play-run',
                                        jsonb_build_object('runId', $1::text),
                                        '{"max_attempts": 5}'::jsonb))
where run_id = $1::uuid
"""


async def engine_direct_rounds(
    bench: Session, conn: asyncpg.Connection[Any], release: str, child: Child, wake: Wake
) -> None:
    """K runs written straight through the engine: the call to their ``run.started``.

    The store row and the engine task in one transaction of the bench's own, as an
    app using absurd's SDK beside the store would write them; nothing sends a
    NOTIFY but the trigger the worker installed on its lane's engine table.
    """
    queue = queue_name_for_release(release)
    for i in range(-1, bench.args.runs):
        await asyncio.sleep(spacing_s(i))
        run_id = uuid.uuid4()
        called = time.time()
        async with conn.transaction():
            row = (str(run_id), TRIVIAL_PLAY, json.dumps({"i": i}), release, queue)
            await conn.execute(ENGINE_DIRECT_RUN_ROW, *row)
            await conn.execute(ENGINE_DIRECT_TASK, str(run_id), queue)
        started = await child.wait_event("run.started", timeout_s=60, run_id=str(run_id))
        if i >= 0:
            add(wake, "engine-direct -> run.started", timestamp_s(started) - called)


async def case_sdk(bench: Session, python: str) -> Wake:
    wake = Wake("absurd-sdk")
    queue = "sdk_wake"
    probe = await asyncpg.connect(bench.url)  # an idle connection adds no transactions
    try:
        await probe.execute("select absurd.create_queue($1)", queue)
        argv = [python, str(SDK_WORKER), bench.url, queue, "--mode", "sync", "--concurrency", "16"]
        child = Child("absurd-sdk-wake", argv, {"PATH": os.environ.get("PATH", "")}, bench.log_dir)
        try:
            await idle_figures(bench, child, wake)
            for i in range(-1, bench.args.runs):
                await asyncio.sleep(spacing_s(i))
                called = time.time()
                engine_run = await probe.fetchval(
                    "select run_id from absurd.spawn_task($1, $2, jsonb_build_object('i', $3::int),"
                    " '{\"max_attempts\": 5}'::jsonb)",
                    queue, TRIVIAL_PLAY, i,
                )  # fmt: skip
                created, claimed = await engine_claims(probe, queue, engine_run)
                if i >= 0:
                    add(wake, "call -> claim", claimed.timestamp() - called)
                    add(wake, "spawn -> claim", (claimed - created).total_seconds())
            wake.rss_after_mb = child.rss_mb()
        finally:
            await child.stop()
    finally:
        await probe.close()
    return wake


def report(results: list[Wake], args: argparse.Namespace) -> None:
    rows = []
    for w in results:
        for metric, values in w.latencies.items():
            ms = [v * 1000 for v in values]
            rows.append([w.case, metric, str(len(ms))] + [
                f"{percentile(ms, q):.1f}" for q in (0.5, 0.95)
            ] + [f"{max(ms):.1f}"])  # fmt: skip
    print(f"\nwake latency (ms), one run at a time, lane-worker poll {args.poll_interval:g} s:")
    print_table(["worker", "metric", "n", "p50", "p95", "max"], rows)
    print(f"\nidle worker ({args.idle_window:g} s window, {BUCKET_S:g} s buckets):")
    print_table(
        ["worker", "xacts/s median", "xacts/s mean", "RSS idle MiB", "RSS after runs MiB",
         "boot to ready s"],
        [
            [w.case, f"{w.idle_xacts_per_s:.2f}", f"{w.idle_mean_xacts_per_s:.2f}",
             f"{w.rss_idle_mb:.0f}", f"{w.rss_after_mb:.0f}", f"{w.boot_s:.2f}"]
            for w in results
        ],
    )  # fmt: skip


def add_attached_window(parser: argparse.ArgumentParser) -> None:
    """The option of the idle case with continuation loops attached."""
    parser.add_argument(
        "--attached-window", type=float, default=120.0,
        help="idle seconds with two continuation loops attached (120; 0 skips it)",
    )  # fmt: skip


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, CASES)
    parser.add_argument("--runs", type=int, default=30, help="runs submitted one at a time (30)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="daemon's poll (1 s)")
    parser.add_argument("--idle-window", type=float, default=20.0, help="idle sample seconds")
    add_attached_window(parser)
    args = parse_args(parser, CASES)
    results: list[Wake] = []
    async with session(args) as bench:
        if "lane-worker" in args.only:
            print("lane-worker:", flush=True)
            results.append(await case_lane(bench))
            if args.attached_window > 0:
                print("lane-worker with two continuation loops attached:", flush=True)
                results.append(await case_lane_attached(bench))
        if "absurd-sdk" in args.only:
            print("absurd-sdk (sync worker, 250 ms poll):", flush=True)
            if bench.sdk is None:
                print("  skipped: absurd-sdk is not available (see above)")
            else:
                results.append(await case_sdk(bench, bench.sdk))
    report(results, args)
    return 0


if __name__ == "__main__":
    run_main(main)
