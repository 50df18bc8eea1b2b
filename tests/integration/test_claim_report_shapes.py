"""A live worker whose claim report has a shape this build cannot read (review F4, defect 4).

Rows are written straight to the workers table (with this build's version: a build
that writes no version reports no claim health), as a newer build or a hand edit
could: every operator view still answers, each such worker shows as not
claiming with the reason, and a healthy worker beside them as claiming.
"""

from __future__ import annotations

import json

from support.cli import lane_worker
from support.db import execute
from support.runtime import SCHEMA, open_client
from worker.version import VERSION

DEEP = "[" * 3000 + "1" + "]" * 3000

CLAIM_REPORTS = ('"x"', "[1,2]", '{"a":1}', '[{"since":"garbage"}]', DEEP)


async def test_a_worker_with_a_claim_report_of_another_shape_shows_as_not_claiming_alone(
    database_url: str,
) -> None:
    """One worker row per odd report beside a healthy one: every view answers (defect 4)."""
    release = "claim-report-shapes-1"
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release}) as client:
        await client.submit("plain", {})
    queue = "runs_claim_report_shapes_1"
    await execute(
        database_url,
        f"insert into {SCHEMA}.releases (queue, status, release_ids)"
        " values ($1, 'claiming', array[$2])",
        queue, release,
    )  # fmt: skip
    reports: tuple[str | None, ...] = (None, *CLAIM_REPORTS)
    for n, report in enumerate(reports):
        await execute(
            database_url,
            f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid,"
            " concurrency, plays, claim_failures, version)"
            " values ($1, $2, $3, 'h', 1, 1, '{plain}', $4::text::jsonb, $5)",
            f"w{n}", release, queue, report, VERSION,
        )  # fmt: skip
    listed = await lane_worker(database_url, "lanes", "--json")
    assert listed.returncode == 0, listed.stderr
    lane = next(v for v in json.loads(listed.stdout)["lanes"] if v["releaseId"] == release)
    workers = {w["workerId"]: w for w in lane["workers"]}
    assert workers["w0"]["claiming"] is True
    for n in range(1, len(reports)):
        assert workers[f"w{n}"]["claiming"] is False, reports[n]
    reasons = [w["notClaiming"][0]["reason"] for n, w in sorted(workers.items()) if n != "w0"]
    assert all(r.startswith("unreadable claim report") for r in reasons[:3]), reasons
    assert reasons[3] is None  # a readable entry: a loop failing since a time it cannot read
    assert reasons[4].startswith("unreadable claim report: the report cannot be read back")
    for argv in (("lanes",), ("lanes", "show", release)):
        text = await lane_worker(database_url, *argv)
        assert text.returncode == 0, text.stderr
        assert "unreadable claim report" in text.stdout
