"""The incremental operator against DuckDB: after every epoch, the view folded from the operator's
changes equals DuckDB evaluating ``to_duckdb_sql`` over the upstream rows of that epoch (invariant I1).

Epochs are random inserts/updates/deletes (several changes to one key in an epoch, empty epochs, NULLs)
on small key and value ranges, so groups empty and refill, extremes are deleted and join keys collide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvlog.changes import Change, Op, apply_changes, change_between
from mvlog.row_schema import ColumnType, Key, Row, RowSchema
from mvlog.views import (
    ChangeBatch,
    InconsistentChanges,
    InMemoryState,
    ViewOperator,
    ViewPlan,
    plan_view,
    to_duckdb_sql,
)

T1 = RowSchema.of({"id": "int", "v1": "int", "v2": "float", "s": "string", "deleted": "boolean"}, ["id"])
T2 = RowSchema.of({"id": "int", "k": "int", "w": "float", "tag": "string", "raw": "bytes"}, ["id"])
BASE = {"t1": T1, "t2": T2}
ARROW = {ColumnType.INT: pa.int64(), ColumnType.FLOAT: pa.float64(), ColumnType.STRING: pa.string(),
         ColumnType.BOOLEAN: pa.bool_(), ColumnType.BYTES: pa.binary()}

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- random epochs --------------------------------------------------------------------------------------

ints = st.one_of(st.none(), st.integers(-3, 3))
floats = st.one_of(st.none(), st.sampled_from([-2.5, -1.0, 0.0, 0.5, 1.0, 2.0, 3.5]))
strings = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))
booleans = st.one_of(st.none(), st.booleans())
blobs = st.one_of(st.none(), st.sampled_from([b"", b"x", b"\x00\xff"]))
ROW_VALUES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "t1": st.fixed_dictionaries({"v1": ints, "v2": floats, "s": strings, "deleted": booleans}),
    "t2": st.fixed_dictionaries({"k": ints, "w": floats, "tag": strings, "raw": blobs}),
}


def ops(table: str) -> st.SearchStrategy[list[tuple[int, dict[str, Any] | None, bool]]]:
    """An epoch's writes to one table: (key, new values or None = delete, write as a snapshot read)."""
    values: st.SearchStrategy[dict[str, Any] | None] = st.one_of(st.none(), ROW_VALUES[table])
    op = st.tuples(st.integers(0, 5), values, st.booleans())
    return st.lists(op, max_size=8)


def epochs(*tables: str, max_epochs: int = 6) -> st.SearchStrategy[list[dict[str, list[Any]]]]:
    return st.lists(st.fixed_dictionaries({t: ops(t) for t in tables}), min_size=1, max_size=max_epochs)


@dataclass
class Table:
    """A root table: its rows, and the changes one epoch of writes makes to them."""

    schema: RowSchema
    rows: dict[Key, Row] = field(default_factory=dict)

    def write(self, writes: Sequence[tuple[int, dict[str, Any] | None, bool]]) -> list[Change]:
        changes = []
        for key, values, as_read in writes:
            before = self.rows.get((key,))
            after = None if values is None else {"id": key, **values}
            change = change_between((key,), before, after)
            if change is None:
                continue
            if as_read and change.op is Op.CREATE:
                change = Change(Op.READ, change.key, None, change.after)
            changes.append(change)
            apply_changes(self.rows, [change])
        return changes


# -- running views and the DuckDB oracle ----------------------------------------------------------------


