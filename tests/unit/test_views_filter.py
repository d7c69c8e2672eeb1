"""Aggregates with ``FILTER (WHERE ...)`` (Nexmark q15-q17): the incremental operator against DuckDB at every
epoch, DuckDB computing the FILTER clauses of the rendered SQL itself.

The workloads are the operator tests' (random inserts, updates and deletes on keys 0..5, NULLs in every
column), so an update moves a row in and out of a filter without leaving its group, the last row a
filter counts is deleted while the group stays, a distinct value is counted by one filtered row and one
unfiltered, and filter conditions are NULL.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from mvlog.views import UnsupportedSql, ViewDefinitionError, plan_view
from tests.unit.test_views_operator import BASE, SETTINGS, Pipeline, epochs, run_views


@SETTINGS
@given(epochs("t1"))
def test_filtered_aggregates(all_epochs):
    run_views([
        ("ranks", "SELECT s, count(*) AS total, count(*) FILTER (WHERE v1 < 0) AS low, "
                  "count(*) FILTER (WHERE v1 >= 0 AND v1 < 2) AS mid, count(*) FILTER (WHERE v1 >= 2) AS high, "
                  "count(DISTINCT v2) AS nv, count(DISTINCT v2) FILTER (WHERE v1 < 0) AS nv_low, "
                  "count(DISTINCT v2) FILTER (WHERE deleted) AS nv_deleted FROM t1 GROUP BY s"),
        ("others", "SELECT deleted, sum(v1) FILTER (WHERE s IN ('a', 'b')) AS total, "
                   "avg(v2) FILTER (WHERE v1 BETWEEN -1 AND 1) AS mean, min(v1) FILTER (WHERE v2 > 0) AS lo, "
                   "max(s) FILTER (WHERE v1 <> 0) AS top, count(v2) FILTER (WHERE s IS NOT NULL) AS nv, "
                   "sum(DISTINCT v1) FILTER (WHERE v2 IS NULL) AS sd, sum(v2) FILTER (WHERE NULL) AS never, "
                   "count(*) FILTER (WHERE true) AS all_rows FROM t1 GROUP BY deleted"),
        ("global", "SELECT count(*) FILTER (WHERE deleted) AS gone, count(DISTINCT s) FILTER (WHERE NOT deleted) AS "
                   "kept, sum(v1) FILTER (WHERE v1 > 0) AS positive FROM t1"),
        ("having", "SELECT s, count(*) AS n FROM t1 GROUP BY s HAVING count(*) FILTER (WHERE v1 > 0) >= 1"),
        ("windowed", "SELECT window.start AS ws, count(*) FILTER (WHERE v2 > 0) AS n, "
                     "count(DISTINCT s) FILTER (WHERE v2 > 0) AS ns FROM t1 GROUP BY window(v1, '2 milliseconds')"),
        ("on_filtered", "SELECT sum(low) AS low, sum(nv_low) AS nv_low FROM ranks"),  # a view on a FILTER view
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_filtered_aggregates_over_a_join(all_epochs):
    run_views([
        ("j", "SELECT b.tag, count(*) FILTER (WHERE a.v1 > b.k) AS above, "
              "count(DISTINCT a.s) FILTER (WHERE b.w IS NOT NULL) AS ns FROM t1 a JOIN t2 b ON a.v1 = b.k "
              "GROUP BY b.tag"),
    ], all_epochs)


def test_an_update_moves_a_row_out_of_a_filter_and_back():
    pipeline = Pipeline([("f", "SELECT s, count(*) AS n, count(*) FILTER (WHERE v1 > 0) AS positive, "
                               "count(DISTINCT v1) FILTER (WHERE v1 > 0) AS distinct_positive FROM t1 GROUP BY s")])
    row = {"v1": 1, "v2": None, "s": "a", "deleted": None}
    pipeline.epoch({"t1": [(1, row, False), (2, row, False)]})
    assert pipeline.rows["f"] == {("a",): {"s": "a", "n": 2, "positive": 2, "distinct_positive": 1}}
    pipeline.epoch({"t1": [(1, {**row, "v1": -1}, False)]})
    assert pipeline.rows["f"] == {("a",): {"s": "a", "n": 2, "positive": 1, "distinct_positive": 1}}
    pipeline.epoch({"t1": [(2, {**row, "v1": None}, False)]})
    assert pipeline.rows["f"] == {("a",): {"s": "a", "n": 2, "positive": 0, "distinct_positive": 0}}
    pipeline.epoch({"t1": [(1, {**row, "v1": 3}, False)]})
    assert pipeline.rows["f"] == {("a",): {"s": "a", "n": 2, "positive": 1, "distinct_positive": 1}}


@pytest.mark.parametrize(("sql", "problem"), [
    ("SELECT count(*) FILTER (WHERE v1) AS n FROM t1", "FILTER \\(WHERE ...\\) needs a boolean, this is int"),
    ("SELECT count(*) FILTER (WHERE count(*) > 1) AS n FROM t1", "is not allowed in FILTER"),
    ("SELECT id FROM t1 WHERE count(*) FILTER (WHERE v1 > 0) > 1", "is not allowed in WHERE"),
    ("SELECT count(*) FILTER (WHERE window.start > 0) AS n FROM t1 GROUP BY window(v1, '2 milliseconds')",
     "window.start in FILTER"),
    ("SELECT count(*) FILTER (WHERE nope > 0) AS n FROM t1", "unknown column 'nope'"),
])
def test_bad_filters_are_refused(sql, problem):
    with pytest.raises(ViewDefinitionError, match=problem):
        plan_view("v", sql, BASE)


def test_a_filter_on_an_unsupported_aggregate_names_it():
    with pytest.raises(UnsupportedSql) as caught:
        plan_view("v", "SELECT s,\n  stddev(v1) FILTER (WHERE v1 > 0) AS d FROM t1 GROUP BY s", BASE)
    assert (caught.value.construct, caught.value.line, caught.value.col) == ("aggregate function stddev()", 2, 3)
