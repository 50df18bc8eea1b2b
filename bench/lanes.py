"""A worker facing 10, 100 and 1,000 engine queues: boot, RSS, idle, signal, page, lanes --json.

A week of a hundred deploys a day leaves ~700 engine queues until pruning runs
(issue 35). In one scratch database, grown step by step: nine queues in ten are
retired lanes with ``--parked`` runs (20) parked in a 30-day sleep, one in ten a
plain engine queue no lane names (``tests/support/many_lanes.py`` builds them).
At each step one worker of the newest release (default tuning: LISTEN up, 30 s
safety-net polls) starts and is measured:

- ``boot``: exec to ``worker.ready``; ``attach``: exec to a loop on every retired lane.
- ``RSS`` after the idle window.
- ``idle tx/s``: the database's transactions over ``--lanes-idle-window`` seconds (60: a
  maintenance pass and two safety-net ticks), after a ``VACUUM ANALYZE`` of the whole
  database (creating queues churns the catalogs, and autovacuum's visits count too)
  and with autovacuum kept off the tables.
- ``signal p50``: K runs on its own lane parked on an event, each signalled; from
  just before the signal call to the resumed run's ``run.completed`` line.
- ``page``: the size of ``/`` on the health port; ``/lanes``: of its first JSON page.
- ``lanes --json``: the wall time of ``lane-worker lanes --json`` (a new process,
  every lane), and how many lanes it printed.
- ``lock errors``: log lines saying ``out of shared memory``, and side-loop crashes.

Usage: .venv/bin/python bench/lanes.py [--steps 10,100,1000] [--lanes-idle-window 60]
       [--lanes-runs 10] [--parked 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import asyncpg
from common import (
    Session,
    add_common_args,
    parse_args,
    print_table,
    run_main,
    session,
    transactions,
)
from procs import REPO, BenchError, Child, daemon_argv, daemon_env, timestamp_s
from wake import STATS_FLUSH_S, WAITER_PLAY, without_autovacuum

from worker.client import LaneClient
from worker.lanes import RELEASE_ID_ENV

sys.path.insert(0, str(REPO / "tests"))  # the builder the thousand-lane test uses too
from support import many_lanes

CASES = ("lane-worker",)
RELEASE = "bench-lanes-new"
PLAIN_EVERY = 10  # one queue in ten is a plain engine queue
# The targets at 1,000 queues.
PAGE_BOUND_KB = 200
BOOT_BOUND_S = 2.0
SIGNAL_BOUND_MS = 50.0


@dataclass
class Step:
    """One step's figures."""

    queues: int
    lanes: int
    boot_s: float = float("nan")
    attach_s: float = float("nan")
    rss_mb: float = float("nan")
    idle_xacts_per_s: float = float("nan")
    signal_p50_ms: float = float("nan")
    page_kb: float = float("nan")
    lanes_page_kb: float = float("nan")
    lanes_json_s: float = float("nan")
    lanes_listed: int = 0
    lock_errors: int = 0
    crashes: int = 0


async def http_size(port: int, path: str) -> int:
    """Return the size of the body of ``GET path`` on the daemon's health port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n")[0]:
        raise RuntimeError(f"GET {path}: {head.splitlines()[0]!r}")
    return len(body)


def lanes_json(url: str) -> tuple[float, int]:
    """Time ``lane-worker lanes --json``; return (seconds, lanes printed)."""
    env = {"PATH": "/usr/bin:/bin", "WORKFLOW_RUNTIME_POSTGRES": url}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "worker", "lanes", "--json"],
        cwd=REPO, env=env, capture_output=True, check=True, timeout=300,
    )  # fmt: skip
    return time.monotonic() - started, len(json.loads(done.stdout)["lanes"])


async def signal_p50_ms(url: str, child: Child, runs: int) -> float:
    """Park ``runs`` runs on an event, signal each; return the median signal -> completed."""
    took = []
    async with await LaneClient.connect(url, env={RELEASE_ID_ENV: RELEASE}) as client:
        for i in range(-1, runs):  # -1: a warm-up
            run = await client.submit(WAITER_PLAY, {})
            await child.wait_event("run.parked", timeout_s=60, run_id=run.run_id)
            after = len(child.records)
            called = time.time()
            await client.signal(run.run_id, "go", {"i": i})
            done = await child.wait_event(
                "run.completed", timeout_s=60, after=after, run_id=run.run_id
            )
            if i >= 0:
                took.append((timestamp_s(done) - called) * 1000)
    return statistics.median(took)


async def attached(child: Child, lanes: int, timeout_s: float) -> dict[str, object]:
    """Wait until ``lanes`` loops attached; return the last ``loop.attached`` record."""
    deadline = time.monotonic() + timeout_s
    while True:
        child.read_records()
        found = [r for r in child.records if r.get("event") == "loop.attached"]
        if len(found) >= lanes and found:
            return found[-1]
        child.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(
                f"{child.name}: {len(found)} of {lanes} loops attached\n{child.tail()}"
            )
        await asyncio.sleep(0.05)


async def measure_step(args: argparse.Namespace, bench: Session, step: Step) -> None:
    """Start the newest release's worker facing what was built so far; fill ``step``."""
    url = bench.url
    child = Child(f"lanes-{step.queues}", daemon_argv(), daemon_env(url, RELEASE), bench.log_dir)
    try:
        ready = await child.wait_event("worker.ready", timeout_s=120)
        step.boot_s = timestamp_s(ready) - child.spawned_at
        step.attach_s = timestamp_s(await attached(child, step.lanes, 300)) - child.spawned_at
        await child.wait_event("maintenance.passed", timeout_s=120)
        await without_autovacuum(url)
        await asyncio.sleep(STATS_FLUSH_S)  # the boot's transaction counts land first
        first = await transactions(bench.admin, bench.database)
        await asyncio.sleep(args.lanes_idle_window)
        last = await transactions(bench.admin, bench.database)
        step.idle_xacts_per_s = (last - first) / args.lanes_idle_window
        child.check_alive()
        step.rss_mb = child.rss_mb()
        port = int(ready["health_port"])
        step.page_kb = await http_size(port, "/") / 1024
        step.lanes_page_kb = await http_size(port, "/lanes") / 1024
        step.signal_p50_ms = await signal_p50_ms(url, child, args.lanes_runs)
        step.lanes_json_s, step.lanes_listed = await asyncio.to_thread(lanes_json, url)
        child.read_records()
        text = child.log_path.read_text(errors="replace") + child.err_path.read_text(
            errors="replace"
        )
        step.lock_errors = text.count("out of shared memory")
        step.crashes = sum(1 for r in child.records if r.get("event") == "worker.side_loop_crashed")
        child.check_alive()
    finally:
        await child.stop()


