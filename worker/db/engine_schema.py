"""The Absurd engine's schema: its version, its install or upgrade, and lane-worker's contracts.

The engine schema is not written here: it is ``absurdctl.BUNDLED_SCHEMA_SQL``
(and absurdctl's bundled migrations to upgrade an older one). lane-worker's
own engine-side objects, in schema ``lane_worker``, are *contracts*: one
``sql/engine/<name>_v<N>.sql`` file each, every object in it named with that
``_v<N>``, listed in ``CONTRACTS``. Builds of different ages share one
database, so an install creates a contract that is missing and replaces one
only when no newer lane-worker version installed it (``lane_worker.contracts``
records who did); it never touches another contract's objects, an older
build's unversioned ones included (docs/DESIGN.md "Builds side by side").
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import absurdctl

from worker.db import engine_functions
from worker.db.pool import Connection
from worker.db.sql import engine_query, sql_text
from worker.errors import EngineSchemaError
from worker.version import VERSION

# This build's engine-side contracts, each one file of sql/engine/ (its name,
# without .sql, is the contract's name in lane_worker.contracts). A new file
# joins with one line here. A contract whose meaning changes is a new file with
# the next _v<N>, beside the old one: older builds keep calling theirs.
CONTRACTS: tuple[str, ...] = (
    "claim_v1",
    "claim_v2",
    "notify_v1",
    "spawn_v1",
    "writes_v1",
)

ENGINE_SCHEMA_VERSION: str = absurdctl.ABSURD_SCHEMA_TARGET_VERSION
# pg_advisory_xact_lock key shared by every lane-worker install step ("lwschema").
_INSTALL_LOCK_KEY = 0x6C77_7363_6865_6D61


def _version_key(version: str) -> tuple[Any, ...]:
    key: tuple[Any, ...] = absurdctl.version_sort_key(version)
    return key


def lane_worker_version_key(version: str) -> tuple[int, ...]:
    """Return a lane-worker version's order: its leading numbers (``0.2.0`` -> ``(0, 2, 0)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("-")[0]))


async def installed_engine_version(conn: Connection) -> str | None:
    """Return the engine schema version in the database, or None when it is not installed."""
    if not await conn.fetchval(engine_query("schema_version_present")):
        return None
    version: str = await conn.fetchval(engine_query("schema_version"))
    return version


def _refuse_newer(version: str) -> None:
    if _version_key(version) > _version_key(ENGINE_SCHEMA_VERSION):
        raise EngineSchemaError(
            f"the database holds Absurd engine schema {version}, newer than "
            f"{ENGINE_SCHEMA_VERSION} which this build knows; deploy a lane-worker built "
            "against the newer schema.",
            found=version,
            expected=ENGINE_SCHEMA_VERSION,
        )


async def engine_schema_current(conn: Connection) -> bool:
    """Tell whether the engine schema is installed at this build's version; change nothing.

    Raises ``EngineSchemaError`` when it is newer than this build knows.
    """
    version = await installed_engine_version(conn)
    if not version_current(version):
        return False
    # This build's contracts come with the engine install (migrate), by any build
    # of a lane-worker version that ships them.
    if not await conn.fetchval(engine_query("contracts_table_present")):
        return False
    present: int = await conn.fetchval(engine_query("contracts_present"), list(CONTRACTS))
    return present == len(CONTRACTS)


def version_current(version: str | None) -> bool:
    """Tell whether engine schema ``version`` (None: not installed) is this build's;
    raise ``EngineSchemaError`` when it is newer."""
    if version is None:
        return False
    _refuse_newer(version)
    return version == ENGINE_SCHEMA_VERSION


async def _upgrade(conn: Connection, version: str, *, replace_foreign: bool) -> list[str]:
    _refuse_newer(version)
    steps = absurdctl.resolve_migration_path(
        version, ENGINE_SCHEMA_VERSION, absurdctl.discover_bundled_migrations()
    )
    if steps is None:
        raise EngineSchemaError(
            f"no migration path from Absurd engine schema {version} to "
            f"{ENGINE_SCHEMA_VERSION}; upgrade the schema with absurdctl first.",
            found=version,
            expected=ENGINE_SCHEMA_VERSION,
        )
    # Never a silent replacement of a function another system patched.
    replaced = await engine_functions.check_upgrade(conn, version, steps, replace=replace_foreign)
    for step in steps:
        await conn.execute(absurdctl.get_migration_sql(step))
    return replaced


async def ensure_engine_schema(conn: Connection, *, replace_foreign: bool = False) -> str:
    """Install or upgrade the engine schema and the continuation claim; return what was done.

    Safe when many workers boot at once: one transaction-scoped advisory lock
    (it survives PgBouncer transaction pooling) serialises the check and the install.
    An upgrade that would replace an engine function another system patched
    raises ``EngineSchemaError`` unless ``replace_foreign`` (``engine_functions``).
    """
    async with conn.transaction():
        await conn.execute(engine_query("install_lock"), _INSTALL_LOCK_KEY)
        version = await installed_engine_version(conn)
        if version is None:
            await engine_functions.refuse_partial_engine(conn)
            await conn.execute(absurdctl.BUNDLED_SCHEMA_SQL)
            outcome = f"installed {ENGINE_SCHEMA_VERSION}"
        elif version != ENGINE_SCHEMA_VERSION:
            replaced = await _upgrade(conn, version, replace_foreign=replace_foreign)
            outcome = f"upgraded {version} -> {ENGINE_SCHEMA_VERSION}"
            if replaced:
                outcome += f" (replaced {', '.join(f'absurd.{n}' for n in replaced)}, as asked)"
        else:
            outcome = "current"
            patched = await engine_functions.differing(conn, version)
            if patched:
                names = ", ".join(f"absurd.{n}" for n in patched)
                outcome += f" ({names} differ from Absurd {version}'s own: left as they are)"
        await conn.execute(engine_query("contracts_table"))
        for contract in CONTRACTS:
            await _install_contract(conn, contract)
    return outcome


def contract_sql(contract: str) -> str:
    """Return contract ``contract``'s SQL (``sql/engine/<contract>.sql``)."""
    return sql_text("engine", f"{contract}.sql")


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def _install_contract(conn: Connection, contract: str) -> None:
    """Create contract ``contract``, or replace its bodies unless a newer version installed it.

    Equal versions with other text replace too (a fix within a version); the
    same text is left alone, so a boot costs no DDL.
    """
    text = contract_sql(contract)
    checksum = _checksum(text)
    row = await conn.fetchrow(engine_query("contract_installed"), contract)
    if row is not None:
        theirs = lane_worker_version_key(row["installed_by"])
        mine = lane_worker_version_key(VERSION)
        if theirs > mine or (theirs == mine and row["checksum"] == checksum):
            return
    await conn.execute(text)
    await conn.execute(engine_query("record_contract"), contract, VERSION, checksum)