class Pipeline:
    """Views maintained epoch by epoch, each fed the output changes of its upstreams."""

    def __init__(self, definitions: Sequence[tuple[str, str]], tables: Sequence[str] = ("t1", "t2")) -> None:
        self.tables = {name: Table(BASE[name]) for name in tables}
        schemas: dict[str, RowSchema] = {name: t.schema for name, t in self.tables.items()}
        self.plans: dict[str, ViewPlan] = {}
        for name, sql in definitions:
            self.plans[name] = plan_view(name, sql, schemas)
            schemas[name] = self.plans[name].schema
        self.operators = {name: ViewOperator(p) for name, p in self.plans.items()}
        # Rendered once: rendering a plan costs about what DuckDB's evaluation of it does.
        self.sqls = {name: to_duckdb_sql(p, {s: s for s in p.sources}) for name, p in self.plans.items()}
        self.states = {name: InMemoryState() for name in self.plans}
        self.rows: dict[str, dict[Key, Row]] = {name: {} for name in self.plans}
        self.duck = duckdb.connect()

    def epoch(self, writes: Mapping[str, Sequence[Any]]) -> None:
        batches = {name: ChangeBatch.from_changes(self.tables[name].schema, self.tables[name].write(w))
                   for name, w in writes.items()}
        for name, plan in self.plans.items():
            inputs = {source: batches[source] for source in plan.sources if source in batches}
            out = self.operators[name].apply_epoch(inputs, self.states[name])
            changes = out.changes.to_changes()
            keys = [c.key for c in changes]
            assert len(keys) == len(set(keys)), f"{name}: more than one change per key"
            for change in changes:  # consolidated: `before` is the row before the epoch
                assert self.rows[name].get(change.key) == change.before, (name, change)
                assert change.after is None or plan.schema.key_of(change.after) == change.key
            self.states[name].apply(out.state_writes)
            apply_changes(self.rows[name], changes)
            batches[name] = out.changes  # a view's output batch is what the views built on it read
        self.check()

    def check(self) -> None:
        for name, table in self.tables.items():
            self._register(name, table.schema, list(table.rows.values()))
        for name, plan in self.plans.items():
            result = self.duck.execute(self.sqls[name])
            names = [d[0] for d in result.description]
            assert names == plan.schema.names
            expected = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
            by_key = {plan.schema.key_of(row): row for row in expected}
            assert len(by_key) == len(expected), f"{name}: the view's key is not unique in DuckDB's result"
            assert_same_rows(name, self.rows[name], by_key, plan.schema)
            self._register(name, plan.schema, expected)  # the oracle's rows feed views built on this one

    def _register(self, name: str, schema: RowSchema, rows: list[Row]) -> None:
        arrow_schema = pa.schema([(c.name, ARROW[c.type]) for c in schema.columns])
        self.duck.register(name, pa.Table.from_pylist([schema.normalize(r) for r in rows], arrow_schema))

    def run(self, all_epochs: Sequence[Mapping[str, Sequence[Any]]]) -> None:
        for writes in all_epochs:
            self.epoch(writes)


def assert_same_rows(name: str, actual: dict[Key, Row], expected: dict[Key, Row], schema: RowSchema) -> None:
    assert set(actual) == set(expected), f"{name}: keys differ: {actual} != {expected}"
    for key, row in expected.items():
        for column in schema.columns:
            mine, theirs = actual[key][column.name], row[column.name]
            where = (name, key, column.name, mine, theirs)
            if column.type is ColumnType.FLOAT and mine is not None and theirs is not None:
                assert math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-9), where
            else:
                assert mine == theirs and type(mine) is type(theirs), where


def run_views(definitions: Sequence[tuple[str, str]],
              all_epochs: Sequence[Mapping[str, Sequence[Any]]]) -> Pipeline:
    pipeline = Pipeline(definitions)
    pipeline.run(all_epochs)
    return pipeline


# -- filter / project -----------------------------------------------------------------------------------


@SETTINGS
@given(epochs("t1"))
def test_filter_project(all_epochs):
    run_views([
        ("p", "SELECT id, v1 + 1 AS x, v2 * 2 AS y, v1 / v2 AS r, -v1 AS n, "
              "CASE WHEN v1 > 0 THEN s WHEN v1 < 0 THEN 'neg' END AS c, coalesce(v2, v1, 0) AS z, "
              "v1 IS NULL AS missing, NOT deleted OR v2 >= 1 AS flag FROM t1 "
              "WHERE NOT deleted OR v1 IS NULL"),
        ("hidden_key", "SELECT v1, s FROM t1 WHERE v2 > 0 AND s <> 'c'"),
        ("simple_case", "SELECT CASE v1 WHEN 1 THEN 'one' WHEN 2 THEN 'two' ELSE s END AS label FROM t1"),
        ("division", "SELECT v1 / v2 AS r, v2 / v1 AS q, id / v1 AS t, v2 / 0 AS z FROM t1"),  # x / 0 is NULL
    ], all_epochs)


# -- aggregates -----------------------------------------------------------------------------------------


