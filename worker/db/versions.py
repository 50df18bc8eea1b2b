"""Are both schemas current? Read as the connecting role may read them.

The owner and the worker's role read the engine's version and the store's
ledger of migrations themselves (``engine_schema_current``, ``Store.is_current``).
A role granted the SQL API only (the app's, issue 33) or the viewer's may read
neither: it asks ``schema_versions()`` (store migration 0043, with the owner's
rights), and the answer goes through the same checks. A store without that
function is older than this build: not current.
"""

from __future__ import annotations

import asyncpg

from worker.db import engine_schema
from worker.db import schema as store_schema
from worker.db.engine_schema import CONTRACTS
from worker.db.pool import Connection
from worker.db.store import Store
from worker.errors import SchemasMissingError


async def schemas_current(conn: Connection, store: Store) -> bool:
    """Tell whether the engine schema and ``store`` are at this build's versions.

    Raises ``EngineSchemaError`` / ``StoreSchemaError`` for a newer one this build
    cannot run against, and ``SchemasMissingError`` for a role that may read no
    version at all (not granted ``schema_versions``).
    """
    try:
        async with conn.transaction():  # a savepoint when the caller's is open
            return await engine_schema.engine_schema_current(conn) and await store.is_current(conn)
    except asyncpg.InsufficientPrivilegeError:
        pass  # the app's or the viewer's role: ask the owner's function
    try:
        async with conn.transaction():
            said = await store.api.schema_versions(conn)
    except asyncpg.UndefinedFunctionError:
        return False  # a store before 0043, so before this build
    except asyncpg.InsufficientPrivilegeError:
        raise SchemasMissingError(
            f"this database role may read neither lane-worker's schemas nor "
            f"{store.schema}.schema_versions(), so this build cannot check they are "
            "current: run `lane-worker roles --apply` (its roles are granted it) or "
            f"grant execute on function {store.schema_sql}.schema_versions() to this "
            "role, as the store's owner."
        ) from None
    applied = {int(m["version"]): (str(m["name"]), bool(m["compatible"])) for m in said["store"]}
    if not engine_schema.version_current(said["engine"]):
        return False
    if not set(CONTRACTS) <= set(said["contracts"]):
        return False
    return store_schema.current_among(store.schema, applied)


async def refuse_unless_current(
    conn: Connection, store: Store, *, may_not_migrate: bool = False
) -> None:
    """Raise ``SchemasMissingError`` naming ``lane-worker migrate`` unless both are current.

    ``may_not_migrate``: the caller tried to migrate and its role may not (the app's):
    the message says the owner must.
    """
    if await schemas_current(conn, store):
        return
    if may_not_migrate:
        raise SchemasMissingError(
            "this database role may not install or upgrade lane-worker's schemas, and the "
            f"engine schema or the run-state store {store.schema} is missing or not at this "
            "build's version: run `lane-worker migrate` as the schemas' owner first."
        )
    raise SchemasMissingError(
        f"the runtime database lacks lane-worker's schemas (engine schema, or the "
        f"run-state store {store.schema}), or holds older ones; run "
        "`lane-worker migrate` first."
    )
