"""Live workers of a deployed release on machines the backend does not list.

Such machines were started by another scaler (one with another ``--state-dir``, an
older scaler whose default folder was relative to where it ran, another Fly app):
this scaler cannot stop or replace them, and may start more beside them. They are
never destroyed or adopted here (they may be mid-step, and whose they are is not
known): the operator is told, once per release each time the set changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import structlog

from worker.db.store.rows import Deployment
from worker.scaler.backend import Machine

log = structlog.get_logger("lane_worker.scaler")


class Strangers:
    """Warns of live workers on unlisted machines; remembers what it said."""

    def __init__(self, backend: object) -> None:
        # What the backend reads: the process backend's state dir, the Fly app.
        state_dir, app = getattr(backend, "state_dir", None), getattr(backend, "app", None)
        self.where = (
            f"state dir {state_dir}" if state_dir is not None else f"app {app}" if app else "?"
        )
        self._known: set[str] = set()  # machines this process listed or created
        self._said: dict[str, frozenset[str]] = {}

    def reset(self) -> None:
        self._said.clear()

    def known(self, machine_ids: Iterable[str]) -> None:
        """Machines this scaler created or listed: one it destroyed may still beat a while."""
        self._known.update(machine_ids)

    def note(
        self, deployments: Sequence[Deployment], listing: Sequence[Machine], created: Iterable[str]
    ) -> None:
        """Warn of what changed; ``created``: machines created and not yet listed."""
        self.known(m.machine_id for m in listing)
        self.known(created)
        for d in deployments:
            unlisted = frozenset(set(d.live_machines) - self._known)
            if unlisted == self._said.get(d.release_id, frozenset()):
                continue
            self._said[d.release_id] = unlisted
            if not unlisted:
                continue
            log.warning(
                "scaler.unlisted_live_workers",
                release_id=d.release_id,
                machines=sorted(unlisted),
                where=self.where,
                message=(
                    f"release {d.release_id} has live workers on {len(unlisted)} machine(s) "
                    f"this scaler's backend does not list ({', '.join(sorted(unlisted))}; it "
                    f"reads {self.where}): another scaler (another --state-dir, another app) "
                    "may manage them; they are left alone, neither stopped nor adopted"
                ),
            )
