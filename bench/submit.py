"""Submit throughput: one ``submit_run`` a call against ``submit_runs`` at batch 100 and 1,000.

In a scratch database of its own (``common.scratch_database``), with both schemas
installed, one plain connection submits runs of a trivial play to one lane, each
call its own transaction, as an app in any language does:

- ``submit_run``: one run a call (a round trip and a commit each);
- ``submit_runs xN``: N runs a call (store migration 0025);
- ``spawn_task only``: the engine's ``absurd.spawn_task`` per run, N a statement,
  and nothing else: the floor ``submit_runs`` stands on, since the engine has no
  bulk spawn and each run's task is one ``spawn_task`` call.

Each case submits ``--runs`` runs (after a warm-up call that is not counted) and
prints runs/s and milliseconds per call. The target is 10,000 runs/s through
``submit_runs``.

Usage: .venv/bin/python bench/submit.py [--runs 20000] [--batches 100,1000]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from common import DEFAULT_URL, connect, install_schemas, print_table, run_main, scratch_database

STORE = "runtime_scheduler"
RELEASE = "bench-submit"
TARGET = 10_000.0  # runs/s through submit_runs
RETRY = (
    '{"max_attempts": 5, "retry_strategy": {"kind": "exponential", "base_seconds": 1,'
    ' "factor": 2, "max_seconds": 300}}'
)


@dataclass(frozen=True)
class Rate:
    """One case's figures."""

    case: str
    runs: int
    seconds: float
    calls: int

    @property
    def per_s(self) -> float:
        return self.runs / self.seconds

    @property
    def ms_per_call(self) -> float:
        return self.seconds * 1000 / self.calls


def items(n: int, start: int) -> list[dict[str, Any]]:
    return [{"play": "trivial", "input": {"i": start + i}, "releaseId": RELEASE} for i in range(n)]


async def single(conn: asyncpg.Connection[Any], runs: int) -> Rate:
    sql = f"select {STORE}.submit_run('trivial', $1, $2)"
    await conn.fetchval(sql, {"i": -1}, RELEASE)  # warm-up: plans, the lane's queue
    started = time.perf_counter()
    for i in range(runs):
        await conn.fetchval(sql, {"i": i}, RELEASE)
    return Rate("submit_run", runs, time.perf_counter() - started, runs)


async def batched(conn: asyncpg.Connection[Any], runs: int, size: int) -> Rate:
    sql = f"select {STORE}.submit_runs($1)"
    await conn.fetchval(sql, items(size, -size))
    calls = max(1, runs // size)
    batches = [items(size, n * size) for n in range(calls)]  # built before the clock
    started = time.perf_counter()
    for batch in batches:
        await conn.fetchval(sql, batch)
    return Rate(f"submit_runs x{size:,}", calls * size, time.perf_counter() - started, calls)


async def spawn_only(conn: asyncpg.Connection[Any], runs: int, size: int) -> Rate:
    queue = await conn.fetchval(f"select {STORE}.queue_for_release($1)", RELEASE)
    sql = (
        "select count(s.task_id) from generate_series(1, $2::int) i,"
        " lateral absurd.spawn_task($1, 'play-run',"
        " jsonb_build_object('runId', gen_random_uuid()::text, 'i', i), $3::jsonb) s"
    )
    await conn.fetchval(sql, queue, size, RETRY)
    calls = max(1, runs // size)
    started = time.perf_counter()
    for _ in range(calls):
        await conn.fetchval(sql, queue, size, RETRY)
    return Rate(f"spawn_task only x{size:,}", calls * size, time.perf_counter() - started, calls)


async def measure(url: str, runs: int, batches: list[int]) -> list[Rate]:
    """Run every case in a scratch database; return their figures."""
    rates = []
    async with scratch_database(url) as (_, scratch):
        await install_schemas(scratch)
        conn = await connect(scratch)
        try:
            # Its lane claims, as a booted worker leaves it: a submit to a lane nobody
            # serves (store migration 0029) carries a warning in every result.
            await conn.execute(
                f"insert into {STORE}.releases (queue, status, release_ids)"
                f" values ({STORE}.queue_for_release($1), 'claiming', array[$1])",
                RELEASE,
            )
            # A fixed number of single calls: its rate does not grow with the count.
            rates.append(await single(conn, min(runs, 5_000)))
            print(f"  {rates[-1].case}: {rates[-1].per_s:,.0f} runs/s", flush=True)
            for size in batches:
                rates.append(await batched(conn, runs, size))
                print(f"  {rates[-1].case}: {rates[-1].per_s:,.0f} runs/s", flush=True)
            rates.append(await spawn_only(conn, runs, max(batches)))
            print(f"  {rates[-1].case}: {rates[-1].per_s:,.0f} runs/s", flush=True)
        finally:
            await conn.close()
    return rates


def report(rates: list[Rate]) -> None:
    print()
    print_table(
        ["case", "runs", "runs/s", "ms/call", "x submit_run"],
        [[r.case, f"{r.runs:,}", f"{r.per_s:,.0f}", f"{r.ms_per_call:.2f}",
          f"{r.per_s / rates[0].per_s:.1f}"] for r in rates],
    )  # fmt: skip
    bulk = [r for r in rates if r.case.startswith("submit_runs")]
    if bulk:
        best = max(bulk, key=lambda r: r.per_s)
        verdict = "met" if best.per_s >= TARGET else "missed"
        print(f"\ntarget {TARGET:,.0f} runs/s through submit_runs: {best.per_s:,.0f} "
              f"({best.case}): {verdict}")  # fmt: skip


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL, help="server to create the scratch db on")
    parser.add_argument("--runs", type=int, default=20_000, help="runs per batched case")
    parser.add_argument("--batches", default="100,1000", help="submit_runs batch sizes")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    print("submit throughput:", flush=True)
    report(await measure(args.url, args.runs, batches))
    return 0


if __name__ == "__main__":
    run_main(main)
