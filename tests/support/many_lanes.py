"""A week of deploys, built at once: many engine queues in few transactions.

``build`` makes retired lanes, each with runs parked in a long sleep (submitted with
the store's ``submit_run``, claimed and put to sleep through the engine's own
functions, their store rows marked parked as a worker's park does), and plain
engine queues that no lane names (another system's, say). Each queue also gets
one task cancelled 31 days ago (``absurd.fake_now``), past every cleanup policy
(6 hours for a lane, 30 days by default): on a lane, a run of the store that was
cancelled, which maintenance deletes; on a plain queue, another system's task,
which maintenance leaves (issue 29). ``uncleaned`` lists the queues that still
hold theirs. Work goes in batches of
``BATCH`` queues per transaction: creating a queue locks its ~28 new relations
until commit, and a thousand in one transaction would run the server out of
lock memory (about 80 ms a queue on a busy 2-core machine).
``bench/lanes.py`` uses it too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from worker import lanes

SCHEMA = "runtime_scheduler"
BATCH = 20
# A play of support.apps.basic: a newer release of that app may adopt the runs.
PARKED_PLAY = "sleeper"
SLEEP = "30 days"
WAIT = {"kind": "sleep", "boundaryId": "nap", "stepName": "wait:nap"}


@dataclass(frozen=True)
class Built:
    """What ``build`` made: the retired lanes' queues and the plain queues."""

    lanes: tuple[str, ...]
    plain: tuple[str, ...]

    @property
    def queues(self) -> tuple[str, ...]:
        """Return every queue built."""
        return (*self.lanes, *self.plain)


def _batches(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


async def build(
    url: str,
    *,
    lanes_count: int,
    parked: int,
    plain: int,
    prefix: str = "old",
    play: str = PARKED_PLAY,
) -> Built:
    """Build ``lanes_count`` retired lanes with ``parked`` parked runs each, ``plain`` queues."""
    releases = [f"{prefix}-{i:04d}" for i in range(lanes_count)]
    lane_queues = [lanes.queue_name_for_release(r) for r in releases]
    plain_queues = [f"{prefix}_plain_{i:04d}" for i in range(plain)]
    conn: asyncpg.Connection[Any] = await asyncpg.connect(url, timeout=30)
    try:
        for batch in _batches(releases, BATCH):
            async with conn.transaction():
                await _retired_lanes(conn, batch, parked, play)
        for batch in _batches(plain_queues, BATCH):
            async with conn.transaction():
                for queue in batch:
                    await conn.execute("select absurd.create_queue($1)", queue)
        for batch in _batches(releases, BATCH):
            async with conn.transaction():
                await _cancelled_long_ago(conn, releases=batch)
        for batch in _batches(plain_queues, BATCH):
            async with conn.transaction():
                await _cancelled_long_ago(conn, queues=batch)
    finally:
        await conn.close()
    return Built(tuple(lane_queues), tuple(plain_queues))


async def _retired_lanes(
    conn: asyncpg.Connection[Any], releases: list[str], parked: int, play: str
) -> None:
    """Submit ``parked`` runs to each release's lane, park them in a sleep, retire the lanes."""
    await conn.execute(
        f"select {SCHEMA}.submit_run($1, '{{}}'::jsonb, r) "
        "from unnest($2::text[]) r, generate_series(1, $3)",
        play,
        releases,
        parked,
    )
    for release in releases:
        queue = lanes.queue_name_for_release(release)
        runs = await conn.fetch(
            "select run_id, task_id from absurd.claim_task($1, 'lanes-setup', 3600, $2)",
            queue,
            parked,
        )
        await conn.execute(
            "select absurd.schedule_run($1, r, absurd.current_time() + $3::text::interval) "
            "from unnest($2::uuid[]) r",
            queue,
            [r["run_id"] for r in runs],
            SLEEP,
        )
        await conn.execute(
            f"update {SCHEMA}.runs set status = 'waiting', current_wait = $2::jsonb, "
            "attempts = 1 where task_id = any($1::uuid[])",
            [r["task_id"] for r in runs],
            json.dumps(WAIT),
        )
        # Its own workers installed the NOTIFY trigger when they booted.
        await conn.execute("select lane_worker.watch_queue_v1($1)", queue)
        # Retired a day ago, registered long before the worker that will face them.
        await conn.execute(
            f"insert into {SCHEMA}.releases (queue, status, release_ids, retired_at, created_at) "
            "values ($1, 'retired', array[$2::text], now() - interval '1 day', "
            "now() - interval '8 days')",
            queue,
            release,
        )


async def _cancelled_long_ago(
    conn: asyncpg.Connection[Any], *, releases: Sequence[str] = (), queues: Sequence[str] = ()
) -> None:
    """Give each release's lane a run, and each plain queue a task, cancelled 31 days ago."""
    await conn.execute(
        "select set_config('absurd.fake_now', (now() - interval '31 days')::text, true)"
    )
    if releases:
        await conn.execute(
            f"select {SCHEMA}.cancel_run(({SCHEMA}.submit_run('old', '{{}}'::jsonb, r)"
            "->>'runId')::uuid) from unnest($1::text[]) r",
            list(releases),
        )
    for queue in queues:
        await conn.execute(
            "select absurd.cancel_task($1, (absurd.spawn_task($1, 'old', '{}'::jsonb)).task_id)",
            queue,
        )


async def uncleaned(url: str, queues: Sequence[str]) -> list[str]:
    """Return the queues that still hold a cancelled task (a few queues per transaction)."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(url, timeout=30)
    left: list[str] = []
    try:
        for batch in _batches(queues, BATCH):
            async with conn.transaction():
                for queue in batch:
                    if await conn.fetchval(
                        f"select exists (select 1 from absurd.{_ident('t_' + queue)} "
                        "where state = 'cancelled')"
                    ):
                        left.append(queue)
    finally:
        await conn.close()
    return left


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
