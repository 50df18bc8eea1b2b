"""The boot's warning when a deployed worker or app connects with broad rights (issue 33).

A worker or an app of a deployed release (a release lane, not ``dev``/``dev-...``:
``DEEPLINE_RUNTIME_DEPLOY_VERSION`` set, no queue suffix) that connects as a
superuser or as the store's owner (or a member with its rights) works, but
holds what its job does not need: every run's input, the runtime API tokens,
DDL. One structured warning (``db.role_broad``) per process names what it
connects as and the role to use (``lane-worker roles``); never an error, and
never for a dev lane (a laptop, a test, a worktree), whatever role it uses.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

from worker import lane_kinds
from worker.db.pool import Connection

log = structlog.get_logger("lane_worker.db")
# An app's process (LaneClient in the user's code) has its own logging: the standard
# library's, which without set-up writes a warning to stderr. structlog unconfigured
# would print to stdout, mixed into what the app prints (a script's JSON).
app_log = logging.getLogger("lane_worker.db")

_warned = False  # once per process: a client per request must not repeat it

_BROAD = """
select r.rolname::text as role, r.rolsuper as superuser,
       coalesce(pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE'), false) as owner
  from pg_catalog.pg_roles r
  left join pg_catalog.pg_namespace n on n.nspname = $1
 where r.rolname = current_user
"""


def is_deployed(release_id: str) -> bool:
    """Tell whether ``release_id`` is a deployed release's (not a dev lane's)."""
    return not lane_kinds.is_dev(release_id)


async def warn_if_broad(conn: Connection, store_schema: str, *, part: str, release_id: str) -> bool:
    """Log ``db.role_broad`` once per process when a deployed ``part`` connects broadly.

    ``part``: ``worker`` or ``app``, the job whose role it should connect as.
    Returns whether the warning was logged by this call.
    """
    global _warned
    if _warned or not is_deployed(release_id):
        return False
    row = await conn.fetchrow(_BROAD, store_schema)
    _warned = True
    if row is None or not (row["superuser"] or row["owner"]):
        return False
    hint = (
        f"connect the {part} as a login member of the lane_worker_{part} role "
        "(`lane-worker roles --apply`, as the owner): it needs neither DDL nor "
        "the runs' inputs and tokens it can read now."
    )
    if part == "app":
        kind = "a superuser" if row["superuser"] else "the store's owner"
        app_log.warning(
            "db.role_broad: lane-worker's client connects as %s (role %s) for release %s; %s",
            kind, row["role"], release_id, hint,
        )  # fmt: skip
        return True
    log.warning(
        "db.role_broad",
        part=part,
        role=row["role"],
        superuser=row["superuser"],
        store_owner=row["owner"],
        store_schema=store_schema,
        release_id=release_id,
        hint=hint,
    )
    return True


async def may_drop_queues(conn: Connection) -> bool:
    """Tell whether the connecting role may drop the engine's queues (has its owner's rights).

    A worker's own role (``lane-worker roles``) may not: a lane's engine tables are
    the owner's, made for it by ``prepare_lane_queue``.
    """
    return bool(
        await conn.fetchval(
            "select coalesce(pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE'), false)"
            " from pg_catalog.pg_namespace n where n.nspname = 'absurd'"
        )
    )


# What `doctor --connect` says of the role a URL connects as: the role, whether it
# is a superuser or has the store owner's rights, and the job templates
# (`lane-worker roles`: NOLOGIN `<prefix>_<job>`) it is a member of.
_DESCRIBE = """
select r.rolname::text as role, r.rolsuper as superuser,
       coalesce(pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE'), false) as owner,
       coalesce((select pg_catalog.array_agg(t.rolname::text order by t.rolname)
                   from pg_catalog.pg_roles t
                  where not t.rolcanlogin and t.oid <> r.oid
                    and t.rolname ~ '_(app|viewer|scaler|worker|migrator)$'
                    and pg_catalog.pg_has_role(current_user, t.oid, 'MEMBER')), '{}') as jobs
  from pg_catalog.pg_roles r
  left join pg_catalog.pg_namespace n on n.nspname = $1
 where r.rolname = current_user
"""


async def describe(conn: Connection, store_schema: str, part: str) -> dict[str, Any]:
    """Say which role ``conn`` connects as and whether it is broad for ``part``."""
    row = await conn.fetchrow(_DESCRIBE, store_schema)
    assert row is not None  # current_user is always a role
    broad = bool(row["superuser"] or row["owner"])
    jobs = list(row["jobs"])
    fits = any(job.endswith(f"_{part}") for job in jobs)
    if row["superuser"]:
        said = f"a superuser: broad for the {part}, which should connect as <prefix>_{part}"
    elif row["owner"]:
        said = f"the store's owner: broad for the {part}, which should connect as <prefix>_{part}"
    elif fits:
        said = f"the {part}'s own role: not broad"
    else:
        said = f"not broad, but no member of a <prefix>_{part} role: the {part} may be refused"
    return {
        "role": row["role"],
        "superuser": row["superuser"],
        "storeOwner": row["owner"],
        "memberOf": jobs,
        "part": part,
        "broad": broad,
        "said": said,
    }
