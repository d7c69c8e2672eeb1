"""BETWEEN and IN (a list of values): the incremental operator against DuckDB at every epoch.

The workloads are the operator tests' (random inserts, updates and deletes on keys 0..5, NULLs in every
column), so bounds and list values are NULL in some rows (three-valued logic: ``NOT IN`` a list holding
a NULL is never true), a row moves in and out of a range with an update, and a group whose rows a
predicate filters is emptied by a delete.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from mvlog.views import UnsupportedSql, ViewDefinitionError, plan_view
from tests.unit.test_views_operator import BASE, SETTINGS, Pipeline, epochs, run_views


@SETTINGS
@given(epochs("t1"))
def test_between(all_epochs):
    run_views([
        ("w", "SELECT id, v1, s FROM t1 WHERE v1 BETWEEN -1 AND 2"),
        ("not_w", "SELECT id, v2 FROM t1 WHERE v2 NOT BETWEEN 0 AND 1.5 OR s NOT BETWEEN 'a' AND 'b'"),
        ("exprs", "SELECT id, v1 BETWEEN v2 AND v2 + 2 AS inside, NOT (v1 BETWEEN 0 AND v1 * v1) AS outside, "
                  "CASE WHEN v2 BETWEEN -1 AND 1 THEN 'near' ELSE 'far' END AS label, "
                  "id BETWEEN NULL AND 3 AS unknown FROM t1"),
        ("grouped", "SELECT v1 BETWEEN 0 AND 2 AS low, count(*) AS n, sum(v1) AS total FROM t1 "
                    "GROUP BY v1 BETWEEN 0 AND 2 HAVING count(*) BETWEEN 2 AND 4"),
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_in_a_list_of_values(all_epochs):
    run_views([
        ("w", "SELECT id, s FROM t1 WHERE s IN ('a', 'c') AND v1 NOT IN (0, 3)"),
        ("exprs", "SELECT id, v1 IN (1, 2.5, v2) AS one, v1 NOT IN (1, NULL) AS never, "
                  "lower(s) IN ('b') AS b, deleted IN (true) AS flagged, v2 IN (v1, v1 + 1) AS near FROM t1"),
        ("grouped", "SELECT s, count(*) AS n FROM t1 WHERE v1 IN (-1, 0, 1) OR s IS NULL GROUP BY s "
                    "HAVING max(v1) IN (0, 1) OR count(*) NOT IN (1, 2)"),
        ("subquery_too", "SELECT id, v1 FROM t1 WHERE v1 IN (SELECT k FROM t2 WHERE k IN (1, 2, 3)) "
                         "AND s NOT IN ('b')"),  # IN (subquery) stays a semi join beside a value list
    ], all_epochs)


def test_not_in_a_list_with_null_is_never_true():
    pipeline = Pipeline([("v", "SELECT id FROM t1 WHERE v1 NOT IN (1, NULL)"),
                         ("w", "SELECT id FROM t1 WHERE v1 NOT BETWEEN 1 AND NULL")])
    row = {"v1": 0, "v2": None, "s": None, "deleted": None}
    pipeline.epoch({"t1": [(1, row, False), (2, {**row, "v1": 1}, False), (3, {**row, "v1": 2}, False)]})
    assert pipeline.rows["v"] == {}
    assert pipeline.rows["w"] == {(1,): {"id": 1}}  # 0 < 1: false AND NULL is false, NOT makes it true


@pytest.mark.parametrize(("sql", "construct", "where"), [
    ("SELECT id FROM t1 WHERE v1 BETWEEN SYMMETRIC 2 AND 1", "BETWEEN SYMMETRIC", (1, 25)),
    ("SELECT id,\n  v1 IN (SELECT k FROM t2) AS found FROM t1", "subquery", (2, 3)),
])
def test_refused_with_the_construct_and_its_position(sql, construct, where):
    with pytest.raises(UnsupportedSql) as caught:
        plan_view("v", sql, BASE)
    assert (caught.value.construct, caught.value.line, caught.value.col) == (construct, *where)


@pytest.mark.parametrize(("sql", "problem"), [
    ("SELECT id FROM t1 WHERE v1 BETWEEN 'a' AND 2", "BETWEEN cannot compare int with string and int"),
    ("SELECT id FROM t1 WHERE s IN ('a', 1)", "IN cannot compare string with a list of string, int"),
    ("SELECT id FROM t1 WHERE v1 IN (1, count(*))", "aggregate function .* is not allowed in WHERE"),
    ("SELECT v1 BETWEEN 1 AND 2 AS b FROM t1 GROUP BY s", "must be in GROUP BY"),
])
def test_type_errors_name_the_expression(sql, problem):
    with pytest.raises(ViewDefinitionError, match=problem):
        plan_view("v", sql, BASE)
