"""The engine's own functions as found: stock Absurd, or patched by another system.

The TypeScript app installs a vendored Absurd whose ``absurd.claim_task`` is
patched (its continuation fence), in the same database. An engine upgrade
(absurdctl's migrations) replaces functions with ``create or replace``, so
before one runs, each function it would replace is compared with Absurd's own
body at the installed version (``pg_proc.prosrc`` holds a body exactly as it was
written; the stock bodies come from absurdctl's bundled schema and migrations).
A function that differs was installed by someone else: the upgrade refuses,
naming it, unless the operator asked for the replacement
(``lane-worker migrate --replace-engine-functions``).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import absurdctl

from worker.db.pool import Connection
from worker.errors import EngineSchemaError

REPLACE_FLAG = "--replace-engine-functions"
_VERSION_FN = "get_schema_version"
_FUNCTION = re.compile(
    r"create\s+(?:or\s+replace\s+)?function\s+absurd\.(\w+)\s*\(.*?\bas\s+\$\$(.*?)\$\$",
    re.IGNORECASE | re.DOTALL,
)
_INSTALLED = """
select p.proname as name, p.prosrc as body
  from pg_proc p join pg_namespace n on n.oid = p.pronamespace
 where n.nspname = 'absurd' and p.proname = any($1::text[])
 order by p.proname, p.oid
"""


def _key(version: str) -> tuple[Any, ...]:
    key: tuple[Any, ...] = absurdctl.version_sort_key(version)
    return key


_COMMENT = re.compile(r"--[^\n]*")


def normal(body: str) -> str:
    """Return a function body without comments and with its whitespace collapsed."""
    # A stock install and a migration may lay out one body differently; a patch
    # changes what the body does.
    return " ".join(_COMMENT.sub(" ", body).split())


def bodies_in(sql: str) -> dict[str, frozenset[str]]:
    """Return the bodies ``sql`` gives each ``absurd`` function, by name (overloads together)."""
    found: dict[str, set[str]] = {}
    for name, body in _FUNCTION.findall(sql):
        found.setdefault(name, set()).add(normal(body))
    return {name: frozenset(bodies) for name, bodies in found.items()}


@cache
def stock_bodies(version: str) -> dict[str, frozenset[str]]:
    """Return Absurd's own function bodies at ``version``, for the functions they are known of.

    A function's body is the one the last bundled migration up to ``version``
    gave it; one no migration touched up to then has the bundled schema's body
    unless a later migration changes it (then it is unknown, and left out).
    """
    steps = sorted(absurdctl.discover_bundled_migrations().items(), key=lambda s: _key(s[0][1]))
    known: dict[str, frozenset[str]] = {}
    later: set[str] = set()
    for (_, to_version), step in steps:
        bodies = bodies_in(step["sql"])
        if _key(to_version) <= _key(version):
            known.update(bodies)
        else:
            later |= set(bodies)
    for name, shipped in bodies_in(absurdctl.BUNDLED_SCHEMA_SQL).items():
        if name not in known and name not in later:
            known[name] = shipped
    return known


async def differing(
    conn: Connection, version: str, names: frozenset[str] | None = None
) -> list[str]:
    """Name the engine functions (of ``names``; all by default) not as Absurd ships them."""
    stock = stock_bodies(version)
    wanted = sorted((set(stock) if names is None else names & set(stock)) - {_VERSION_FN})
    rows = await conn.fetch(_INSTALLED, wanted)
    return sorted({r["name"] for r in rows if normal(r["body"]) not in stock[r["name"]]})


async def check_upgrade(
    conn: Connection, version: str, steps: list[dict[str, Any]], *, replace: bool
) -> list[str]:
    """Refuse an upgrade from ``version`` that would replace a function Absurd did not ship.

    ``steps`` are absurdctl's migrations about to run. Return the functions it
    replaces that differ from Absurd's own (only when ``replace`` allows that).
    """
    # The version function is what an upgrade exists to replace; a body already
    # the target's is replaced by itself.
    replaced = frozenset(n for step in steps for n in bodies_in(step["sql"])) - {_VERSION_FN}
    target = set(await differing(conn, absurdctl.ABSURD_SCHEMA_TARGET_VERSION, replaced))
    foreign = [n for n in await differing(conn, version, replaced) if n in target]
    # Absurd's own body at `version` is unknown for a function only a later migration
    # touched (the bundle holds the newest body, the migrations only what they change):
    # one that is not already the target's cannot be shown to be stock, so it is not
    # replaced silently either (a review, 2026-12-07, saw a patched drop_queue of a
    # 0.3.0 engine replaced without a word).
    unverified = sorted((target & replaced) - set(stock_bodies(version)))
    if (foreign or unverified) and not replace:
        raise EngineSchemaError(
            f"the Absurd engine schema {version} in this database has "
            f"{_what_differs(version, foreign, unverified)}, and upgrading it to "
            f"{absurdctl.ABSURD_SCHEMA_TARGET_VERSION} would replace "
            f"{'it' if len(foreign) + len(unverified) == 1 else 'them'}: upgrade the engine "
            f"with the system's own migration that installed it, or run "
            f"`lane-worker migrate {REPLACE_FLAG}` to replace "
            f"{'it' if len(foreign) + len(unverified) == 1 else 'them'} anyway.",
            found=version,
            expected=absurdctl.ABSURD_SCHEMA_TARGET_VERSION,
        )
    return sorted([*foreign, *unverified])


def _what_differs(version: str, foreign: list[str], unverified: list[str]) -> str:
    parts = []
    if foreign:
        names = ", ".join(f"absurd.{n}" for n in foreign)
        parts.append(
            f"{names} differing from Absurd {version}'s own (another system, such as the "
            "TypeScript app's vendored Absurd, patched it)"
        )
    if unverified:
        names = ", ".join(f"absurd.{n}" for n in unverified)
        parts.append(
            f"{names}, which lane-worker cannot compare with Absurd {version}'s own (absurdctl "
            "ships only later bodies of it), not as the upgrade would leave it"
        )
    return " and ".join(parts)


async def refuse_partial_engine(conn: Connection) -> None:
    """Refuse a fresh install over an ``absurd`` schema that has functions but no version."""
    count: int = await conn.fetchval(
        "select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
        " where n.nspname = 'absurd'"
    )
    if count:
        raise EngineSchemaError(
            f"the database has a schema absurd with {count} function(s) but no "
            "absurd.get_schema_version(), so lane-worker cannot tell which engine it is and "
            "installs nothing over it: install Absurd there with absurdctl first.",
            found="unknown",
            expected=absurdctl.ABSURD_SCHEMA_TARGET_VERSION,
        )