async def measure(args: argparse.Namespace) -> list[Step]:
    """Grow the scratch database step by step; measure a worker at each."""
    steps: list[Step] = []
    built_lanes = built_plain = 0
    async with session(args) as bench:
        for total in args.steps:
            plain = total // PLAIN_EVERY
            lanes = total - plain
            started = time.monotonic()
            await many_lanes.build(
                bench.url, lanes_count=lanes - built_lanes, parked=args.parked,
                plain=plain - built_plain, prefix=f"q{total}", play=WAITER_PLAY,
            )  # fmt: skip
            built_lanes, built_plain = lanes, plain
            # Creating queues churns the catalogs: autovacuum's visits afterwards count as
            # the database's transactions too, which the idle window would charge to the worker.
            await vacuum(bench.url)
            print(f"{total} queues ({lanes} retired lanes, {plain} plain) built in "
                  f"{time.monotonic() - started:.0f} s; measuring", flush=True)  # fmt: skip
            step = Step(queues=total, lanes=lanes)
            await measure_step(args, bench, step)
            steps.append(step)
            report_steps(steps)
    return steps


async def vacuum(url: str) -> None:
    """VACUUM ANALYZE the scratch database (catalogs included), so autovacuum has nothing to do."""
    conn = await asyncpg.connect(url, timeout=30)
    try:
        await conn.execute("vacuum (analyze)")
    finally:
        await conn.close()


def report_steps(steps: list[Step]) -> None:
    """Print the table of every step so far."""
    print_table(
        ["queues", "boot s", "attach s", "RSS MiB", "idle tx/s", "signal p50 ms", "page KB",
         "/lanes KB", "lanes --json s", "listed", "lock errors", "crashes"],
        [[f"{s.queues:,}", f"{s.boot_s:.2f}", f"{s.attach_s:.2f}", f"{s.rss_mb:.1f}",
          f"{s.idle_xacts_per_s:.2f}", f"{s.signal_p50_ms:.0f}", f"{s.page_kb:.1f}",
          f"{s.lanes_page_kb:.1f}", f"{s.lanes_json_s:.2f}", str(s.lanes_listed),
          str(s.lock_errors), str(s.crashes)] for s in steps],
    )  # fmt: skip


def verdicts(steps: list[Step]) -> list[tuple[str, str, str, bool]]:
    """The issue's targets at the largest step: (measure, figure, bound, met)."""
    if not steps:
        return []
    small, big = steps[0], steps[-1]
    idle_ratio = big.idle_xacts_per_s / small.idle_xacts_per_s if small.idle_xacts_per_s else 0
    n = f"{big.queues:,}"
    return [
        (f"{n} queues: lock errors, crashes", f"{big.lock_errors}, {big.crashes}", "0, 0",
         big.lock_errors == 0 and big.crashes == 0),
        (f"{n} queues: idle / {small.queues}-queue idle", f"{idle_ratio:.2f}", "<= 2",
         idle_ratio <= 2),
        (f"{n} queues: page (KB)", f"{big.page_kb:.1f}", f"< {PAGE_BOUND_KB}",
         big.page_kb < PAGE_BOUND_KB),
        (f"{n} queues: boot (s)", f"{big.boot_s:.2f}", f"< {BOOT_BOUND_S:g}",
         big.boot_s < BOOT_BOUND_S),
        (f"{n} queues: signal to complete p50 (ms)", f"{big.signal_p50_ms:.0f}",
         f"< {SIGNAL_BOUND_MS:g}", big.signal_p50_ms < SIGNAL_BOUND_MS),
    ]  # fmt: skip


def add_args(parser: argparse.ArgumentParser) -> None:
    """Add this benchmark's own options (all.py adds them too)."""
    parser.add_argument("--steps", default="10,100,1000", help="queue counts (10,100,1000)")
    parser.add_argument("--parked", type=int, default=20, help="parked runs per retired lane")
    parser.add_argument("--lanes-idle-window", dest="lanes_idle_window", type=float, default=60.0,
                        help="idle seconds counted per step (60)")  # fmt: skip
    parser.add_argument("--lanes-runs", dest="lanes_runs", type=int, default=10,
                        help="signalled runs per step (10)")  # fmt: skip


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, CASES)
    add_args(parser)
    args = parse_args(parser, CASES)
    args.steps = [int(s) for s in args.steps.split(",")]
    steps = await measure(args)
    print("\ntargets:")
    rows = [[m, f, b, "met" if ok else "missed"] for m, f, b, ok in verdicts(steps)]
    print_table(["measure", "figure", "target", ""], rows)
    return 0


if __name__ == "__main__":
    run_main(main)
