"""Tumbling and hopping time windows (``GROUP BY window(ts, ...)``): the operator against DuckDB at every epoch.

Event time is an INT of epoch milliseconds; the workloads' ints are small (-3..3, keys 0..5), so with
windows of a few milliseconds rows share windows, hop over several, sit before 1970 (negative times:
window starts are floored) and leave windows empty when they are deleted or move.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from mvlog.views import UnsupportedSql, ViewDefinitionError, plan_view
from tests.unit.test_views_operator import BASE, SETTINGS, Pipeline, epochs, run_views


@SETTINGS
@given(epochs("t1"))
def test_tumbling_and_hopping_windows(all_epochs):
    run_views([
        ("tumbling", "SELECT window.start AS ws, window.end AS we, s, count(*) AS n, sum(v2) AS total "
                     "FROM t1 GROUP BY window(v1, '2 milliseconds'), s"),
        ("hopping", "SELECT window.start, window.end, count(*) AS n, max(s) AS top, count(DISTINCT s) AS ns "
                    "FROM t1 WHERE NOT deleted OR deleted IS NULL "
                    "GROUP BY window(v1, '3 milliseconds', '1 millisecond')"),
        ("uneven", "SELECT window.start AS ws, count(*) AS n FROM t1 GROUP BY window(id * 2 - 5, '5 ms', '2 ms') "
                   "HAVING count(*) > 1"),  # 5 / 2: a row falls in two or three windows
        ("by_id", "SELECT deleted, window.end - 1 AS last, count(*) AS n FROM t1 "
                  "GROUP BY deleted, window(id, '4 milliseconds', '2 milliseconds')"),
        ("on_windows", "SELECT count(*) AS windows, sum(n) AS rows FROM hopping"),  # a view on a windowed view
        ("parenthesized", "SELECT window.end AS we, max(v1) AS top FROM t1 "
                          "GROUP BY (window(v1, '2 milliseconds'))"),  # as Nexmark q7 writes it
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_windows_over_joins(all_epochs):
    """The time is a column of one joined view, which no outer join null-extends: DuckDB copies that view's
    rows per window before the join, the operator the joined rows after it, the same rows."""
    run_views([
        ("inner", "SELECT window.start AS ws, b.tag, count(*) AS n, sum(b.w) AS total, max(a.v2) AS top "
                  "FROM t1 a JOIN t2 b ON a.v1 = b.k GROUP BY window(a.id, '3 milliseconds', '1 millisecond'), b.tag"),
        ("left", "SELECT window.end AS we, count(*) AS n, count(b.id) AS matched, min(b.w) AS low "
                 "FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k WHERE NOT a.deleted OR a.deleted IS NULL "
                 "GROUP BY window(a.v1, '2 milliseconds')"),
        ("right_time", "SELECT window.start, count(*) AS n, sum(a.v1) AS s FROM t1 a RIGHT JOIN t2 b ON a.v1 = b.k "
                       "GROUP BY window(b.k * 2, '4 milliseconds', '2 milliseconds')"),  # b's side: kept
        ("anti", "SELECT window.start AS ws, count(*) AS n FROM t1 a WHERE NOT EXISTS "
                 "(SELECT 1 FROM t2 b WHERE b.k = a.v1) GROUP BY window(a.id, '2 milliseconds', '1 millisecond')"),
    ], all_epochs)


def test_a_row_counts_in_each_window_that_holds_it_and_an_emptied_window_goes():
    pipeline = Pipeline([("w", "SELECT window.start AS ws, window.end AS we, count(*) AS n FROM t1 "
                               "GROUP BY window(v1, '10 seconds', '5 seconds')")])
    row = {"v2": None, "s": None, "deleted": None}
    pipeline.epoch({"t1": [(1, {**row, "v1": 12_000}, False), (2, {**row, "v1": -1}, False)]})
    windows = {(start, start + 10_000): {"ws": start, "we": start + 10_000, "n": 1}  # the key: start, end
               for start in (5000, 10_000, -5000, -10_000)}
    assert pipeline.rows["w"] == windows
    pipeline.epoch({"t1": [(2, None, False), (1, {**row, "v1": None}, False)]})  # NULL time: in no window
    assert pipeline.rows["w"] == {} and len(pipeline.states["w"]) == 0


@pytest.mark.parametrize(("sql", "error"), [
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v2, '1 second')", "event time of window\\(\\) is an int"),
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v1, 'soon')", "not a duration"),
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v1, '1 second', '2 seconds')", "slide .* is longer"),
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v1, '1 hour', '1 ms')", "windows \\(at most 1000\\)"),
    ("SELECT window.start AS ws FROM t1", "needs a time window in GROUP BY"),
    ("SELECT window.middle AS m FROM t1 GROUP BY window(v1, '1 second')", "a window has start and end"),
])
def test_bad_windows_are_refused(sql, error):
    with pytest.raises(ViewDefinitionError, match=error):
        plan_view("v", sql, BASE)


@pytest.mark.parametrize(("sql", "construct"), [
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v1, '1 second', '1 second', '1 second')",
     "window() with a start offset"),
    ("SELECT count(*) AS n FROM t1 a JOIN t2 b ON a.v1 = b.k GROUP BY window(a.v1 + b.k, '1 second')",
     "time window over a join whose time is not a column of one joined view"),
    ("SELECT count(*) AS n FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k GROUP BY window(b.k, '1 second')",
     "time window over the side an outer join null-extends"),
    ("SELECT count(*) AS n FROM t1 a FULL JOIN t2 b ON a.v1 = b.k GROUP BY window(a.v1, '1 second')",
     "time window over the side an outer join null-extends"),
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v1, '1 second'), window(id, '1 second')",
     "more than one time window in GROUP BY"),
    ("SELECT window(v1, '1 second') AS w FROM t1", "function window()"),
])
def test_unsupported_window_shapes_name_the_construct(sql, construct):
    with pytest.raises(UnsupportedSql) as error:
        plan_view("v", sql, BASE)
    assert error.value.construct == construct and error.value.line == 1
