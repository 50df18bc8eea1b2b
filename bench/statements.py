"""The server's time per run, statement by statement: ``drain.py --statements``.

Where a drain's PostgreSQL CPU goes, read from pg_stat_statements: each case's
counters are reset for the scratch database just before its worker starts,
and read once its drain ends. Each statement's planning and execution time is
divided by the backlog: milliseconds of the server's time per run. Top-level
statements are what the worker sent (their times include the statements they
ran); nested ones (``track = all``) show what inside them costs.

The server needs the module loaded, for instance a private one:

    initdb -D /tmp/pgprof -A trust
    pg_ctl -D /tmp/pgprof -o "-p 5499 -c shared_preload_libraries=pg_stat_statements \\
        -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on" start
    .venv/bin/python bench/drain.py --url postgresql://postgres@127.0.0.1:5499/postgres \\
        --statements --only raw,lane-worker
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
from common import print_table
from procs import BenchError

SHOWN = 14  # statements per case and level
MIN_CALLS = 50  # fewer calls than this in a drain is boot or upkeep, not per run


async def enable(url: str) -> None:
    """Create the extension in the scratch database, or say why it cannot be."""
    conn = await asyncpg.connect(url)
    try:
        loaded = await conn.fetchval("select current_setting('shared_preload_libraries')")
        if "pg_stat_statements" not in loaded:
            raise BenchError(
                "--statements needs a server started with "
                "shared_preload_libraries=pg_stat_statements (see bench/statements.py)"
            )
        await conn.execute("create extension if not exists pg_stat_statements")
    finally:
        await conn.close()


async def reset(conn: asyncpg.Connection[Any]) -> None:
    """Forget the scratch database's counters (every user, every statement)."""
    oid = await conn.fetchval("select oid from pg_database where datname = current_database()")
    await conn.execute("select pg_stat_statements_reset(0, $1, 0)", oid)


def _head(query: str) -> str:
    # The statement's first code line, comments dropped, whitespace folded.
    text = " ".join(line for line in query.splitlines() if not line.lstrip().startswith("--"))
    return re.sub(r"\s+", " ", text).strip()[:96]


async def report(url: str, case: str, runs: int) -> None:
    """Print where the server's time went in ``case``'s drain of ``runs`` runs."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "select toplevel, calls, total_plan_time + total_exec_time as ms, query"
            "  from pg_stat_statements s join pg_database d on d.oid = s.dbid"
            " where d.datname = current_database() and calls >= $1"
            " order by ms desc",
            MIN_CALLS,
        )
    finally:
        await conn.close()
    top = [r for r in rows if r["toplevel"]]
    total = sum(r["ms"] for r in top) / runs
    print(f"\n  {case}: the server's time per run, {total:.3f} ms in top-level statements")
    for level, chosen in (("top-level", top), ("nested", [r for r in rows if not r["toplevel"]])):
        print_table(
            [f"  {level}", "calls/run", "ms/run"],
            [
                [f"  {_head(r['query'])}", f"{r['calls'] / runs:.2f}", f"{r['ms'] / runs:.3f}"]
                for r in chosen[:SHOWN]
            ],
        )
