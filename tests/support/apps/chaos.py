"""The chaos suite's play (`python -m worker run --app support.apps.chaos:app`).

One play, ``chaos``, follows the plan the test put in its input: steps, durable
sleeps and event waits. Every execution of a step body inserts one row into
``chaos_exec`` through its own short autocommit connection, so the row survives
a SIGKILL and is independent of whether the engine later commits the step; the
step returns that row's token, and the play's output carries every token it
saw, so the test can tell the committed execution from the lost ones.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import uuid
from typing import Any

import asyncpg

from worker import App, TaskContext

app = App()

EXEC_TABLE_SQL = """
create table if not exists chaos_exec (
  id bigserial primary key,
  run_id uuid not null,
  step text not null,
  segment integer not null,
  token uuid not null,
  release_id text not null,
  pid integer not null,
  attempt integer not null,
  raised boolean not null,
  seen jsonb not null,
  at timestamptz not null default clock_timestamp()
)
"""
# The insert decides "first execution" from the table itself, in one statement.
_RECORD_SQL = """
insert into chaos_exec (run_id, step, segment, token, release_id, pid, attempt, raised, seen)
select $1::uuid, $2::text, $3::integer, $4::uuid, $5::text, $6::integer, $7::integer,
       $8::boolean and not exists (select 1 from chaos_exec where run_id = $1 and step = $2),
       $9::text::jsonb
returning raised
"""
CONNECT_TIMEOUT_S = 20.0


class ChaosFailOnceError(RuntimeError):
    """The deliberate failure of a fail-once step on its first execution."""


FAIL_ONCE_ERROR = ChaosFailOnceError.__name__  # the failure reason's name in the engine


async def _record(
    ctx: TaskContext, op: dict[str, Any], segment: int, seen: dict[str, str]
) -> tuple[str, bool]:
    """Insert one execution row; return its token and whether this execution must raise."""
    token = str(uuid.uuid4())
    conn = await asyncpg.connect(os.environ["WORKFLOW_RUNTIME_POSTGRES"], timeout=CONNECT_TIMEOUT_S)
    try:
        raised = await conn.fetchval(
            _RECORD_SQL,
            uuid.UUID(ctx.run_id),
            op["name"],
            segment,
            uuid.UUID(token),
            ctx.release_id,
            os.getpid(),
            ctx.attempt,
            bool(op.get("fail_once")),
            json.dumps(seen),
        )
    finally:
        await conn.close()
    return token, bool(raised)


async def _execute(ctx: TaskContext, op: dict[str, Any], segment: int, seen: dict[str, str]) -> str:
    """Execute a step body once: record it, fail on its first time if asked, return a token."""
    token, raise_now = await _record(ctx, op, segment, seen)
    if raise_now:
        raise ChaosFailOnceError(f"chaos: first execution of step {op['name']} fails")
    # Lingering widens the window in which a SIGKILL lands mid-step.
    await asyncio.sleep(float(op.get("linger_s", 0)))
    return token


@app.play("chaos")
async def chaos(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Run the plan: steps (some fail once, some linger), sleeps and event waits."""
    tokens: dict[str, str] = {}
    waits: dict[str, Any] = {}
    segment = 0
    for op in params["plan"]:
        if op["op"] == "step":
            body = functools.partial(_execute, ctx, op, segment, dict(tokens))
            tokens[op["name"]] = await ctx.step(op["name"], body)
        elif op["op"] == "sleep":
            await ctx.sleep(op["id"], float(op["seconds"]))
            segment += 1
        elif op["op"] == "wait":
            reply = await ctx.wait_for_event(op["id"], op["key"], timeout=float(op["timeout_s"]))
            waits[op["id"]] = {
                "by": reply.get("by"),
                "resumed": reply["resumed"],
                "timed_out": reply["timed_out"],
            }
            segment += 1
        else:
            raise ValueError(f"unknown plan op {op!r}")
    return {"tokens": tokens, "waits": waits, "release": ctx.release_id}
