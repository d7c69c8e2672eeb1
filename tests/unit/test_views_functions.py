"""The scalar functions of the Nexmark queries: the operator against DuckDB at every epoch.

Strings are built from the workloads' small ones (``concat(s, '/', tag)``...) so splitting, searching
and extracting find, miss and run past the end; event times are ints scaled to milliseconds spanning
years either side of 1970, so dates, hours and minutes change and floor before the epoch.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from mvlog.views import ViewDefinitionError, plan_view
from tests.unit.test_views_operator import BASE, SETTINGS, epochs, run_views


@SETTINGS
@given(epochs("t1"))
def test_numeric_and_time_functions(all_epochs):
    run_views([
        ("numbers", "SELECT id, v1 % 2 AS m, mod(v1, -2) AS m2, v2 % 1.5 AS fm, v1 % 0 AS zero, id DIV 2 AS d, "
                    "v1 DIV v1 AS one, CASE WHEN v1 % 2 = 0 THEN 'even' ELSE 'odd' END AS parity FROM t1"),
        ("times", "SELECT id, date_format(v1 * 40000000000 + id * 3700123, 'yyyy-MM-dd HH:mm:ss') AS at, "
                  "date_format(v1 * 3600000, 'HH:mm') AS hm, hour(v1 * 3600000 + 1) AS h, "
                  "extract(HOUR FROM v1 * 5400000) AS h2, minute(v1 * 90000) AS mi FROM t1"),
        ("by_day", "SELECT date_format(v1 * 40000000, 'yyyy-MM-dd') AS day, count(*) AS n, "
                   "count(DISTINCT s) AS ns FROM t1 GROUP BY date_format(v1 * 40000000, 'yyyy-MM-dd')"),
    ], all_epochs)


@SETTINGS
@given(epochs("t2"))
def test_string_functions(all_epochs):
    run_views([
        ("strings", "SELECT id, lower(tag) AS lo, upper(tag) AS up, concat(tag, '/', upper(tag), '/x') AS path, "
                    "tag || '-' || tag AS twice, instr(concat(tag, 'ab'), 'b') AS pos, "
                    "split_part(concat(tag, '/', 'y/', tag), '/', 3) AS third, "
                    "split_part(concat(tag, '/'), '/', 4) AS past_end, "
                    "regexp_extract(concat('k=', tag, '&c=', tag), '(&|^)c=([^&]*)', 2) AS channel, "
                    "regexp_extract(concat(tag, 'z'), '([a-b]+)', 1) AS letters FROM t2"),
        ("grouped", "SELECT upper(tag) AS t, count(*) AS n, max(lower(tag)) AS lo FROM t2 "
                    "WHERE instr(concat(tag, 'c'), 'c') > 0 GROUP BY upper(tag)"),
    ], all_epochs)


@SETTINGS
@given(epochs("t2"))
def test_length_and_replace(all_epochs):
    """Characters, not bytes (``é`` is two bytes); q14's count of a character as a difference of lengths."""
    run_views([
        ("lengths", "SELECT id, length(tag) AS n, char_length(concat(tag, 'é', tag)) AS chars, "
                    "character_length(concat(tag, tag, 'xy')) AS n3, length('') AS empty, "
                    "replace(concat(tag, 'cc', tag), 'c', '') AS no_c, replace(concat(tag, 'aaa'), 'aa', 'b') AS once, "
                    "replace(concat(tag, 'é'), 'é') AS two_args, replace(tag, '', 'x') AS empty_search, "
                    "replace(concat('a', tag), tag, upper(tag)) AS by_column, "
                    "length(concat(tag, 'cbc')) - length(replace(concat(tag, 'cbc'), 'c', '')) AS c_count "
                    "FROM t2 WHERE length(tag) BETWEEN 1 AND 3 OR tag IS NULL"),
        ("by_length", "SELECT length(concat(tag, tag)) AS n, count(*) AS rows FROM t2 "
                      "GROUP BY length(concat(tag, tag))"),
    ], all_epochs)


@pytest.mark.parametrize(("sql", "problem"), [
    ("SELECT date_format(v1, 'yyyy-MM-dd EEE') AS d FROM t1", "pattern of the letters yyyy, MM, dd"),
    ("SELECT date_format(v2, 'yyyy') AS d FROM t1", "event time is an int of epoch milliseconds"),
    ("SELECT hour(s) AS h FROM t1", "event time is an int"),
    ("SELECT split_part(s, s, 1) AS p FROM t1", "literal delimiter"),
    ("SELECT split_part(s, '/', 0) AS p FROM t1", "part number from 1"),
    ("SELECT regexp_extract(s, '(a', 1) AS p FROM t1", "does not compile"),
    ("SELECT regexp_extract(s, '(a)', 2) AS p FROM t1", "has 1 group"),
    ("SELECT lower(v1) AS l FROM t1", "needs strings"),
    ("SELECT length(v1) AS l FROM t1", "length needs strings, got int"),
    ("SELECT replace(s, 1, 'x') AS r FROM t1", "replace needs strings, got int"),
    ("SELECT v2 DIV 2 AS d FROM t1", "DIV needs ints"),
    ("SELECT s % 2 AS m FROM t1", "% needs numbers"),
])
def test_bad_arguments_are_refused(sql, problem):
    with pytest.raises(ViewDefinitionError, match=problem):
        plan_view("v", sql, BASE)
