"""The SQL files and the one identifier helper: what gets filled into SQL text, and how."""

from __future__ import annotations

import inspect
import re

import pytest

from worker.db import engine, engine_claims, engine_schema, schema
from worker.db.sql import _named, engine_query, fill, query, quote_ident
from worker.db.store import Store, attempts, lanes, report, runs

GROUPS = (runs, attempts, lanes, report)


def test_quote_ident_doubles_quotes_and_refuses_what_no_identifier_can_be() -> None:
    assert quote_ident("runtime_scheduler") == '"runtime_scheduler"'
    assert quote_ident('a"b') == '"a""b"'
    for bad in ("", "a\x00b"):
        with pytest.raises(ValueError, match="not a usable identifier"):
            quote_ident(bad)


def test_fill_quotes_the_schema_and_a_queues_engine_tables() -> None:
    body = "select * from {schema}.runs s join {tasks} t using (task_id), {runs} r, {checkpoints} c"
    assert fill(body, schema="s", queue='q"1') == (
        'select * from "s".runs s join absurd."t_q""1" t using (task_id),'
        ' absurd."r_q""1" r, absurd."c_q""1" c'
    )
    # A name not given leaves its placeholder; `query` refuses such text.
    assert fill(body, schema="s").count("{tasks}") == 1


def test_a_query_whose_identifier_is_missing_is_refused() -> None:
    with pytest.raises(ValueError, match=r"needs the identifier \{runs\}"):
        engine_query("held_runs")
    assert 'absurd."r_lane"' in engine_query("held_runs", queue="lane")


def test_every_store_query_fills_with_its_schema_and_binds_every_value() -> None:
    store = Store("st")
    assert store.q, "the store loads its queries"
    for name, body in store.q.items():
        left = set(re.findall(r"\{(schema|tasks|runs|checkpoints)\}", body))
        # Only step_provenance and queue_holds_foreign_task name a queue's table.
        assert left <= {"checkpoints", "tasks"}, name
        assert '"st".' in body, name  # every store query reads or writes the store


def test_every_query_of_a_file_is_run_by_exactly_one_method_of_its_module() -> None:
    """No named query is left without a typed method, and none is run from two groups."""
    seen: dict[str, str] = {}
    for module in GROUPS:
        source = inspect.getsource(module)
        group = next(c for _, c in inspect.getmembers(module, inspect.isclass) if "FILE" in vars(c))
        for name in _named("store", group.FILE):
            assert f'"{name}"' in source, f"{group.FILE}: {name} has no method"
            assert name not in seen, f"{name} in {seen.get(name)} and {group.FILE}"
            seen[name] = group.FILE
    engine_source = "".join(inspect.getsource(m) for m in (engine, engine_claims, engine_schema))
    for name in _named("engine", "queries.sql"):
        assert f'"{name}"' in engine_source, f"engine query {name} has no function"
    schema_source = inspect.getsource(schema)
    for name in _named("store", "migrations.sql"):
        assert f'"{name}"' in schema_source, f"ledger query {name} is not used"


def test_the_migration_ledger_queries_fill_with_the_schema() -> None:
    assert query("store", "migrations.sql", "applied", schema="x y") == (
        'select version, name, compatible from "x y".schema_migrations;'
    )