@SETTINGS
@given(epochs("t1"))
def test_group_by_several_columns_every_aggregate(all_epochs):
    run_views([
        ("g", "SELECT s, deleted, count(*) AS n, count(v1) AS nv, sum(v1) AS sv, sum(v2) AS sf, "
              "min(v1) AS lo, max(v1) AS hi, min(v2) AS flo, max(v2) AS fhi, avg(v1) AS av, avg(v2) AS af "
              "FROM t1 GROUP BY s, deleted"),
        ("strings", "SELECT deleted, min(s) AS first, max(s) AS last, count(s) AS ns FROM t1 "
                    "GROUP BY deleted"),
        ("over_aggregates", "SELECT v1 > 0 AS positive, sum(v1) / count(*) AS mean, "
                            "max(v2) - min(v2) AS spread, count(*) + 1 AS n1 FROM t1 WHERE v1 IS NOT NULL "
                            "GROUP BY v1 > 0"),
        ("hidden_group", "SELECT count(*) AS n, sum(v2) AS total FROM t1 GROUP BY v1"),
        ("float_group", "SELECT v2, count(*) AS n, max(s) AS ms FROM t1 GROUP BY v2"),
    ], all_epochs)


@SETTINGS
@given(epochs("t1"))
def test_global_aggregates(all_epochs):
    run_views([
        ("all", "SELECT count(*) AS n, count(v1) AS nv, sum(v1) AS sv, min(v2) AS lo, max(v2) AS hi, "
                "avg(v1) AS av, max(s) AS ms FROM t1"),
        ("filtered", "SELECT count(*) AS n, sum(v2) AS total FROM t1 WHERE deleted = false AND v2 > 1"),
    ], all_epochs)


def test_global_aggregate_over_no_rows_is_one_row():
    pipeline = Pipeline([("g", "SELECT count(*) AS n, count(v1) AS c, sum(v1) AS s, min(v1) AS lo, "
                               "avg(v2) AS a FROM t1")])
    out = pipeline.operators["g"].apply_epoch({}, pipeline.states["g"])
    assert out.changes.to_changes() == [Change(Op.CREATE, (), None, {"n": 0, "c": 0, "s": None, "lo": None, "a": None})]
    pipeline.states["g"].apply(out.state_writes)
    assert len(pipeline.operators["g"].apply_epoch({"t1": ChangeBatch.empty(T1)}, pipeline.states["g"]).changes) == 0


def test_min_max_survive_deleting_the_extreme():
    pipeline = Pipeline([("m", "SELECT deleted, min(v1) AS lo, max(v1) AS hi, count(*) AS n FROM t1 "
                               "GROUP BY deleted")])
    row = {"v2": None, "s": None, "deleted": False}
    pipeline.epoch({"t1": [(key, {**row, "v1": v1}, False) for key, v1 in [(1, 1), (2, 5), (3, 9), (4, 9)]]})
    assert pipeline.rows["m"][(False,)] == {"deleted": False, "lo": 1, "hi": 9, "n": 4}
    pipeline.epoch({"t1": [(3, None, False)]})  # one of two 9s
    assert pipeline.rows["m"][(False,)]["hi"] == 9
    pipeline.epoch({"t1": [(4, None, False), (1, None, False)]})  # the other 9 and the minimum
    assert pipeline.rows["m"][(False,)] == {"deleted": False, "lo": 5, "hi": 5, "n": 1}
    pipeline.epoch({"t1": [(2, {**row, "v1": None}, False)]})
    assert pipeline.rows["m"][(False,)] == {"deleted": False, "lo": None, "hi": None, "n": 1}
    pipeline.epoch({"t1": [(2, None, False)]})
    assert pipeline.rows["m"] == {}
    assert len(pipeline.states["m"]) == 0  # an emptied group leaves no state behind


# -- joins ----------------------------------------------------------------------------------------------


