"""Roles by job on a test database, made by the real ``lane-worker roles --apply``.

Roles are the whole server's and the server is shared by parallel tests: every
name carries a random prefix, and everything is dropped on the way out.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from support.runtime import SCHEMA
from worker.db import roles as role_sql


@dataclass(frozen=True)
class Logins:
    prefix: str
    urls: dict[str, str]  # job -> URL connecting as a login member of that job's role


def url_as(url: str, user: str, password: str) -> str:
    """Return ``url`` connecting as ``user``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{user}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def lane_worker(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``lane-worker`` command on ``database_url``'s default store schema."""
    env = {**os.environ, "WORKFLOW_RUNTIME_POSTGRES": database_url}
    env.pop("LANE_WORKER_STORE_SCHEMA", None)
    env.pop("DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", None)
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def made_roles(database_url: str) -> Iterator[Logins]:
    """Apply the roles (twice: idempotent) and make one login member of each; drop all after."""
    prefix = "lwt_" + secrets.token_hex(5)
    templates = [role_sql.role_name(prefix, job) for job in role_sql.JOBS]
    members = [f"{prefix}_{job}_login" for job in role_sql.JOBS]
    password = secrets.token_hex(12)
    try:
        made = lane_worker(database_url, "roles", "--prefix", prefix, "--apply", "--json")
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["applied"] is True
        again = lane_worker(database_url, "roles", "--prefix", prefix, "--apply")
        assert again.returncode == 0, again.stderr
        for template, member in zip(templates, members, strict=True):
            asyncio.run(
                _admin(
                    database_url,
                    f"create role {member} login password '{password}'; "
                    f"grant {template} to {member}",
                )
            )
        yield Logins(
            prefix,
            {
                job: url_as(database_url, member, password)
                for job, member in zip(role_sql.JOBS, members, strict=True)
            },
        )
    finally:
        every = members + templates
        owned = " ".join(
            f"if exists (select from pg_roles where rolname = '{r}') then "
            f"execute 'drop owned by {r}'; end if;"
            for r in every
        )
        drops = "; ".join(f"drop role if exists {r}" for r in every)
        asyncio.run(_admin(database_url, f"do $$ begin {owned} end $$; {drops}"))


async def deploy_gated(
    owner: asyncpg.Connection[asyncpg.Record], release: str, gate: list[dict[str, object]] | None
) -> None:
    """Deploy ``release`` (one machine), with ``gate`` (store 0050) or without one."""
    await owner.fetchval(
        f"select {SCHEMA}.deploy_release_gated($1, 'img', 1, 'test', 'deploy', false,"
        " $2::jsonb, 300)",
        release,
        json.dumps(gate) if gate is not None else None,
    )


async def sqlstate_of(
    conn: asyncpg.Connection[asyncpg.Record], sql: str, *args: object
) -> str | None:
    """The SQLSTATE ``sql`` raises, None when it runs (rolled back either way)."""
    try:
        async with conn.transaction():
            await conn.fetchval(sql, *args)
    except asyncpg.PostgresError as exc:
        return str(exc.sqlstate)
    return None
