"""An engine another system patched (the TS app's vendored Absurd): never replaced silently.

The TypeScript app installs Absurd with a patched ``absurd.claim_task`` (its
continuation fence). `lane-worker migrate`, a worker's boot and a submitting
client upgrade an older engine with absurdctl's migrations, which replace
functions; before they do, each one they replace is compared with Absurd's own.
"""

from __future__ import annotations

import pytest

from support import typescript as ts
from support.cli import operator_env, run_cli
from support.runtime import connect, open_client
from worker.errors import EngineSchemaError

OLD = "0.5.0"
TARGET = "0.5.1"


async def test_migrate_refuses_to_replace_a_patched_claim_task_and_changes_nothing(
    database_url: str,
) -> None:
    """One sentence naming absurd.claim_task and the flag; the engine stays as it was."""
    await ts.install_engine(database_url, OLD, patch=True)
    result = run_cli(operator_env(database_url), "migrate")
    assert result.returncode == 78, result.stderr
    (line,) = result.stderr.splitlines()
    assert "absurd.claim_task differing from Absurd 0.5.0's own" in line
    assert "--replace-engine-functions" in line
    assert await ts.engine_state(database_url) == (OLD, True)
    with pytest.raises(EngineSchemaError):
        async with open_client(database_url, {}):  # a submitting client installs too
            pass
    assert await ts.engine_state(database_url) == (OLD, True)


async def test_migrate_replaces_it_when_asked_and_says_so(database_url: str) -> None:
    """--replace-engine-functions upgrades, naming what it replaced."""
    await ts.install_engine(database_url, OLD, patch=True)
    result = run_cli(operator_env(database_url), "migrate", "--replace-engine-functions")
    assert result.returncode == 0, result.stderr
    assert (
        f"engine schema: upgraded {OLD} -> {TARGET} (replaced absurd.claim_task, as asked)"
        in result.stdout.splitlines()
    )
    assert await ts.engine_state(database_url) == (TARGET, False)


async def test_an_unpatched_older_engine_is_upgraded_without_the_flag(database_url: str) -> None:
    """Absurd's own 0.5.0 functions: the upgrade is lane-worker's to make, as before."""
    await ts.install_engine(database_url, OLD, patch=False)
    result = run_cli(operator_env(database_url), "migrate")
    assert result.returncode == 0, result.stderr
    assert f"engine schema: upgraded {OLD} -> {TARGET}" in result.stdout.splitlines()
    assert await ts.engine_state(database_url) == (TARGET, False)


async def test_a_patched_current_engine_is_left_as_it_is_and_named(database_url: str) -> None:
    """Nothing to upgrade: migrate replaces nothing and says what differs."""
    await ts.install_engine(database_url, TARGET, patch=True)
    result = run_cli(operator_env(database_url), "migrate", "--json")
    assert result.returncode == 0, result.stderr
    assert '"engine": "current (absurd.claim_task differ from Absurd 0.5.1' in result.stdout
    assert await ts.engine_state(database_url) == (TARGET, True)


async def test_a_changed_function_absurdctl_cannot_compare_is_not_replaced_silently(
    database_url: str,
) -> None:
    """At 0.3.0 absurdctl knows only later bodies of drop_queue: a changed one refuses too."""
    conn = await connect(database_url)
    try:
        await conn.execute(
            "create or replace function absurd.get_schema_version() returns text"
            " language sql as $$ select '0.3.0' $$"
        )
        definition: str = await conn.fetchval(
            "select pg_get_functiondef(p.oid) from pg_proc p join pg_namespace n"
            " on n.oid = p.pronamespace where n.nspname = 'absurd' and p.proname = 'drop_queue'"
        )
        await conn.execute(definition.replace("begin", "begin\n  perform 1; -- TS patch", 1))
    finally:
        await conn.close()
    result = run_cli(operator_env(database_url), "migrate")
    assert result.returncode == 78, result.stderr
    (line,) = result.stderr.splitlines()
    assert "absurd.drop_queue, which lane-worker cannot compare with Absurd 0.3.0's own" in line
    assert "--replace-engine-functions" in line
    assert await _drop_queue_patched(database_url)
    result = run_cli(operator_env(database_url), "migrate", "--replace-engine-functions")
    assert result.returncode == 0, result.stderr
    assert "replaced absurd.drop_queue, as asked" in result.stdout
    assert not await _drop_queue_patched(database_url)


async def _drop_queue_patched(database_url: str) -> bool:
    conn = await connect(database_url)
    try:
        body: str = await conn.fetchval(
            "select p.prosrc from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            " where n.nspname = 'absurd' and p.proname = 'drop_queue'"
        )
        return "TS patch" in body
    finally:
        await conn.close()
