"""The drain report's read time as finished runs pile up, side by side for each store size.

The report (``lanes``, ``lanes wait``, the lanes page) must read only open runs:
its time should not grow with the finished runs a store keeps. For each size N
this fills a fresh store schema with N finished runs and a handful of open ones
(``ANALYZE`` and a ``CHECKPOINT`` after the load, as autovacuum and the server
would do on their own), then times ``LaneClient.lanes()``. The suite checks the
plans (no sequential scan of the runs table); this prints the time.

Usage: .venv/bin/python bench/report.py [--sizes 1000,1000000] [--reads 20]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import asyncpg
from common import DEFAULT_URL, connect, percentile, print_table, run_main, scratch_database

from worker.client import LaneClient

RELEASE = "bench-report"
OPEN_RUNS = {"queued": 3, "waiting": 2, "retrying": 1}


async def measure(url: str, finished: int, reads: int) -> tuple[float, list[float]]:
    """Load ``finished`` runs into a fresh store schema; return load seconds and read times."""
    schema = f"report_bench_{finished}"
    env = {
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": schema,
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": f"bench_{finished}",  # a schema of its own needs one
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE,
    }
    client = await LaneClient.connect(url, env=env)
    conn = await connect(url)
    try:
        await client.migrate()
        await client.activate_release(RELEASE, force=True)
        queue = (await client.submit("plain", {})).queue  # the lane queue, suffix and all
        started = time.monotonic()
        await conn.execute(
            f"insert into {schema}.runs (run_id, play, input, launch, release_id, queue,"
            " status, max_attempts, attempts, created_at, updated_at, finished_at)"
            " select gen_random_uuid(), 'plain', '{}', '{}', $1, $2,"
            " (array['completed', 'failed', 'cancelled'])[1 + i % 3], 5, 1,"
            " now() - make_interval(secs => i), now(), now()"
            " from generate_series(1, $3::int) as i",
            RELEASE, queue, finished,
        )  # fmt: skip
        loaded_s = time.monotonic() - started
        for status, many in OPEN_RUNS.items():
            await conn.execute(
                f"insert into {schema}.runs (run_id, play, input, launch, release_id, queue,"
                " status, current_wait, max_attempts)"
                " select gen_random_uuid(), 'plain', '{}', '{}', $1, $2, $3,"
                " case when $3 = 'waiting' then '{\"kind\": \"sleep\"}'::jsonb end, 5"
                " from generate_series(1, $4::int)",
                RELEASE, queue, status, many,
            )  # fmt: skip
        await conn.execute(f"analyze {schema}.runs")
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await conn.execute("checkpoint")
        await client.lanes()  # warm: the first read plans the statements
        times = []
        for _ in range(reads):
            started = time.monotonic()
            await client.lanes()
            times.append(time.monotonic() - started)
        return loaded_s, times
    finally:
        await conn.close()
        await client.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL, help="server to create the scratch db on")
    parser.add_argument("--sizes", default="1000,1000000", help="finished runs per store")
    parser.add_argument("--reads", type=int, default=20, help="timed lanes() reads per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []
    async with scratch_database(args.url) as (_, url):
        for size in sizes:
            loaded_s, times = await measure(url, size, args.reads)
            ms = [t * 1000 for t in times]
            rows.append(
                [f"{size:,}", f"{loaded_s:.1f}", f"{min(ms):.1f}", f"{percentile(ms, 0.5):.1f}",
                 f"{percentile(ms, 0.95):.1f}"]
            )  # fmt: skip
    print()
    print_table(["finished runs", "load s", "lanes() min ms", "p50 ms", "p95 ms"], rows)
    return 0


if __name__ == "__main__":
    run_main(main)
