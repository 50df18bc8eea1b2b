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
from worker.masking import mask_value
from worker.ops.releases import boot_failed_short
from worker.scaler.observe import BootFailed


def boot_word(failed: BootFailed, secrets: Sequence[str]) -> dict[str, Any]:
    """The scaler's word on the failure, its last line masked, with a one-line reason."""
    said: dict[str, Any] = mask_value(failed.as_json(), tuple(secrets))
    return {**said, "reason": boot_failed_short(said)}


async def record_boot_failed(
    db: Database, store: Store, release_id: str, deployed_at: str, word: dict[str, Any]
) -> None:
    """Record ``word`` on the release's row, for the deploy of ``deployed_at`` only."""
    at = datetime.fromisoformat(deployed_at) if deployed_at else None
    if at is None:
        return
    await db.run(
        lambda c: store.registry.boot_failed(c, release_id=release_id, failed=word, deployed_at=at)
    )


async def clear_boot_failed(db: Database, store: Store, release_id: str) -> None:
    """Forget any record of the release's machines failing to boot."""
    await db.run(lambda c: store.registry.boot_failed(c, release_id=release_id, failed=None))