@SETTINGS
@given(epochs("t1", "t2"))
def test_join_many_to_many(all_epochs):
    run_views([
        ("j", "SELECT a.id, a.v1, b.w, b.id AS bid, b.tag, b.raw FROM t1 a JOIN t2 b ON a.v1 = b.k "
              "WHERE b.w IS NOT NULL"),
        ("j2", "SELECT a.s, b.w * a.v1 AS product FROM t1 a JOIN t2 b ON a.v1 = b.k AND a.s = b.tag"),
        ("coerced", "SELECT a.v2, b.k FROM t1 a JOIN t2 b ON a.v2 = b.k"),  # float = int
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_group_by_over_join(all_epochs):
    run_views([
        ("jg", "SELECT a.s, count(*) AS n, sum(b.w) AS total, max(b.w) AS top, min(a.v2) AS low, "
               "max(b.raw) AS top_raw FROM t1 a JOIN t2 b ON a.v1 = b.k GROUP BY a.s"),
        ("by_raw", "SELECT raw, count(*) AS n, min(w) AS lo, min(raw) AS first FROM t2 GROUP BY raw"),
        ("jglobal", "SELECT count(*) AS n, avg(b.w) AS aw FROM t1 a JOIN t2 b ON a.v1 = b.k WHERE a.deleted"),
    ], all_epochs)


@SETTINGS
@given(epochs("t1"))
def test_self_join(all_epochs):
    run_views([("pairs", "SELECT a.id, b.id AS other, a.s FROM t1 a JOIN t1 b ON a.v1 = b.v1 AND a.s = b.s")],
              all_epochs)


# -- outer joins, residual conditions, chains of joins ---------------------------------------------------
# The random epochs change join keys (a row moves between buckets), delete the last row of a bucket (a
# join side empties: its matches are null-extended again) and fill it again, in one epoch or several.


@SETTINGS
@given(epochs("t1", "t2"))
def test_outer_joins(all_epochs):
    run_views([
        ("left", "SELECT a.id, a.v1, b.w, b.tag FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k"),
        ("right", "SELECT a.s, b.id AS bid, b.k FROM t1 a RIGHT OUTER JOIN t2 b ON a.v1 = b.k"),
        ("full", "SELECT a.id AS aid, a.s, b.id AS bid, b.raw FROM t1 a FULL JOIN t2 b ON a.v1 = b.k AND a.s = b.tag"),
        ("unmatched", "SELECT a.id, a.s FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k WHERE b.id IS NULL"),
        ("per_s", "SELECT a.s, count(*) AS n, count(b.id) AS matched, sum(b.w) AS total, max(b.tag) AS top "
                  "FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k GROUP BY a.s"),
        ("coalesced", "SELECT coalesce(a.v2, b.w) AS x FROM t1 a FULL JOIN t2 b ON a.v2 = b.k"),  # float = int
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_outer_joins_of_views_whose_key_may_be_null(all_epochs):
    """A null-extended row of a view grouped by a nullable column, or of a global aggregate (an empty
    key), would have the key of one of its rows: their presence is part of the key."""
    run_views([
        ("by_v1", "SELECT v1, count(*) AS n FROM t1 GROUP BY v1"),
        ("by_k", "SELECT k, sum(w) AS total FROM t2 GROUP BY k"),
        ("both", "SELECT x.v1, x.n, y.k, y.total FROM by_v1 x FULL JOIN by_k y ON x.v1 = y.k"),
        ("everything", "SELECT count(*) AS n FROM t1"),
        ("sized", "SELECT b.id, e.n FROM t2 b LEFT JOIN everything e ON b.k = e.n"),
        ("sized_right", "SELECT b.id, e.n FROM everything e LEFT JOIN t2 b ON b.k = e.n"),
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_residual_conditions_beside_the_equality(all_epochs):
    """For an outer join the residual decides what matches: a row whose pairs all fail it is kept,
    null-extended, where WHERE would drop it."""
    run_views([
        ("inner", "SELECT a.id, b.id AS bid, b.w FROM t1 a JOIN t2 b ON a.v1 = b.k AND b.w > a.v2"),
        ("left", "SELECT a.id, a.v2, b.id AS bid, b.w FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k AND b.w > a.v2"),
        ("right", "SELECT a.id, b.id AS bid FROM t1 a RIGHT JOIN t2 b ON a.v1 = b.k AND a.s = 'a'"),
        ("full", "SELECT a.id AS aid, b.id AS bid, a.s, b.tag FROM t1 a FULL JOIN t2 b "
                 "ON b.k = a.v1 AND (b.tag = a.s OR a.deleted) AND b.id <> a.id"),
        ("counted", "SELECT a.id, count(b.id) AS n FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k AND b.w >= 1.0 "
                    "GROUP BY a.id"),
    ], all_epochs)


@SETTINGS
@given(epochs("t1", "t2"))
def test_chains_of_three_and_four_joins(all_epochs):
    run_views([
        ("three", "SELECT a.id, b.id AS bid, c.id AS cid, c.s FROM t1 a JOIN t2 b ON a.v1 = b.k "
                  "JOIN t1 c ON c.v1 = b.id"),
        ("outer", "SELECT a.id, b.id AS bid, c.id AS cid, d.id AS did FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k "
                  "FULL JOIN t2 c ON c.k = a.id AND c.w > b.w RIGHT JOIN t1 d ON d.s = b.tag"),
        ("grouped", "SELECT c.s, count(*) AS n, sum(b.w) AS total FROM t1 a JOIN t2 b ON a.v1 = b.k "
                    "LEFT JOIN t1 c ON c.v1 = b.id AND c.id = a.id GROUP BY c.s"),
    ], all_epochs)


def test_left_join_retracts_the_null_extended_row_at_the_first_match_and_restores_it_at_the_last():
    pipeline = Pipeline([("v", "SELECT a.id, b.id AS bid FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k")])
    row = {"v1": 1, "v2": None, "s": None, "deleted": None}
    other = {"w": None, "tag": None, "raw": None}
    pipeline.epoch({"t1": [(1, row, False)], "t2": []})
    assert pipeline.rows["v"] == {(1, None): {"id": 1, "bid": None}}
    pipeline.epoch({"t1": [], "t2": [(5, {**other, "k": 1}, False), (6, {**other, "k": 1}, False)]})
    assert set(pipeline.rows["v"]) == {(1, 5), (1, 6)}
    pipeline.epoch({"t1": [], "t2": [(5, {**other, "k": 2}, False)]})  # a match changes its join key
    assert set(pipeline.rows["v"]) == {(1, 6)}
    pipeline.epoch({"t1": [], "t2": [(6, None, False)]})  # the last match leaves
    assert pipeline.rows["v"] == {(1, None): {"id": 1, "bid": None}}
    pipeline.epoch({"t1": [(1, {**row, "v1": 2}, False)], "t2": []})  # the left row moves to the match
    assert pipeline.rows["v"] == {(1, 5): {"id": 1, "bid": 5}}
    pipeline.epoch({"t1": [(1, None, False)], "t2": [(5, None, False)]})
    assert pipeline.rows["v"] == {} and len(pipeline.states["v"]) == 0


# -- subqueries in FROM and WITH ---------------------------------------------------------------------------


@SETTINGS
@given(epochs("t1", "t2"))
def test_subqueries_in_from_and_with(all_epochs):
    """Each subquery or WITH query runs as an operator nested in the view's, its state under its own
    prefix, its changes the input of the query that reads it."""
    run_views([
        ("filtered_groups", "SELECT x.s, x.n FROM (SELECT s, count(*) AS n FROM t1 GROUP BY s) x WHERE x.n > 1"),
        ("joined_cte", "WITH big AS (SELECT id, v1, s FROM t1 WHERE v1 > 0) "
                       "SELECT b.s, count(*) AS n, sum(c.w) AS total FROM big b JOIN t2 c ON b.v1 = c.k GROUP BY b.s"),
        ("left_of_aggregate", "WITH g AS (SELECT k, sum(w) AS total, count(*) AS n FROM t2 GROUP BY k) "
                              "SELECT a.id, g.total, g.n FROM t1 a LEFT JOIN g ON a.v1 = g.k"),
        ("cte_twice", "WITH p AS (SELECT id, v1 FROM t1 WHERE NOT deleted) "
                      "SELECT x.id, y.id AS yid FROM p x JOIN p y ON x.v1 = y.v1"),
        ("nested", "SELECT * FROM (SELECT s, max(n) AS top, count(*) AS groups FROM "
                   "(SELECT s, v1, count(*) AS n FROM t1 GROUP BY s, v1) q GROUP BY s) r WHERE r.top > 1"),
        ("chained_ctes", "WITH a AS (SELECT id, v1, v2 FROM t1 WHERE v2 IS NOT NULL), "
                         "b AS (SELECT v1, min(v2) AS lo FROM a GROUP BY v1) "
                         "SELECT b.v1, b.lo, t.id FROM b FULL JOIN t2 t ON b.v1 = t.k AND t.w > b.lo"),
    ], all_epochs)


def test_a_subquery_keeps_its_state_under_its_own_prefix():
    pipeline = Pipeline([("v", "WITH g AS (SELECT k, count(*) AS n FROM t2 GROUP BY k) "
                               "SELECT a.id, g.n FROM t1 a JOIN g ON a.v1 = g.k")])
    pipeline.epoch({"t1": [(1, {"v1": 4, "v2": None, "s": None, "deleted": None}, False)],
                    "t2": [(3, {"k": 4, "w": None, "tag": None, "raw": None}, False)]})
    assert pipeline.rows["v"] == {(1, 4): {"id": 1, "n": 1, "k": 4}}
    assert pipeline.states["v"].data == {b'($g)g[4]': b'{"n":1,"c":[0],"s":[0],"m":[]}',
                                         b"j0[4]": b'[[1,4,null,null,null]]', b"j1[4]": b"[[4,1]]"}


# -- IN / EXISTS / NOT EXISTS: semi and anti joins ----------------------------------------------------------


@SETTINGS
@given(epochs("t1", "t2"))
def test_in_exists_and_not_exists(all_epochs):
    """A row is kept (semi) or dropped (anti) when its first match arrives, and the other way round when
    its last match leaves; each row once however many matches it has."""
    run_views([
        ("in_subquery", "SELECT id, s FROM t1 WHERE v1 IN (SELECT k FROM t2 WHERE w > 0) AND s IS NOT NULL"),
        ("exists", "SELECT a.id, a.v2 FROM t1 a WHERE EXISTS (SELECT * FROM t2 b WHERE b.k = a.v1 AND a.s = b.tag)"),
        ("not_exists", "SELECT a.id FROM t1 a WHERE NOT EXISTS (SELECT 1 FROM t2 b WHERE b.k = a.v1 AND b.tag = 'a')"),
        ("grouped", "SELECT s, count(*) AS n FROM t1 a WHERE NOT deleted AND EXISTS "
                    "(SELECT 1 FROM t2 WHERE t2.k = a.v1) GROUP BY s"),
        ("after_join", "SELECT a.id, b.id AS bid FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k "
                       "WHERE NOT EXISTS (SELECT 1 FROM t1 c WHERE c.v1 = b.id) AND a.v2 IN (SELECT w FROM t2)"),
        ("in_aggregate", "SELECT id FROM t1 WHERE v1 IN (SELECT count(*) AS n FROM t2 GROUP BY k)"),
    ], all_epochs)


# -- UNION ALL ---------------------------------------------------------------------------------------------


@SETTINGS
@given(epochs("t1", "t2"))
def test_union_all(all_epochs):
    """The view key is the branch and the branch's key: a row of each branch stays apart from the other
    branches' rows with the same values; views built on a union read it like any view."""
    run_views([
        ("mixed", "SELECT id, v1 AS x, s FROM t1 WHERE v1 > 0 UNION ALL SELECT id, w, tag FROM t2"),
        ("counts", "WITH c AS (SELECT s, count(*) AS n FROM t1 GROUP BY s) "
                   "SELECT s AS label, n FROM c UNION ALL SELECT tag, count(*) FROM t2 GROUP BY tag "
                   "UNION ALL SELECT 'all', count(*) FROM t1"),
        ("joined", "SELECT a.id, b.w FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k UNION ALL SELECT id, w FROM t2"),
        ("same_twice", "SELECT v1 FROM t1 UNION ALL SELECT v1 FROM t1 WHERE deleted"),
        ("over_union", "SELECT x > 0 AS positive, count(*) AS n, sum(x) AS total FROM mixed GROUP BY x > 0"),
    ], all_epochs)


# -- depth-2 chains -------------------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.fixed_dictionaries({"t1": ops("t1")}), min_size=1, max_size=6))
def test_canonical_chain(all_epochs):
    pipeline = Pipeline([
        ("mv1", "SELECT * FROM t1 WHERE deleted = false"),
        ("mv2", "SELECT sum(v1) FROM mv1"),
        ("mv3", "SELECT count(v1) FROM mv1"),
    ], tables=("t1",))
    pipeline.run(all_epochs)
    live = [r for r in pipeline.tables["t1"].rows.values() if r["deleted"] is False]
    values = [r["v1"] for r in live if r["v1"] is not None]
    assert pipeline.rows["mv2"] == {(): {"sum_v1": sum(values) if values else None}}
    assert pipeline.rows["mv3"] == {(): {"count_v1": len(values)}}


@SETTINGS
@given(epochs("t1", "t2"))
def test_depth_two_chains(all_epochs):
    run_views([
        ("proj", "SELECT v1, v2, s FROM t1 WHERE NOT deleted"),  # hidden key id
        ("by_s", "SELECT s, count(*) AS n, sum(v1) AS sv, max(v2) AS top FROM proj GROUP BY s"),
        ("big_groups", "SELECT * FROM by_s WHERE n > 1"),
        ("joined", "SELECT a.v1, b.w FROM proj a JOIN t2 b ON a.v1 = b.k"),
        ("joined_total", "SELECT count(*) AS n, sum(w) AS total, min(v1) AS lo FROM joined"),
    ], all_epochs)


# -- purity and bad input -------------------------------------------------------------------------------


def test_operator_is_pure_replaying_an_epoch_gives_the_same_output():
    pipeline = Pipeline([("g", "SELECT s, sum(v1) AS sv, max(v2) AS top FROM t1 GROUP BY s"),
                         ("j", "SELECT a.id, b.id AS bid FROM t1 a JOIN t2 b ON a.v1 = b.k")])
    row = {"v1": 1, "v2": 2.0, "s": "a", "deleted": False}
    other = {"k": 1, "w": 1.0, "tag": None, "raw": None}
    pipeline.epoch({"t1": [(1, row, False)], "t2": [(7, other, False)]})
    changes = {"t1": pipeline.tables["t1"].write([(2, {**row, "v1": 3}, False), (1, None, False)])}
    for name, operator in pipeline.operators.items():
        state = pipeline.states[name]
        before = dict(state.data)
        inputs = {s: ChangeBatch.from_changes(BASE[s], changes.get(s, [])) for s in operator.plan.sources}
        first = operator.apply_epoch(inputs, state)
        second = operator.apply_epoch(inputs, state)
        assert len(first.changes) and first == second and state.data == before


def test_unknown_upstream_in_the_input_is_refused():
    operator = ViewOperator(plan_view("v", "SELECT * FROM t1", BASE))
    with pytest.raises(ValueError, match=r"view 'v' reads t1, not t2"):
        operator.apply_epoch({"t2": ChangeBatch.empty(T2)}, InMemoryState())


def test_inconsistent_upstream_is_refused():
    operator = ViewOperator(plan_view("g", "SELECT count(*) AS n FROM t1 GROUP BY s", BASE))
    row = {"id": 1, "v1": 1, "v2": None, "s": "a", "deleted": False}
    with pytest.raises(InconsistentChanges, match="group"):
        operator.apply_epoch({"t1": ChangeBatch.from_changes(T1, [Change(Op.DELETE, (1,), row, None)])},
                             InMemoryState())  # never inserted
    with pytest.raises(InconsistentChanges, match="upstream key"):
        operator.apply_epoch({"t1": ChangeBatch.from_changes(T1, [Change(Op.CREATE, (1,), None, row)] * 2)},
                             InMemoryState())


def test_state_keys_and_values_are_documented_json():
    pipeline = Pipeline([("g", "SELECT s, sum(v1) AS sv, min(v2) AS lo FROM t1 GROUP BY s"),
                         ("j", "SELECT a.id, b.id AS bid FROM t1 a JOIN t2 b ON a.v1 = b.k")])
    pipeline.epoch({"t1": [(1, {"v1": 4, "v2": 0.5, "s": "x", "deleted": None}, False)],
                    "t2": [(3, {"k": 4, "w": None, "tag": "t", "raw": b"\x01"}, False)]})
    assert pipeline.states["g"].data == {b'g["x"]': b'{"n":1,"c":[1,0],"s":[4,0],"m":[[[0.5,1]]]}'}
    assert pipeline.states["j"].data == {b"j0[4]": b'[[1,4,0.5,"x",null]]',
                                         b"j1[4]": b'[[3,4,null,"t","AQ=="]]'}


# -- the columnar path of the Spark consumer ------------------------------------------------------------

ONE_VIEW_DEFINITIONS = [
    "SELECT id, v1 + 1 AS x, v2 * 2 AS y, coalesce(v2, v1, 0) AS z FROM t1 WHERE NOT deleted OR v1 IS NULL",
    "SELECT v1, s FROM t1 WHERE v2 > 0 AND s <> 'c'",
    "SELECT s, deleted, count(*) AS n, sum(v1) AS sv, min(v2) AS lo, max(s) AS hi, avg(v1) AS av FROM t1 "
    "GROUP BY s, deleted",
    "SELECT count(*) AS n, sum(v2) AS total FROM t1 WHERE deleted = false AND v2 > 1",
]


def signed_arrow(changes: Sequence[Change]) -> ChangeBatch:
    """The changes as the Spark data source delivers them (one signed row per row image, the rows of a
    change next to each other and sharing an id), paired back into a batch in Arrow."""
    signed = [(weight, T1.normalize(row), i) for i, change in enumerate(changes)
              for weight, row in change.signed_rows()]
    arrow_schema = pa.schema([(c.name, ARROW[c.type]) for c in T1.columns])
    return ChangeBatch.from_signed(T1, pa.Table.from_pylist([row for _, row, _ in signed], arrow_schema),
                                   pa.array([weight for weight, _, _ in signed], pa.int32()),
                                   pa.array([i for _, _, i in signed], pa.int64()))


@SETTINGS
@given(epochs("t1"), st.sampled_from(ONE_VIEW_DEFINITIONS))
def test_signed_columnar_input_gives_what_netted_changes_give(all_epochs, sql):
    """The columnar path (one change per key, from the data source's signed rows) against the netting
    path (an epoch's raw writes, several per key)."""
    operator = ViewOperator(plan_view("v", sql, BASE))
    table = Table(T1)
    by_changes, by_columns = InMemoryState(), InMemoryState()
    for writes in all_epochs:
        before = dict(table.rows)
        raw = table.write(writes["t1"])
        # One change per key and epoch, as every mvlog changelog carries them.
        folded = [c for key in sorted({*before, *table.rows})
                  if (c := change_between(key, before.get(key), table.rows.get(key))) is not None]
        columns = signed_arrow(folded)
        assert columns.one_change_per_key() and columns.to_changes() == folded
        expected = operator.apply_epoch({"t1": ChangeBatch.from_changes(T1, raw)}, by_changes)
        actual = operator.apply_epoch({"t1": columns}, by_columns)
        assert sorted(map(repr, actual.changes.to_changes())) == sorted(map(repr, expected.changes.to_changes()))
        assert actual.state_writes == expected.state_writes
        by_changes.apply(expected.state_writes)
        by_columns.apply(actual.state_writes)


def test_signed_rows_of_one_change_apart_are_netted_back_into_it():
    """Rows of an update that are not next to each other pair as a delete and a create of one key: the
    operator nets them into the update (only the fast path depends on the data source's order)."""
    old, new = {"id": 1, "v1": 1, "v2": None, "s": "a", "deleted": False}, {"id": 1, "v1": 2, "v2": None, "s": "a",
                                                                             "deleted": False}
    other = {"id": 2, "v1": 5, "v2": None, "s": "b", "deleted": False}
    arrow_schema = pa.schema([(c.name, ARROW[c.type]) for c in T1.columns])
    batch = ChangeBatch.from_signed(T1, pa.Table.from_pylist([old, other, new], arrow_schema),
                                    pa.array([-1, 1, 1], pa.int32()), pa.array([7, 8, 7], pa.int64()))
    assert batch.ops.to_pylist() == ["d", "c", "c"] and not batch.one_change_per_key()
    operator = ViewOperator(plan_view("v", "SELECT id, v1 FROM t1", BASE))
    state = InMemoryState()
    operator.apply_epoch({"t1": ChangeBatch.from_changes(T1, [Change(Op.CREATE, (1,), None, old)])}, state)
    out = operator.apply_epoch({"t1": batch}, state)
    assert out.changes.to_changes() == [Change(Op.UPDATE, (1,), {"id": 1, "v1": 1}, {"id": 1, "v1": 2}),
                                        Change(Op.CREATE, (2,), None, {"id": 2, "v1": 5})]
