"""SQL text: loaded once from the ``.sql`` files, with the one identifier helper.

Values are always bound parameters. The only text substituted into SQL is an
identifier, by ``fill``: ``{schema}`` (the run-state store's schema) and a
queue's engine tables ``{tasks}``, ``{runs}``, ``{checkpoints}`` and ``{waits}``, each quoted
by ``quote_ident``.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

_QUERY_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_QUEUE_TABLES = (("tasks", "t"), ("runs", "r"), ("checkpoints", "c"), ("waits", "w"))
_PLACEHOLDER = re.compile(r"\{(schema|tasks|runs|checkpoints|waits)\}")


def quote_ident(name: str) -> str:
    """Quote a Postgres identifier (the one place lane-worker builds identifiers by hand)."""
    if not name or "\x00" in name:
        raise ValueError(f"not a usable identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def engine_table(kind: str, queue: str) -> str:
    """Return the quoted engine table ``kind`` (t, r, c or w: tasks, runs, checkpoints, waits)."""
    return f"absurd.{quote_ident(f'{kind}_{queue}')}"


def fill(body: str, *, schema: str | None = None, queue: str | None = None) -> str:
    """Fill the identifiers of ``body``: ``{schema}``, and ``queue``'s engine tables.

    The one identifier helper: pass raw names, quoted here. A placeholder with
    no name given is left as it is (``query`` refuses such text).
    """
    if schema is not None:
        body = body.replace("{schema}", quote_ident(schema))
    if queue is not None:
        for placeholder, kind in _QUEUE_TABLES:
            body = body.replace("{" + placeholder + "}", engine_table(kind, queue))
    return body


def sql_files(folder: str) -> Any:
    """Return the packaged folder of ``.sql`` files (``store`` or ``engine``)."""
    return resources.files("worker.sql").joinpath(folder)


@cache
def sql_text(folder: str, file: str) -> str:
    """Return one packaged ``.sql`` file's text (read once)."""
    text: str = sql_files(folder).joinpath(file).read_text(encoding="utf-8")
    return text


@cache
def _named(folder: str, file: str) -> dict[str, str]:
    parts = _QUERY_HEADER.split(sql_text(folder, file))
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def named_queries(folder: str, file: str, *, schema: str | None = None) -> dict[str, str]:
    """Return every named query of ``folder/file`` with ``{schema}`` filled in.

    A queue's table placeholders stay: such a query is read with ``query``.
    """
    return {name: fill(body, schema=schema) for name, body in _named(folder, file).items()}


@cache
def query(
    folder: str, file: str, name: str, *, schema: str | None = None, queue: str | None = None
) -> str:
    """Return named query ``name`` of ``folder/file``, its identifiers filled (cached)."""
    body = fill(_named(folder, file)[name], schema=schema, queue=queue)
    missing = _PLACEHOLDER.search(body)
    if missing is not None:
        raise ValueError(f"query {name} needs the identifier {missing[0]}")
    return body


def engine_query(name: str, *, queue: str | None = None, schema: str | None = None) -> str:
    """Return engine query ``name`` (``sql/engine/queries.sql``), on ``queue``'s tables."""
    return query("engine", "queries.sql", name, schema=schema, queue=queue)
