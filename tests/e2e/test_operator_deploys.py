"""The deploy timeline (`/deploys`) from a real daemon, as headless Chromium renders it.

A deployed, its machine up; B deployed, its machine up; A superseded and retired;
A's machine destroyed; a rollback to A. Each release's section lists those moments
in order, with its role, its live machines and its state now.
"""

from __future__ import annotations

from pathlib import Path

from support.daemon import Daemons
from support.page import Fields, dump_dom, screenshot
from support.runtime import open_client

A, B = "tl-a", "tl-b"


class Timeline(Fields):
    """The page's marked elements, with each release's section and each moment."""

    MARKS = (*Fields.MARKS, "data-release", "data-moment")


def sections(html: str) -> dict[str, dict[str, object]]:
    """Each release's section: its role, machines, state and its moments' kinds in order."""
    found: dict[str, dict[str, object]] = {}
    current: dict[str, object] | None = None
    parser = Timeline()
    parser.feed(html)
    for field, attrs, text in parser.found:
        if field == "data-release":
            current = found.setdefault(str(attrs["data-release"]), {"moments": []})
        elif current is None:
            continue
        elif field in ("role", "machines", "state"):
            current[field] = "".join(text).strip()
        elif field == "data-moment":
            moments = current["moments"]
            assert isinstance(moments, list)
            moments.append(attrs["data-moment"])
    return found


async def test_the_timeline_tells_each_release_s_life(database_url: str, tmp_path: Path) -> None:
    async with Daemons(database_url) as pool, open_client(database_url, {}) as client:
        await client.releases.deploy(A, image="img:a", machines=1)
        daemon_a = pool.start(A, LANE_WORKER_MACHINE_ID="m-a1")
        await daemon_a.ready()
        await client.releases.deploy(B, image="img:b", machines=1)
        daemon_b = pool.start(B, LANE_WORKER_MACHINE_ID="m-b1")
        await daemon_b.ready()
        retired = await client.db.run(
            lambda c: client.store.registry.retire_superseded(c, actor="scaler-test")
        )
        assert retired == [A]
        await client.db.run(
            lambda c: client.store.registry.record(
                c,
                release_id=A,
                action="machine_destroy",
                actor="scaler-test",
                detail={"machine": "m-a0", "reason": "drained"},
            )
        )
        await client.releases.rollback(A)

        url = f"http://127.0.0.1:{daemon_b.health_port}/deploys"
        shown = sections(dump_dom(url))
        print("screenshot:", screenshot(url, tmp_path, "deploys"))
        assert list(shown)[:2] == [A, B]  # newest deploy first: the rollback redeployed A
        a, b = shown[A], shown[B]
        assert (a["role"], b["role"]) == ("current", "previous")
        assert (a["machines"], b["machines"]) == ("m-a1", "m-b1")
        assert a["state"] == b["state"] == "claiming"
        assert a["moments"] == [
            "deployed", "registered", "superseded", "retired", "machine_destroy", "rolled_back"
        ]  # fmt: skip
        assert b["moments"] == ["deployed", "registered", "superseded"]
