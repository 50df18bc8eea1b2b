"""The run list's filter: read from a query, one sentence when bad, only the predicates given."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from worker.daemon.operator import unavailable
from worker.daemon.runs_page import TOO_SLOW
from worker.errors import InvalidRequestError
from worker.ops.run_list import Cursor, RunFilter, page_size, page_sql


def test_only_the_given_filters_become_predicates() -> None:
    sql, args = page_sql(RunFilter(), None, 50)
    assert " where " not in sql
    assert args == [51]
    flt = RunFilter.from_query({"status": "failed", "play": "p", "error": "50%_off"})
    sql, args = page_sql(flt, None, 10)
    assert "r.status = $1" in sql
    assert "r.play = $2" in sql
    assert args == ["failed", "p", r"%50\%\_off%", 11]


def test_a_release_is_its_lane_and_ages_read_back() -> None:
    flt = RunFilter.from_query({"release": "rel-a", "newer": "90m", "older": "2d"})
    assert flt.release_queue == "runs_rel_a"
    assert (flt.newer_s, flt.older_s) == (5400, 172800)
    assert flt.as_query() == {"release": "rel-a", "newer": "90m", "older": "2d"}
    assert RunFilter.from_query(flt.as_query()) == flt


def test_a_cursor_round_trips_and_a_forged_one_is_one_sentence() -> None:
    cursor = Cursor(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), uuid.uuid4())
    assert Cursor.parse(cursor.token()) == cursor
    for bad in ("x", "2026-01-02~nope", f"2026-01-02T00:00:00~{uuid.uuid4()}"):
        with pytest.raises(InvalidRequestError, match=r"^before is the place a page stopped"):
            Cursor.parse(bad)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"status": "stuck"}, "status is one of"),
        ({"newer": "soon"}, "newer is an age"),
        ({"play": "x" * 201}, "play is printable text"),
        ({"error": "a\nb"}, "error is printable text"),
        ({"release": "---"}, "release: "),
        ({"run": "nope"}, "run is a run id"),
    ],
)
def test_a_bad_field_is_one_sentence(query: dict[str, str], said: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"^{said}"):
        RunFilter.from_query(query)


def test_page_sizes_are_bounded() -> None:
    assert page_size(None) == 50
    assert page_size("200") == 200
    for bad in ("0", "201", "-1", "1e2"):
        with pytest.raises(InvalidRequestError):
            page_size(bad)


def test_a_read_cut_by_its_statement_timeout_asks_for_a_narrower_filter() -> None:
    assert unavailable(asyncpg.QueryCanceledError("canceling statement")) == (503, TOO_SLOW)
    assert unavailable(OSError())[1].startswith("the runs cannot be read right now (OSError)")
