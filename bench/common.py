"""Shared pieces of the benchmarks: options, the scratch database, statistics, tables.

Every benchmark creates its own scratch database (``lane_worker_bench_<hex>``)
on the server ``--url`` names and drops it on the way out, also after Ctrl-C
or SIGTERM (children are stopped first: see ``procs``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from procs import SDK_VENV, BenchError, sdk_python

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TRIVIAL_PLAY = "trivial"


def run_main(main: Callable[[], Awaitable[int]]) -> None:
    """Run ``main`` to completion; Ctrl-C or SIGTERM unwind it (cleanup runs) and exit 130."""

    async def wrapper() -> int:
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):  # also when started with SIGINT ignored
            asyncio.get_running_loop().add_signal_handler(signum, task.cancel)
        return await main()

    try:
        code = asyncio.run(wrapper())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: children stopped, scratch database dropped", file=sys.stderr)
        code = 130
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)


def url_for_database(url: str, name: str) -> str:
    """Return ``url`` pointing at database ``name``."""
    return urlsplit(url)._replace(path=f"/{name}").geturl()


@contextlib.asynccontextmanager
async def scratch_database(url: str) -> AsyncIterator[tuple[str, str]]:
    """Create a scratch database; yield its name and URL; drop it (forcibly) afterwards."""
    name = f"lane_worker_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(url, timeout=10)
    try:
        await admin.execute(f'create database "{name}"')
    finally:
        await admin.close()
    print(f"scratch database: {name}", flush=True)
    try:
        yield name, url_for_database(url, name)
    finally:
        admin = await asyncpg.connect(url, timeout=10)
        try:
            await admin.execute(f'drop database if exists "{name}" with (force)')
        finally:
            await admin.close()


def add_common_args(parser: argparse.ArgumentParser, cases: Sequence[str]) -> None:
    """Add the options every benchmark has."""
    parser.add_argument("--url", default=DEFAULT_URL, help="server to create the scratch db on")
    parser.add_argument("--only", default=",".join(cases), help=f"subset of {','.join(cases)}")
    parser.add_argument("--sdk-venv", type=Path, default=SDK_VENV, help="throwaway absurd-sdk venv")
    parser.add_argument("--no-sdk-install", action="store_true", help="do not create that venv")
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' log files")


def parse_args(parser: argparse.ArgumentParser, cases: Sequence[str]) -> argparse.Namespace:
    """Parse the command line; ``args.only`` becomes the list of cases to run, in order."""
    args = parser.parse_args()
    only = {c.strip() for c in args.only.split(",") if c.strip()}
    if only - set(cases):
        parser.error(f"unknown case(s) {sorted(only - set(cases))}; choose from {cases}")
    args.only = [c for c in cases if c in only]
    return args


@dataclass
class Session:
    """One benchmark run: the scratch database, an admin connection, options, the log dir."""

    url: str
    database: str
    admin: asyncpg.Connection[Any]  # to the server's own database, for pg_stat_database
    args: argparse.Namespace
    log_dir: Path
    sdk: str | None


@contextlib.asynccontextmanager
async def session(args: argparse.Namespace) -> AsyncIterator[Session]:
    """Find absurd-sdk if a case needs it, create the scratch database and install the schemas."""
    sdk = None
    if any(c.startswith("absurd-sdk") for c in args.only):
        sdk, why = sdk_python(args.sdk_venv, install=not args.no_sdk_install)
        print(f"absurd-sdk: {why}", flush=True)
    try:
        admin = await asyncpg.connect(args.url, timeout=10)
    except (OSError, asyncpg.PostgresError) as exc:
        raise BenchError(f"cannot connect to {args.url}: {exc}; pass --url") from exc
    log_dir = Path(tempfile.mkdtemp(prefix="lane-worker-bench-"))
    try:
        async with scratch_database(args.url) as (name, url):
            await install_schemas(url)
            yield Session(url, name, admin, args, log_dir, sdk)
    finally:
        await admin.close()
        if args.keep_logs:
            print(f"logs kept in {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


async def install_schemas(url: str) -> None:
    """Install the engine schema and the lane-worker store (what a daemon does at boot)."""
    from worker.client import LaneClient

    client = await LaneClient.connect(url, env={})
    try:
        await client.migrate()
    finally:
        await client.close()


async def connect(url: str) -> asyncpg.Connection[Any]:
    """Open a plain connection with JSON codecs (what the raw loop and the probes use)."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(url, timeout=10)
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
    return conn


async def transactions(admin: asyncpg.Connection[Any], database: str) -> int:
    """Return committed + rolled-back transactions of ``database`` so far (lags ~1 s)."""
    value: int = await admin.fetchval(
        "select xact_commit + xact_rollback from pg_stat_database where datname = $1", database
    )
    return value


def percentile(values: Sequence[float], q: float) -> float:
    """Return the ``q`` quantile (0..1) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print an aligned text table (first column left-aligned, the rest right-aligned)."""
    table = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for n, row in enumerate(table):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
