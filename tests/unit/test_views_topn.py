"""Top-N per partition (ROW_NUMBER() in a subquery, filtered by rank): the operator against DuckDB at every epoch.

Values come from small ranges (ties in ORDER BY are the rule, NULLs frequent) and keys 0..5 are
inserted, updated and deleted at random, so rows move up when one above them goes, partitions empty
and refill, and the tiebreak on the sources' key decides most ranks: DuckDB's result agrees only if
the rendered SQL breaks ties as the operator does.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from mvlog.views import UnsupportedSql, ViewDefinitionError, plan_view
from tests.unit.test_views_operator import BASE, SETTINGS, Pipeline, epochs, run_views


@SETTINGS
@given(epochs("t1"))
def test_top_n_per_partition(all_epochs):
    run_views([
        ("top2", "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY s ORDER BY v1 DESC) AS rn FROM t1) "
                 "WHERE rn <= 2"),
        ("first", "SELECT s, v1 AS lowest, v2 FROM (SELECT id, s, v1, v2, ROW_NUMBER() OVER "
                  "(PARTITION BY s ORDER BY v1, v2 DESC) AS rn FROM t1 WHERE NOT deleted OR deleted IS NULL) x "
                  "WHERE x.rn = 1"),
        ("global", "SELECT id, rank, v2 FROM (SELECT id, v2, ROW_NUMBER() OVER (ORDER BY v2 DESC NULLS FIRST) "
                   "AS rank FROM t1) WHERE rank < 4"),
        ("by_expr", "SELECT * FROM (SELECT id, v1 * 2 AS w, ROW_NUMBER() OVER (PARTITION BY v1 > 0, deleted "
                    "ORDER BY s ASC NULLS LAST, v2) AS rn FROM t1) t WHERE 3 >= rn"),
        ("by_string", "SELECT * FROM (SELECT ROW_NUMBER() OVER (PARTITION BY deleted ORDER BY s DESC, "
                      "v1 + 1 ASC) AS pos, s, v1 FROM t1) WHERE pos <= 1"),
        ("on_top", "SELECT s, count(*) AS n, max(rn) AS deepest FROM top2 GROUP BY s"),  # a view on a top-N
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_top_n_over_a_join_and_of_a_view(all_epochs):
    run_views([
        ("counts", "SELECT k, tag, count(*) AS n FROM t2 GROUP BY k, tag"),
        ("joined", "SELECT * FROM (SELECT a.id, b.id AS bid, b.w, ROW_NUMBER() OVER (PARTITION BY a.s "
                   "ORDER BY b.w DESC) AS rn FROM t1 a JOIN t2 b ON a.v1 = b.k) WHERE rn <= 2"),
        ("by_k", "SELECT k, tag, n FROM (SELECT k, tag, n, ROW_NUMBER() OVER (PARTITION BY k ORDER BY n DESC) AS rn "
                 "FROM counts) WHERE rn <= 1"),
        ("raw", "SELECT * FROM (SELECT id, raw, ROW_NUMBER() OVER (PARTITION BY tag ORDER BY raw) AS rn FROM t2) "
                "WHERE rn <= 2"),
    ], all_epochs)


def test_deleting_the_top_row_moves_the_next_up_and_an_emptied_partition_leaves_no_state():
    pipeline = Pipeline([("t", "SELECT id, v1, rn FROM (SELECT id, v1, ROW_NUMBER() OVER (PARTITION BY s "
                               "ORDER BY v1 DESC) AS rn FROM t1) WHERE rn <= 2")])
    row = {"v2": None, "s": "a", "deleted": False}
    pipeline.epoch({"t1": [(1, {**row, "v1": 5}, False), (2, {**row, "v1": 3}, False), (3, {**row, "v1": 3}, False)]})
    assert pipeline.rows["t"] == {(1,): {"id": 1, "v1": 5, "rn": 1}, (2,): {"id": 2, "v1": 3, "rn": 2}}  # tie: id 2
    pipeline.epoch({"t1": [(1, None, False)]})
    assert pipeline.rows["t"] == {(2,): {"id": 2, "v1": 3, "rn": 1}, (3,): {"id": 3, "v1": 3, "rn": 2}}
    pipeline.epoch({"t1": [(2, None, False), (3, None, False)]})
    assert pipeline.rows["t"] == {} and len(pipeline.states["t"]) == 0


@pytest.mark.parametrize(("sql", "construct"), [
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY s ORDER BY v1) AS rn FROM t1) WHERE rn <= 2 "
     "AND id > 1", "a filter besides the rank around a top-N subquery"),
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY s ORDER BY v1) AS rn FROM t1) WHERE rn = 2",
     "a rank filter other than rank <= N, rank < N or rank = 1"),
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY s ORDER BY v1) AS rn FROM t1) WHERE rn >= 2",
     "a rank filter other than rank <= N, rank < N or rank = 1"),
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY s ORDER BY v1) AS rn FROM t1)",
     "ROW_NUMBER() in a subquery without a rank filter"),
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY s) AS rn FROM t1) WHERE rn <= 1",
     "ROW_NUMBER() without ORDER BY"),
    ("SELECT id + 1 AS x FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY v1) AS rn FROM t1) WHERE rn <= 1",
     "an expression over a top-N subquery's columns"),
    ("SELECT * FROM (SELECT s, count(*) AS n, ROW_NUMBER() OVER (ORDER BY s) AS rn FROM t1 GROUP BY s) "
     "WHERE rn <= 1", "ROW_NUMBER() over an aggregate"),
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY v1) AS rn FROM t1) WHERE rn <= 1 ORDER BY id",
     "ORDER BY around a top-N subquery"),
    ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY v1) AS rn, rank() OVER (ORDER BY v1) AS r FROM t1) "
     "WHERE rn <= 1", "window function"),
])
def test_other_shapes_are_refused_naming_the_construct(sql, construct):
    with pytest.raises(UnsupportedSql) as error:
        plan_view("v", sql, BASE)
    assert error.value.construct == construct and error.value.line == 1 and error.value.col is not None


def test_a_rank_filter_keeping_no_row_is_an_error():
    with pytest.raises(ViewDefinitionError, match="keeps no row"):
        plan_view("v", "SELECT * FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY v1) AS rn FROM t1) WHERE rn < 1",
                  BASE)
