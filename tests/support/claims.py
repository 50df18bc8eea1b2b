"""Break the claim function a claim loop calls, as an older build's install did, and restore it.

The function is found by name in the claim loop's own query (``claim_next`` in
``worker/sql/engine/queries.sql``), so a rename of it moves the breakage along.
"""

from __future__ import annotations

import re
from typing import Any

from worker.db.sql import engine_query

BROKEN_REASON = "unknown claim mode all"  # what an older build's claim_lane raised (issue 29)


def claim_function() -> str:
    """Return the schema-qualified name of the function a loop's claim calls."""
    # `select * from <schema>.<function>(...)`: whatever schema a versioned build puts it in.
    found = re.search(r"from\s+([A-Za-z_]\w*\.\w+)\s*\(", engine_query("claim_next"))
    assert found, "the claim query calls no schema-qualified function"
    return found[1]


async def break_claims(conn: Any, reason: str = BROKEN_REASON) -> list[str]:
    """Replace every overload of the claim function with one that raises; return the originals."""
    schema, name = claim_function().split(".")
    originals: list[str] = [
        r["def"]
        for r in await conn.fetch(
            "select pg_get_functiondef(p.oid) as def from pg_proc p join pg_namespace n"
            " on n.oid = p.pronamespace where n.nspname = $1 and p.proname = $2",
            schema,
            name,
        )
    ]
    assert originals, f"no function {schema}.{name}"
    quoted = reason.replace("'", "''")
    for definition in originals:
        header = definition.split("\n LANGUAGE ")[0]
        await conn.execute(
            f"{header}\n LANGUAGE plpgsql\nAS $broken$ begin raise exception '{quoted}'; end"
            " $broken$"
        )
    return originals


async def restore_claims(conn: Any, originals: list[str]) -> None:
    """Put back the claim function ``break_claims`` replaced."""
    for definition in originals:
        await conn.execute(definition)
