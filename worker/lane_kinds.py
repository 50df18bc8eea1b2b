"""The boundary between release lanes and dev lanes, and what refusing to cross it says.

A release lane is a deploy's (``DEEPLINE_RUNTIME_DEPLOY_VERSION``); a dev lane a
worktree's or a preview's (release id ``dev`` or ``dev-<suffix>``). A release id and a
worktree suffix can name one queue (release ``foo`` and suffix ``foo``: ``runs_foo``),
so the store keeps every spelling a worker registered for a lane and judges a lane dev
when any of them is (``lane_is_dev``, migration 0035). These helpers say the same in
Python: a lane that holds spellings of both kinds (only older builds made one) is dev
and mixed, and no run, worker or operator crosses from one kind to the other.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.lanes import DEV_RELEASE_ID, DEV_RELEASE_PREFIX, QUEUE_SUFFIX_ENV


def is_dev(release_id: str | None) -> bool:
    """Tell whether a release id names a dev lane, as the store's ``lane_is_dev`` does."""
    trimmed = (release_id or "").strip().lower()
    return trimmed == DEV_RELEASE_ID or trimmed.startswith(DEV_RELEASE_PREFIX)


def lane_is_dev(release_ids: Iterable[str]) -> bool:
    """Tell whether a lane with these registered spellings is a dev lane (any one is)."""
    return any(is_dev(r) for r in release_ids)


def is_mixed(release_ids: Iterable[str]) -> bool:
    """Tell whether a lane holds spellings of both kinds (an older build let them share it)."""
    ids = list(release_ids)
    return lane_is_dev(ids) and not all(is_dev(r) for r in ids)


def kind(release_id: str | None) -> str:
    """Name the kind of lane a release id belongs to, for a sentence."""
    return "dev" if is_dev(release_id) else "release"


def other_kind(release_ids: Iterable[str], release_id: str) -> list[str]:
    """The lane's spellings of the other kind than ``release_id``'s (what refuses it)."""
    return [r for r in release_ids if is_dev(r) != is_dev(release_id)]


def crossing(queue: str, release_id: str, release_ids: Iterable[str]) -> str:
    """Say that ``queue`` belongs to the other kind than ``release_id`` (a clause)."""
    others = ", ".join(repr(r) for r in other_kind(release_ids, release_id)) or "?"
    owner = "release" if is_dev(release_id) else "worktree lane"
    return (
        f"queue {queue} already belongs to {owner} {others}, and {release_id!r} is a "
        f"{kind(release_id)} id (a release's and a worktree's workers would run each "
        "other's runs)"
    )


def remedy(release_id: str) -> str:
    """What to do instead of crossing (a clause)."""
    if is_dev(release_id):
        return f"set another {QUEUE_SUFFIX_ENV} for this worktree"
    return "deploy this release under another release id"


def registration_refused(queue: str, release_id: str, release_ids: Iterable[str]) -> str:
    """Say, in one sentence, why a worker of ``release_id`` may not register ``queue``."""
    return (
        f"{crossing(queue, release_id, release_ids)}, so this worker will not start; "
        f"{remedy(release_id)}."
    )


def target_refused(run_release_id: str, queue: str, target_ids: Iterable[str]) -> str:
    """Why a run stamped ``run_release_id`` may not go to lane ``queue``, or ''.

    A release's run never goes to a dev lane (a worktree's code), a dev lane's run
    never to a release lane, and nothing to a mixed lane (release and worktree
    workers both claim there).
    """
    ids = list(target_ids)
    if is_mixed(ids):
        return (
            f"lane {queue} is mixed (release {', '.join(repr(r) for r in ids if not is_dev(r))} "
            f"and worktree {', '.join(repr(r) for r in ids if is_dev(r))} registered it), so "
            "no run is sent there"
        )
    if not ids or lane_is_dev(ids) == is_dev(run_release_id):
        return ""
    if is_dev(run_release_id):
        return (
            f"a run of dev lane {run_release_id!r} never goes to release lane {queue} "
            f"({ids[0]!r}): a worktree's run is not run on a release's code"
        )
    return (
        f"a run of release {run_release_id!r} never goes to dev lane {queue} ({ids[0]!r}): "
        "a release's run is not run on a worktree's code"
    )
