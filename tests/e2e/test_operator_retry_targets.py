"""The operator page's bulk retry says where each retry goes, and does just that (issue 31).

A worktree's daemon (dev-wt) boots first, then a release's (A, the newest lane,
with the page). A bulk retry of every failed run once sent the worktree's runs to
A and counted runs retried already. Now the preview names the target per group
("3 run(s) -> A, 2 run(s) -> dev-wt"), counts only runs that get a new retry,
the action retries each where the preview said, a run whose target went away
meanwhile is refused (never sent elsewhere), and a named release (``to``) is used.
Posted over HTTP as the page's forms; outcomes read from the store.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from e2e.test_operator_actions import (
    STORE,
    Operator,
    finished_action,
    form,
    statuses,
    store_rows,
)

from support.daemon import Daemons
from support.page import parse_fields
from support.runtime import eventually, open_client

A = "oppage_retry_a"
DEV_SUFFIX = "wt"
DEV = f"dev-{DEV_SUFFIX}"
ONE_ATTEMPT = {"LANE_WORKER_MAX_ATTEMPTS": "1"}


async def retries_of(database_url: str, run_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Each retried run's retry: (its id, its release)."""
    rows = await store_rows(
        database_url,
        f"select retry_of::text, run_id::text, release_id from {STORE}.runs"
        " where retry_of = any($1::uuid[])",
        run_ids,
    )
    return {r["retry_of"]: (r["run_id"], r["release_id"]) for r in rows}


async def all_failed(database_url: str, run_ids: list[str]) -> None:
    async def failed() -> bool:
        return set((await statuses(database_url, run_ids)).values()) == {"failed"}

    await eventually(failed, timeout_s=60, what=f"{len(run_ids)} runs failed")


def targets(body: str) -> dict[str, int]:
    """The preview's groups: release -> runs whose retry goes there."""
    found: dict[str, int] = {}
    for chunk in body.split('data-field="target" ')[1:]:
        release = chunk.split('data-release="', 1)[1].split('"', 1)[0]
        found[release] = int(chunk.split('data-count="', 1)[1].split('"', 1)[0])
    return found


async def test_bulk_retry_previews_each_target_and_keeps_to_it(
    database_url: str, tmp_path: Path
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, **ONE_ATTEMPT}) as client,
    ):
        dev = pool.start(
            DEV, name="dev", DEEPLINE_ABSURD_QUEUE_SUFFIX=DEV_SUFFIX,
            DEEPLINE_RUNTIME_DEPLOY_VERSION=None, **ONE_ATTEMPT,
        )  # fmt: skip
        await dev.ready()
        rel = pool.start(A, LANE_WORKER_PAGE_TOKEN=token, **ONE_ATTEMPT)
        await rel.ready()  # A registers after dev-wt: the newest claiming lane
        on_dev = [
            (await client.submit("flaky", {"n": n}, queue_suffix=DEV_SUFFIX)).run_id
            for n in range(2)
        ]
        on_a = [(await client.submit("flaky", {"n": n})).run_id for n in range(3)]
        await all_failed(database_url, on_dev + on_a)
        # One is retried already (its retry fails too): a second retry submits nothing.
        first = await client.retry_run(on_a[0])
        await all_failed(database_url, [first.run_id])

        op = Operator(rel.health_port, tmp_path)
        assert (await op.post("/signin", {"who": "ana", "token": token}))[0] == 303
        bulk = form(await op.get("/runs?status=failed&play=flaky"), "/actions/preview")
        status, body, _ = await op.post("/actions/preview", {**bulk, "action": "retry"})
        assert status == 200, body
        fields = parse_fields(body)
        assert 'data-field="count" data-count="5"' in body  # not 6: one was retried
        assert targets(body) == {A: 3, DEV: 2}
        assert 'data-field="retried" data-count="1"' in body
        assert f"3 run(s) -&gt; {A}, 2 run(s) -&gt; {DEV}" in body
        assert fields.found
        status, body, response = await op.post("/actions/run", form(body, "/actions/run"))
        assert status == 303, body
        row = await finished_action(database_url, int(response.headers["Location"][16:]))
        assert (row["count_seen"], row["acted"], row["unchanged"], row["refused"]) == (5, 5, 0, 0)
        retried = await retries_of(database_url, on_dev + on_a)
        assert {r: retried[r][1] for r in on_dev} == dict.fromkeys(on_dev, DEV)
        assert {r: retried[r][1] for r in on_a[1:]} == dict.fromkeys(on_a[1:], A)
        assert retried[on_a[0]] == (first.run_id, A)  # untouched: its one retry

        # The dev retries fail too. Preview them; the worktree's worker stops before the
        # confirmation: refused, not sent to A.
        dev_retries = [retried[r][0] for r in on_dev]
        await all_failed(database_url, dev_retries)
        listed = await op.get(f"/runs?status=failed&release={DEV}")
        status, body, _ = await op.post(
            "/actions/preview", {**form(listed, "/actions/preview"), "action": "retry"}
        )
        assert (status, targets(body)) == (200, {DEV: 2}), body
        assert 'data-field="retried" data-count="2"' in body
        confirmation = form(body, "/actions/run")
        dev.terminate()
        assert await dev.wait_exit(timeout_s=30) == 0
        status, body, response = await op.post("/actions/run", confirmation)
        assert status == 303, body
        row = await finished_action(database_url, int(response.headers["Location"][16:]))
        assert (row["acted"], row["refused"]) == (0, 2)
        assert all("--to" in r["reason"] for r in json.loads(row["refusals"])), row["refusals"]
        assert await retries_of(database_url, dev_retries) == {}

        # Named on the page (as `runs retry --to`): a release that is no lane is refused
        # before anything is confirmed.
        asked = {**form(listed, "/actions/preview"), "action": "retry"}
        status, body, _ = await op.post("/actions/preview", {**asked, "to": "rel-nowhere"})
        assert (status, "not a registered lane" in body, "/actions/run" in body) == (
            200,
            True,
            False,
        )
        # A release named: a worktree's runs never go to a release (the lane boundary),
        # each refused in the preview, nothing to confirm.
        status, body, _ = await op.post("/actions/preview", {**asked, "to": A})
        assert status == 200, body
        assert "never goes to release lane" in body, body
        assert "/actions/run" not in body, body
        assert await retries_of(database_url, dev_retries) == {}

        # A's retries fail too; retried to A by name. A confirmation edited to another
        # target than its preview showed does nothing.
        a_retries = [first.run_id, *(retried[r][0] for r in on_a[1:])]
        await all_failed(database_url, a_retries)
        listed = await op.get(f"/runs?status=failed&release={A}")
        asked = {**form(listed, "/actions/preview"), "action": "retry", "to": A}
        status, body, _ = await op.post("/actions/preview", asked)
        assert targets(body) == {A: 3}, body
        edited = {**form(body, "/actions/run"), "to": ""}
        status, refused, _ = await op.post("/actions/run", edited)
        assert (status, "another action, filter or target release" in refused) == (409, True)
        status, body, response = await op.post("/actions/run", form(body, "/actions/run"))
        assert status == 303, body
        row = await finished_action(database_url, int(response.headers["Location"][16:]))
        assert (row["target"], row["acted"]) == (A, 3)
        assert {r: v[1] for r, v in (await retries_of(database_url, a_retries)).items()} == (
            dict.fromkeys(a_retries, A)
        )
