"""Sandbox cleanup with real daemons: a worker SIGKILLed in the middle of a DELETE.

The fake Daytona never answers the first DELETE; the daemon is killed while it
waits. Another daemon claims the cleanup again once the lease ends, and the
sandbox is deleted; the API key appears in no log.
"""

from __future__ import annotations

import json

from support.daemon import Daemons
from support.daytona import HANG, FakeDaytona
from support.runtime import open_client

KEY = "daytona-e2e-key-3a71"


async def test_a_cleanup_cut_off_by_sigkill_is_claimed_again_and_done(database_url: str) -> None:
    """SIGKILL mid-DELETE: the next worker deletes the sandbox once the 5 s lease ends."""
    async with FakeDaytona(lambda s, n: HANG if n == 0 else 200) as fake:
        fake.sandboxes.add("sb-kill")
        env = {**fake.env(KEY), "LANE_WORKER_CLAIM_TIMEOUT": "5"}
        async with Daemons(database_url) as pool:
            a = pool.start("sbx-kill", name="A", **env)
            await a.ready()
            async with open_client(
                database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "sbx-kill"}
            ) as c:
                run_id = (await c.submit("sandboxed", {"sandbox": "sb-kill"})).run_id
                assert (await c.wait(run_id, 30)).status == "completed"
            await fake.wait_for_delete("sb-kill", 1)
            a.kill()
            await a.wait_exit()
            assert fake.deleted == []

            b = pool.start("sbx-kill", name="B", **env)
            await b.ready()
            await b.wait_for("sandbox.cleaned", timeout_s=30, sandbox_id="sb-kill")
            logs = [json.dumps(d.records) + d.stderr for d in (a, b)]
    assert fake.deleted == ["sb-kill"]
    assert fake.deletes["sb-kill"] == 2
    assert all(KEY not in log for log in logs)
