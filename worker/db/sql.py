"""SQL text: loaded once from the ``.sql`` files, with the one identifier helper.

Values are always bound parameters. The only text substituted into SQL is an
identifier (the store schema, an engine queue's table), quoted here.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

_QUERY_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def quote_ident(name: str) -> str:
    """Quote a Postgres identifier (the one place lane-worker builds identifiers by hand)."""
    if not name or "\x00" in name:
        raise ValueError(f"not a usable identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def engine_table(kind: str, queue: str) -> str:
    """Return the quoted engine table of ``queue``: ``t`` tasks, ``r`` runs, ``c`` checkpoints."""
    return f"absurd.{quote_ident(f'{kind}_{queue}')}"


def sql_files(folder: str) -> Any:
    """Return the packaged folder of ``.sql`` files (``store`` or ``engine``)."""
    return resources.files("worker.sql").joinpath(folder)


@cache
def _named(folder: str, file: str) -> dict[str, str]:
    text = sql_files(folder).joinpath(file).read_text(encoding="utf-8")
    parts = _QUERY_HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def named_queries(folder: str, file: str, **identifiers: str) -> dict[str, str]:
    """Return the named queries of ``folder/file`` with ``{name}`` identifiers filled in.

    Each identifier is quoted here; pass the raw name.
    """
    quoted = {key: quote_ident(value) for key, value in identifiers.items()}
    filled = {}
    for name, body in _named(folder, file).items():
        for key, value in quoted.items():
            body = body.replace("{" + key + "}", value)
        filled[name] = body
    return filled


@cache
def queue_query(name: str, queue: str, schema: str | None = None) -> str:
    """Return engine query ``name`` on ``queue``'s tables (and the store ``schema``)."""
    body = _named("engine", "queries.sql")[name]
    for kind, table in (("tasks", "t"), ("runs", "r"), ("checkpoints", "c")):
        body = body.replace("{" + kind + "}", engine_table(table, queue))
    if schema is not None:
        body = body.replace("{schema}", quote_ident(schema))
    return body
