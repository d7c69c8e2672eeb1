"""SELECT DISTINCT, DISTINCT aggregates and HAVING: the incremental operator against DuckDB at every epoch.

The workloads are the operator tests' (random inserts, updates and deletes on keys 0..5 with values
from small ranges), so distinct rows appear twice and lose one copy, a group's last row is deleted, a
value is counted by two rows and one goes, and HAVING conditions turn false and true again.
"""

from __future__ import annotations

from hypothesis import given

from tests.unit.test_views_operator import SETTINGS, Pipeline, epochs, run_views


@SETTINGS
@given(epochs("t1"))
def test_select_distinct(all_epochs):
    run_views([
        ("d", "SELECT DISTINCT s, deleted FROM t1"),
        ("expr", "SELECT DISTINCT v1 + 1 AS x, v2 > 0 AS positive FROM t1 WHERE NOT deleted OR s IS NULL"),
        ("star", "SELECT DISTINCT * FROM t1"),
        ("repeated", "SELECT DISTINCT v1, v1 AS again, s FROM t1"),
        ("of_distinct", "SELECT s, count(*) AS n FROM d GROUP BY s"),  # a view on a DISTINCT view
    ], all_epochs)


@SETTINGS
@given(epochs("t1"))
def test_distinct_aggregates(all_epochs):
    run_views([
        ("g", "SELECT s, count(DISTINCT v1) AS nv, count(DISTINCT v2) AS nf, count(v1) AS c, "
              "sum(DISTINCT v1) AS sv, avg(DISTINCT v2) AS af, min(DISTINCT v1) AS lo, max(v1) AS hi "
              "FROM t1 GROUP BY s"),
        ("global", "SELECT count(DISTINCT s) AS ns, count(DISTINCT v1 + 1) AS nx, sum(DISTINCT v2) AS total "
                   "FROM t1 WHERE NOT deleted"),
        ("by_expr", "SELECT v1 > 0 AS positive, count(DISTINCT s) AS ns, count(*) AS n FROM t1 GROUP BY v1 > 0"),
    ], all_epochs)


@SETTINGS
@given(epochs("t1"))
def test_having(all_epochs):
    run_views([
        ("h", "SELECT s, count(*) AS n, sum(v1) AS total FROM t1 GROUP BY s HAVING count(*) > 1"),
        ("alias", "SELECT s, count(*) AS n FROM t1 GROUP BY s HAVING n >= 2 AND n < 4"),
        ("unselected", "SELECT deleted, min(v1) AS lo FROM t1 GROUP BY deleted "
                       "HAVING max(v2) > 0.5 OR count(DISTINCT v1) = 2"),
        ("group_column", "SELECT s, count(*) AS n FROM t1 GROUP BY s HAVING s <> 'a' OR s IS NULL"),
        ("null_is_false", "SELECT s, sum(v1) AS total FROM t1 GROUP BY s HAVING sum(v1) > 0"),
        ("global", "SELECT count(*) AS n, sum(v1) AS total FROM t1 HAVING count(*) >= 3"),
        ("on_having", "SELECT count(*) AS groups FROM h"),  # a view on a HAVING view
    ], all_epochs)


def test_having_retracts_a_group_and_emits_it_again():
    pipeline = Pipeline([("h", "SELECT s, count(*) AS n FROM t1 GROUP BY s HAVING count(*) > 1")])
    row = {"v1": 1, "v2": None, "s": "a", "deleted": False}
    pipeline.epoch({"t1": [(1, row, False), (2, row, False)]})
    assert pipeline.rows["h"] == {("a",): {"s": "a", "n": 2}}
    pipeline.epoch({"t1": [(2, None, False)]})
    assert pipeline.rows["h"] == {}
    assert len(pipeline.states["h"]) == 1  # the group's state stays: its row comes back with one more row
    pipeline.epoch({"t1": [(3, row, False)]})
    assert pipeline.rows["h"] == {("a",): {"s": "a", "n": 2}}
    pipeline.epoch({"t1": [(1, None, False), (3, None, False)]})
    assert pipeline.rows["h"] == {} and len(pipeline.states["h"]) == 0


def test_count_distinct_keeps_a_value_counted_by_two_rows():
    pipeline = Pipeline([("c", "SELECT count(DISTINCT v1) AS n FROM t1")])
    row = {"v1": 7, "v2": None, "s": None, "deleted": None}
    pipeline.epoch({"t1": [(1, row, False), (2, row, False), (3, {**row, "v1": None}, False)]})
    assert pipeline.rows["c"] == {(): {"n": 1}}
    pipeline.epoch({"t1": [(1, None, False)]})
    assert pipeline.rows["c"] == {(): {"n": 1}}
    pipeline.epoch({"t1": [(2, None, False)]})
    assert pipeline.rows["c"] == {(): {"n": 0}}
