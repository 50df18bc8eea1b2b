"""Break the functions a claim loop calls, as an older build's install did, and restore them.

The function the claims fall back to is found by name in their query
(``claim_next`` in ``worker/sql/engine/queries.sql``), so a rename of it moves
the breakage along. The loops' static statements (the own loop's
``sql/engine/own_claim.sql``, a continuation loop's ``adopt_claim.sql``) call no
contract function an older build could replace; they fail here through the
engine clock each reads first, ``absurd.current_time``.
"""

from __future__ import annotations

import re
from typing import Any

from worker.db.sql import engine_query, query

BROKEN_REASON = "unknown claim mode all"  # what an older build's claim_lane raised (issue 29)


def claim_function() -> str:
    """Return the schema-qualified name of the function the continuation loops' claim calls."""
    # `select * from <schema>.<function>(...)`: whatever schema a versioned build puts it in.
    found = re.search(r"from\s+([A-Za-z_]\w*\.\w+)\s*\(", engine_query("claim_next"))
    assert found, "the claim query calls no schema-qualified function"
    return found[1]


STATIC_CLAIMS = (("own_claim.sql", "own_claim"), ("adopt_claim.sql", "adopt_claim"))


def static_claim_opening() -> str:
    """Return how the loops' static claim statements begin (their one first line)."""
    openings = set()
    for file, name in STATIC_CLAIMS:
        text = query("engine", file, name, schema="s", queue="q")
        assert "absurd.current_time()" in text.split("\n", 2)[1], f"{name} reads the clock first"
        openings.add(text.splitlines()[0])
    (first,) = openings  # one opening: the broken clock matches every static claim
    return first


async def break_claims(conn: Any, reason: str = BROKEN_REASON) -> list[str]:
    """Make every claim fail with ``reason``; return what ``restore_claims`` puts back.

    The claim function the loops fall back to is replaced with one that raises.
    The static statements call no contract function; the engine clock they read
    first raises instead, only inside them (submits still work).
    """
    schema, name = claim_function().split(".")
    originals: list[str] = [
        r["def"]
        for r in await conn.fetch(
            "select pg_get_functiondef(p.oid) as def from pg_proc p join pg_namespace n"
            " on n.oid = p.pronamespace where n.nspname = $1 and p.proname = $2"
            "  or (n.nspname = 'absurd' and p.proname = 'current_time')",
            schema,
            name,
        )
    ]
    assert len(originals) >= 2, f"no function {schema}.{name} or absurd.current_time"
    quoted = reason.replace("'", "''")
    for definition in originals:
        header = definition.split("\n LANGUAGE ")[0]
        if "current_time" in header:  # pg_get_functiondef quotes the keyword
            opening = static_claim_opening().replace("'", "''")
            body = (
                f"begin if position('{opening}' in current_query()) > 0 then"
                f" raise exception '{quoted}'; end if;"
                " if nullif(trim(current_setting('absurd.fake_now', true)), '') is not null then"
                " return current_setting('absurd.fake_now')::timestamptz; end if;"
                " return clock_timestamp(); end"
            )
        else:
            body = f"begin raise exception '{quoted}'; end"
        await conn.execute(f"{header}\n LANGUAGE plpgsql\nAS $broken$ {body} $broken$")
    return originals


async def restore_claims(conn: Any, originals: list[str]) -> None:
    """Put back the functions ``break_claims`` replaced."""
    for definition in originals:
        await conn.execute(definition)
