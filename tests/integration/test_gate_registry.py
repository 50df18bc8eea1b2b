"""A gated deploy in the registry (store migration 0050), without a scaler.

A gated release is the candidate and the current release stays current; a later
deploy abandons an undecided candidate (its lane retired); a gate on the current
release, or with no machine, is refused and changes nothing; the verdicts apply only
to the deployment they were decided for.
"""

from __future__ import annotations

import pytest

from support.db import fetch
from support.runtime import SCHEMA, env_of, open_client
from worker.errors import InvalidRequestError

GATE = [{"play": "plain", "input": {}}]


async def _roles(database_url: str) -> dict[str, tuple[str, str | None]]:
    rows = await fetch(
        database_url, f"select release_id, role, gate_outcome from {SCHEMA}.deployments"
    )
    return {r["release_id"]: (r["role"], r["gate_outcome"]) for r in rows}


async def test_a_candidate_leaves_the_current_release_current_until_decided(
    database_url: str,
) -> None:
    async with open_client(database_url, env_of("g-a")) as client:
        await client.releases.deploy("g-a", image="img", machines=1)
        b = await client.releases.deploy("g-b", image="img", machines=1, gate=GATE)
        assert (b["candidate"], b["current"], b["previous"]) == (True, ["g-a"], [])
        assert await _roles(database_url) == {"g-a": ("current", None), "g-b": ("candidate", None)}
        state = await client.releases.rollout_state("g-b")
        assert (state.done, state.final) == (False, False), state
        assert "waits for its machines" in str(state.reason), state

        # A gate on the current release, or with no machine: refused, nothing changed.
        with pytest.raises(InvalidRequestError, match="is the current release"):
            await client.releases.deploy("g-a", image="img2", machines=1, gate=GATE)
        with pytest.raises(InvalidRequestError, match="at least 1 machine"):
            await client.releases.deploy("g-c", image="img", machines=0, gate=GATE)
        assert await _roles(database_url) == {"g-a": ("current", None), "g-b": ("candidate", None)}

        # The verdict of a deployment that is no longer the candidate changes nothing.
        [old] = [d for d in await client.db.run(client.store.registry.deployments)
                 if d.release_id == "g-b"]  # fmt: skip
        c = await client.releases.deploy("g-c", image="img", machines=1, gate=GATE)
        assert c["current"] == ["g-a"]
        roles = await _roles(database_url)
        assert roles["g-b"] == ("retired", "abandoned"), roles
        assert roles["g-c"] == ("candidate", None), roles
        lane = await fetch(
            database_url, f"select status from {SCHEMA}.releases where queue = 'runs_g_b'"
        )
        assert [r["status"] for r in lane] == ["retired"]
        abandoned = await client.releases.rollout_state("g-b")
        assert abandoned.final, abandoned
        assert "abandoned" in str(abandoned.reason), abandoned
        passed = await client.db.run(
            lambda conn: client.store.registry.gate_passed(conn, actor="t", d=old, runs=[])
        )
        assert passed is False
        assert (await _roles(database_url))["g-a"] == ("current", None)

        # An ungated deploy abandons the candidate too and becomes current at once.
        await client.releases.deploy("g-d", image="img", machines=1)
        roles = await _roles(database_url)
        assert (roles["g-c"], roles["g-d"], roles["g-a"]) == (
            ("retired", "abandoned"),
            ("current", None),
            ("previous", None),
        )
