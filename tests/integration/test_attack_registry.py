"""Adversarial review (wt-attack) of the release hold (0033) and served lanes (0029).

Each test is marked ``xfail(strict=True)``: it fails on the code under review and
must pass once the defect is fixed (then the mark goes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import asyncpg
import pytest

from support.runtime import SCHEMA, connect

if TYPE_CHECKING:
    Conn = asyncpg.Connection[asyncpg.Record]


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[Conn]:
    connection = await connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_a_deploy_of_an_older_build_is_refused_while_held(conn: Conn) -> None:
    await conn.fetchval(f"select {SCHEMA}.hold_releases('ops', 'incident 42')")
    with pytest.raises(asyncpg.PostgresError) as caught:
        # What `lane-worker releases deploy rel-x --image img --machines 1` of 0.2.1 sends.
        await conn.fetchval(
            f"select {SCHEMA}.deploy_release('rel-x', 'img', 1, 'old-cli', 'deployed')"
        )
    assert caught.value.sqlstate == "55000"


async def test_a_current_release_of_no_machines_does_not_serve(conn: Conn) -> None:
    await conn.fetchval(
        f"select {SCHEMA}.deploy_release_checked('rel-zero', 'img', 0, 'ops', 'deployed', false)"
    )
    made = await conn.fetchval(f"select {SCHEMA}.submit_run('greet', '{{}}', 'rel-zero')")
    assert made["served"] is False
    assert "runs_rel_zero" in made["warning"]
