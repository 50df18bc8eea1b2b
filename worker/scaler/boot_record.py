"""The scaler's record of a release whose machines cannot boot (store migration 0047).

Kept on the release's registry row (``deployments.boot_failed``) for the deploy it
counts for, so a submit to that release's lane (``lane_served``) says it is not
served instead of promising a worker that never registers. Set with the judgement
``releases deploy --wait`` uses (``BOOT_FAILS_FINAL`` machines in a row exiting the
same ``BOOT_CONFIG_EXITS`` code); cleared when a machine of the release is ready, a
worker of its lane is live, or a machine exits with another code.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from worker.db.pool import Database
from worker.db.store import Store
from worker.db.store.rows import Deployment
from worker.masking import mask_value
from worker.ops.releases import boot_failed_short
from worker.scaler.observe import BootFailed


def boot_word(failed: BootFailed, secrets: Sequence[str]) -> dict[str, Any]:
    """The scaler's word on the failure, its last line masked, with a one-line reason."""
    said: dict[str, Any] = mask_value(failed.as_json(), tuple(secrets))
    return {**said, "reason": boot_failed_short(said)}


async def record_boot_failed(
    db: Database, store: Store, release_id: str, failed: BootFailed, secrets: Sequence[str]
) -> dict[str, Any]:
    """Record the failure on the release's row, for the deploy it counted only; return the
    word recorded (``boot_word``)."""
    word = boot_word(failed, secrets)
    at = datetime.fromisoformat(failed.deployed_at) if failed.deployed_at else None
    if at is not None:
        await db.run(
            lambda c: store.registry.boot_failed(
                c, release_id=release_id, failed=word, deployed_at=at
            )
        )
    return word


async def clear_boot_failed(db: Database, store: Store, release_id: str) -> None:
    """Forget any record of the release's machines failing to boot."""
    await db.run(lambda c: store.registry.boot_failed(c, release_id=release_id, failed=None))


async def clear_booted(db: Database, store: Store, deployments: Sequence[Deployment]) -> None:
    """Forget the boot failure of each deployment a live worker of its lane shows booting."""
    for d in deployments:
        if d.boot_failed is not None and d.live_workers:
            await clear_boot_failed(db, store, d.release_id)
