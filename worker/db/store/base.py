"""What every group of store queries shares: the schema's queries and how to run one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import asyncpg

from worker.db.pool import Connection
from worker.db.sql import named_queries, query, quote_ident
from worker.db.store.rows import row_of

R = TypeVar("R")


class Queries:
    """A group of named store queries (one file of ``sql/store``), bound to one store schema."""

    FILE: ClassVar[str]

    def __init__(self, schema: str) -> None:
        self._schema = schema
        self._q = named_queries("store", self.FILE, schema=schema)

    @property
    def sql(self) -> Mapping[str, str]:
        """The group's queries by name, ``{schema}`` filled in."""
        return self._q

    def _on_queue(self, name: str, queue: str) -> str:
        """Return query ``name`` with ``queue``'s engine tables filled in (cached)."""
        return query("store", self.FILE, name, schema=self._schema, queue=queue)

    async def _payloads_readable(self, conn: Connection) -> bool:
        """Whether the connecting role may read runs' payloads (the viewer's may not: issue 33)."""
        runs = f"{quote_ident(self._schema)}.runs"
        return bool(
            await conn.fetchval(
                "select pg_catalog.has_column_privilege(current_user, $1, 'input', 'SELECT')", runs
            )
        )

    async def _row(self, conn: Connection, cls: type[R], name: str, *args: Any) -> R | None:
        record = await conn.fetchrow(self._q[name], *args)
        return None if record is None else row_of(cls, record)

    async def _rows(self, conn: Connection, cls: type[R], name: str, *args: Any) -> list[R]:
        return [row_of(cls, r) for r in await conn.fetch(self._q[name], *args)]

    async def _records(self, conn: Connection, name: str, *args: Any) -> list[asyncpg.Record]:
        return await conn.fetch(self._q[name], *args)

    async def _value(self, conn: Connection, name: str, *args: Any) -> Any:
        return await conn.fetchval(self._q[name], *args)

    async def _run(self, conn: Connection, name: str, *args: Any) -> None:
        await conn.execute(self._q[name], *args)
