"""Run the official absurd-sdk Python worker on one queue, for drain.py and wake.py.

Started with the Python of a throwaway venv that has absurd-sdk (never the
project's venv), so it imports nothing from this repository. The task is the
same trivial play: one step that echoes the input; and ``sleep_ms`` / ``busy_ms``,
one step of about a millisecond of work, as in bench_app (steady.py). It prints one JSON line,
``{"event": "worker.ready", "timestamp": ...}``, just before the worker loop
starts, and runs until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from absurd_sdk import Absurd, AsyncAbsurd


def ready(mode: str) -> None:
    """Say the worker is about to claim."""
    stamp = datetime.now(UTC).isoformat()
    print(json.dumps({"event": "worker.ready", "timestamp": stamp, "mode": mode}), flush=True)


def spin_ms() -> None:
    """A millisecond of busy CPU (bench_app's busy_ms does the same)."""
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass


def run_sync(args: argparse.Namespace) -> None:
    """The synchronous worker: a thread pool of ``concurrency`` over one connection."""
    client = Absurd(args.url, queue_name=args.queue)

    @client.register_task("trivial")
    def trivial(params: Any, ctx: Any) -> Any:
        return ctx.step("echo", lambda: {"echo": params})

    @client.register_task("sleep_ms")
    def sleep_ms(params: Any, ctx: Any) -> Any:
        return ctx.step("work", lambda: time.sleep(0.001) or {"slept_ms": 1})

    @client.register_task("busy_ms")
    def busy_ms(params: Any, ctx: Any) -> Any:
        return ctx.step("work", lambda: spin_ms() or {"busy_ms": 1})

    ready("sync")
    client.start_worker(
        worker_id=f"sdk@{socket.gethostname()}:{os.getpid()}",
        claim_timeout=60,
        concurrency=args.concurrency,
        poll_interval=args.poll_interval,
    )


async def run_async(args: argparse.Namespace) -> None:
    """The asyncio worker: batches of ``concurrency`` tasks over one connection."""
    client = AsyncAbsurd(args.url, queue_name=args.queue)

    @client.register_task("trivial")
    async def trivial(params: Any, ctx: Any) -> Any:
        async def echo() -> Any:
            return {"echo": params}

        return await ctx.step("echo", echo)

    @client.register_task("sleep_ms")
    async def sleep_ms(params: Any, ctx: Any) -> Any:
        async def work() -> Any:
            await asyncio.sleep(0.001)
            return {"slept_ms": 1}

        return await ctx.step("work", work)

    @client.register_task("busy_ms")
    async def busy_ms(params: Any, ctx: Any) -> Any:
        async def work() -> Any:
            spin_ms()
            return {"busy_ms": 1}

        return await ctx.step("work", work)

    await client._ensure_connected()
    ready("async")
    await client.start_worker(
        worker_id=f"sdk@{socket.gethostname()}:{os.getpid()}",
        claim_timeout=60,
        concurrency=args.concurrency,
        poll_interval=args.poll_interval,
    )


def main() -> None:
    """Parse the arguments and run the worker until killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--poll-interval", type=float, default=0.25)
    args = parser.parse_args()
    if args.mode == "sync":
        run_sync(args)
    else:
        asyncio.run(run_async(args))


if __name__ == "__main__":
    main()
