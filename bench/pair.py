"""Paired drain: daemons of two or more builds drain a backlog each, at the same time.

A drain's CPU per run moves with the machine's load more than a change to the daemon
does; daemons that drain side by side see the same load, so their ratio holds. Each
build is a source tree (a checkout or a copy of one: ``git worktree add``, ``git
archive | tar -x``) whose ``python -m worker`` the daemon runs, on this venv's
packages. Per round: one scratch database, a backlog of ``--size`` runs per build
(``LaneClient.submit``, each on its own release lane), every daemon started, then
each one's CPU from its ``worker.ready`` line to its last completion. The start
order turns each round.

Usage: .venv/bin/python bench/pair.py before=/tmp/before after=.:uvloop [--rounds 4]
(``NAME=TREE[:LOOP]``; LOOP sets LANE_WORKER_EVENT_LOOP, which a build that does not
know it warns about and ignores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from common import DEFAULT_URL, Session, run_main, session
from drain import STORE, settle_stats, submit_backlog
from procs import BenchError, Child, daemon_argv, daemon_env

from worker.lanes import queue_name_for_release

POLL_S = 0.1


@dataclass(frozen=True)
class Build:
    name: str
    tree: Path
    loop: str | None


def build_of(spec: str) -> Build:
    name, _, rest = spec.partition("=")
    tree, _, loop = rest.partition(":")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"{spec!r}: write NAME=TREE[:LOOP]")
    path = Path(tree).resolve()
    if not (path / "worker" / "__main__.py").is_file() or not (path / "bench").is_dir():
        raise argparse.ArgumentTypeError(f"{spec!r}: {path} holds no worker/ and bench/")
    return Build(name, path, loop or None)


async def one_round(bench: Session, builds: list[Build], n: int, number: int) -> dict[str, float]:
    """Drain ``n`` runs per build at once; return each build's daemon CPU ms per run."""
    releases = [f"pair-{number}-{i}" for i in range(len(builds))]
    for release in releases:
        await submit_backlog(bench.url, release, n)
    await settle_stats(bench)
    children = []
    try:
        for build, release in zip(builds, releases, strict=True):
            env = daemon_env(bench.url, release, LANE_WORKER_POLL_INTERVAL="1")
            env["PYTHONPATH"] = str(build.tree / "bench")
            if build.loop:
                env["LANE_WORKER_EVENT_LOOP"] = build.loop
            children.append(
                Child(f"{build.name}-{number}", daemon_argv(), env, bench.log_dir, cwd=build.tree)
            )
        for child in children:
            await child.wait_event("worker.ready", timeout_s=60)
        started = [child.cpu_s() for child in children]
        used: dict[str, float] = {}
        conn = await asyncpg.connect(bench.url)
        deadline = time.monotonic() + bench.args.timeout
        try:
            while len(used) < len(builds):
                for build, release, child, cpu0 in zip(
                    builds, releases, children, started, strict=True
                ):
                    if build.name in used:
                        continue
                    left = await conn.fetchval(
                        f"select count(*) from {STORE}.runs where queue = $1"
                        " and status not in ('completed', 'failed', 'cancelled')",
                        queue_name_for_release(release),
                    )
                    if left == 0:
                        used[build.name] = (child.cpu_s() - cpu0) * 1000 / n
                    child.check_alive()
                if time.monotonic() > deadline:
                    raise BenchError(f"round {number}: not drained within {bench.args.timeout} s")
                await asyncio.sleep(POLL_S)
        finally:
            await conn.close()
    finally:
        for child in children:
            await child.stop()
    return used


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", type=build_of, help="NAME=TREE[:LOOP], 2 or more")
    parser.add_argument("--url", default=DEFAULT_URL, help="server to create the scratch db on")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (4)")
    parser.add_argument("--size", type=int, default=3000, help="runs per build per round")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per round (600)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the daemons' logs")
    args = parser.parse_args()
    if len(args.builds) < 2 or len({b.name for b in args.builds}) < len(args.builds):
        parser.error("name two or more builds, each once")
    args.only, args.statements = [], False  # what session() and settle_stats() read
    rows = []
    for number in range(args.rounds):
        turn = number % len(args.builds)
        order = args.builds[turn:] + args.builds[:turn]
        async with session(args) as bench:
            used = await one_round(bench, order, args.size, number)
        load = os.getloadavg()[0]
        shown = "  ".join(f"{b.name} {used[b.name]:.3f}" for b in args.builds)
        print(f"round {number + 1} (load {load:.1f}): daemon CPU ms/run  {shown}", flush=True)
        rows.append(used)
    first = args.builds[0].name
    for build in args.builds[1:]:
        ratios = [r[build.name] / r[first] for r in rows]
        print(f"{build.name} / {first}: " + ", ".join(f"{x:.2f}" for x in ratios)
              + f"  (mean {sum(ratios) / len(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_main(main)
