"""The seed of a view (snapshot backfill) against the incremental operator, with DuckDB as the engine.

A view computed in full by ``seed_sql`` over some upstream rows and decoded by ``SeedDecoder`` must
equal what the operator builds from the same rows as one epoch: the same view rows and operator state
(equivalent group totals and min/max multisets), so that later epochs of updates and deletes give the
same changes whichever way the view started.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvlog.changes import Change, Op
from mvlog.row_schema import ColumnType, Row, RowSchema
from mvlog.views import ChangeBatch, InMemoryState, ViewDefinitionError, ViewOperator, plan_view
from mvlog.views.seed import SeedDecoder, seed_sql

T1 = RowSchema.of({"id": "int", "v1": "int", "v2": "float", "s": "string", "deleted": "boolean"}, ["id"])
T2 = RowSchema.of({"id": "int", "k": "int"}, ["id"])
ARROW = {ColumnType.INT: pa.int64(), ColumnType.FLOAT: pa.float64(), ColumnType.STRING: pa.string(),
         ColumnType.BOOLEAN: pa.bool_(), ColumnType.BYTES: pa.binary()}
VIEWS = [
    "SELECT id, v1 * 2 AS w, s FROM t1 WHERE deleted = false",
    "SELECT s, count(*) AS n, count(v1) AS c, sum(v1) AS total, avg(v1) AS mean, min(v1) AS lo, max(v1) AS hi "
    "FROM t1 WHERE v1 > -3 GROUP BY s",
    "SELECT deleted, s, min(v2) AS lo, max(v2) AS hi, sum(v2) AS total, max(v1 + 1) AS top FROM t1 "
    "GROUP BY deleted, s",
    "SELECT count(*) AS n, min(v1) AS lo, max(s) AS hi, avg(v2) AS mean FROM t1 WHERE deleted",
    "SELECT DISTINCT s, v1 > 0 AS positive FROM t1",
    "SELECT s, count(DISTINCT v1) AS nv, sum(DISTINCT v2) AS sf, count(*) AS n FROM t1 GROUP BY s "
    "HAVING count(*) > 1 AND min(v1) < 3",
    "SELECT count(DISTINCT v2) AS nf, avg(DISTINCT v1) AS av FROM t1 HAVING count(*) > 3",
    "SELECT window.start AS ws, window.end AS we, s, count(*) AS n, max(v2) AS top FROM t1 "
    "GROUP BY window(v1, '3 milliseconds', '1 millisecond'), s",
    "SELECT s, count(*) FILTER (WHERE v1 < 0) AS low, count(DISTINCT v2) FILTER (WHERE v1 BETWEEN 0 AND 2) AS nv, "
    "sum(v1) FILTER (WHERE deleted) AS total, avg(v2) FILTER (WHERE v1 IN (1, 2)) AS mean, "
    "max(v1) FILTER (WHERE v2 > 0) AS hi FROM t1 WHERE length(s) = 1 OR s IS NULL GROUP BY s",
]
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.fixed_dictionaries({
    "v1": st.one_of(st.none(), st.integers(-4, 4)),
    "v2": st.one_of(st.none(), st.sampled_from([-2.5, -0.0, 0.0, 0.5, 1.0, 3.5])),
    "s": st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    "deleted": st.one_of(st.none(), st.booleans())})
snapshots = st.dictionaries(st.integers(0, 30), values, max_size=25)
later = st.lists(st.lists(st.tuples(st.integers(0, 35), st.one_of(st.none(), values)), max_size=10), max_size=4)


def _table(rows: dict[int, dict[str, Any]]) -> pa.Table:
    schema = pa.schema([(c.name, ARROW[c.type]) for c in T1.columns])
    return pa.Table.from_pylist([{"id": key, **row} for key, row in sorted(rows.items())], schema)


def _seed(plan: Any, rows: dict[int, dict[str, Any]], batch_rows: int) -> tuple[list[Row], InMemoryState]:
    """The seed computed by DuckDB and decoded ``batch_rows`` rows at a time, as the backfill does."""
    con = duckdb.connect()
    try:
        con.register("snap", _table(rows))
        result = con.sql(seed_sql(plan, "snap", "duckdb")).to_arrow_table()
    finally:
        con.close()
    decoder = SeedDecoder(plan)
    out: list[Row] = []
    state = InMemoryState()
    for batch in result.to_batches(max_chunksize=batch_rows):
        for piece in decoder.split(batch, batch_rows):
            part = decoder.decode(piece)
            out.extend(part.rows)
            state.apply(part.state)
    return out, state


def test_a_seed_is_decoded_in_slices_of_rows_plus_multiset_entries() -> None:
    """What one decode turns into Python objects is bounded by rows plus min/max values, not by rows:
    a group with many distinct values is a slice of its own."""
    plan = plan_view("mv", "SELECT v1, min(id) AS lo, max(s) AS hi FROM t1 GROUP BY v1", {"t1": T1})
    rows = {k: {"v1": 0 if k < 40 else k % 3, "v2": None, "s": f"s{k % 11}", "deleted": None} for k in range(60)}
    con = duckdb.connect()
    try:
        con.register("snap", _table(rows))
        result = con.sql(seed_sql(plan, "snap", "duckdb")).to_arrow_table().combine_chunks().to_batches()[0]
    finally:
        con.close()
    decoder = SeedDecoder(plan)
    pieces = list(decoder.split(result, 12))
    assert sum(p.num_rows for p in pieces) == result.num_rows == 3
    for piece in pieces:
        entries = sum(len(m or ()) for name in ("_m0", "_m1") for m in piece.column(name).to_pylist())
        assert piece.num_rows + entries <= 12 or piece.num_rows == 1, (piece.num_rows, entries)
    assert len(pieces) >= 2  # group 0 alone has 40 ids
    assert list(decoder.split(result, 10**6)) == [result]


def _same(actual: list[Row], expected: list[Row], schema: RowSchema) -> None:
    by_key = {schema.key_of(r): r for r in actual}
    assert len(by_key) == len(actual), "a key twice in the seed"
    wanted = {schema.key_of(r): r for r in expected}
    assert set(by_key) == set(wanted)
    for key, row in wanted.items():
        for column in schema.columns:
            mine, theirs = by_key[key][column.name], row[column.name]
            if column.type is ColumnType.FLOAT and mine is not None and theirs is not None:
                assert math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-9), (key, column.name, mine, theirs)
            else:
                assert mine == theirs, (key, column.name, mine, theirs)


def _changes(current: dict[int, dict[str, Any]], writes: list[tuple[int, dict[str, Any] | None]]) -> list[Change]:
    """One epoch of writes as changes (one per key: the last write wins), updating ``current``."""
    netted: dict[int, dict[str, Any] | None] = dict(writes)
    changes = []
    for key, new in netted.items():
        before = {"id": key, **current[key]} if key in current else None
        after = {"id": key, **new} if new is not None else None
        if before is None and after is None:
            continue
        op = Op.CREATE if before is None else Op.DELETE if after is None else Op.UPDATE
        changes.append(Change(op, (key,), before, after))
        if new is None:
            current.pop(key, None)
        else:
            current[key] = new
    return changes


@pytest.mark.parametrize("sql", VIEWS)
@SETTINGS
@given(rows=snapshots, epochs=later, batch_rows=st.integers(1, 7))
def test_a_seeded_view_carries_on_exactly_as_one_built_by_the_operator(
        sql: str, rows: dict[int, dict[str, Any]], epochs: list[list[tuple[int, dict[str, Any] | None]]],
        batch_rows: int) -> None:
    plan = plan_view("mv", sql, {"t1": T1})
    operator = ViewOperator(plan)
    built = InMemoryState()
    reads = [Change(Op.READ, (k,), None, {"id": k, **r}) for k, r in rows.items()]
    first = operator.apply_epoch({"t1": ChangeBatch.from_changes(T1, reads)}, built)
    built.apply(first.state_writes)
    seeded_rows, seeded = _seed(plan, rows, batch_rows)
    _same(seeded_rows, [c.after for c in first.changes.to_changes() if c.after is not None], plan.schema)
    assert set(seeded.data) == set(built.data), "the seed keeps state for other groups than the operator"
    current = dict(rows)
    for writes in epochs:  # updates and deletes after the seed: the same changes from either state
        changes = ChangeBatch.from_changes(T1, _changes(current, writes))
        from_built = operator.apply_epoch({"t1": changes}, built)
        from_seed = operator.apply_epoch({"t1": changes}, seeded)
        for output in (from_built, from_seed):
            (built if output is from_built else seeded).apply(output.state_writes)
        seed_changes, built_changes = from_seed.changes.to_changes(), from_built.changes.to_changes()
        for side in ("before", "after"):
            _same([getattr(c, side) for c in seed_changes if getattr(c, side) is not None],
                  [getattr(c, side) for c in built_changes if getattr(c, side) is not None], plan.schema)
        assert set(seeded.data) == set(built.data)


@pytest.mark.parametrize(("sql", "views"), [
    ("SELECT a.id, b.k FROM t1 a JOIN t2 b ON a.v1 = b.k", "t1 and t2"),
    ("SELECT a.id, b.k FROM t1 a LEFT JOIN t2 b ON a.v1 = b.k AND b.k > a.id", "t1 and t2"),
    ("SELECT a.id, b.k FROM t1 a FULL JOIN t2 b ON a.v1 = b.k", "t1 and t2"),
    ("SELECT a.id, b.id AS bid FROM t1 a RIGHT JOIN t1 b ON a.v1 = b.v1", "t1"),  # a self-join: one upstream
    ("SELECT a.id, c.id AS cid FROM t1 a JOIN t2 b ON a.v1 = b.k LEFT JOIN t1 c ON c.v1 = b.k", "t1 and t2"),
])
def test_a_join_cannot_be_seeded_from_one_snapshot(sql: str, views: str) -> None:
    plan = plan_view("mv", sql, {"t1": T1, "t2": T2})
    with pytest.raises(ViewDefinitionError, match=f"joins {views}: snapshot backfill reads one upstream"):
        seed_sql(plan, "snap")
    with pytest.raises(ViewDefinitionError, match="use --backfill chunked"):
        SeedDecoder(plan)


def test_a_top_n_cannot_be_seeded_from_a_snapshot() -> None:
    plan = plan_view("mv", "SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY s ORDER BY v1) AS rn FROM t1) "
                           "WHERE rn <= 2", {"t1": T1})
    with pytest.raises(ViewDefinitionError, match=r"'mv' is a top-N: .*; use --backfill chunked"):
        seed_sql(plan, "snap")
    with pytest.raises(ViewDefinitionError, match="use --backfill chunked"):
        SeedDecoder(plan)


@pytest.mark.parametrize("sql", [
    "SELECT x.s, x.n FROM (SELECT s, count(*) AS n FROM t1 GROUP BY s) x",
    "WITH f AS (SELECT id, v1 FROM t1 WHERE v1 > 0) SELECT * FROM f",
])
def test_a_view_over_a_subquery_cannot_be_seeded_from_a_snapshot(sql: str) -> None:
    plan = plan_view("mv", sql, {"t1": T1, "t2": T2})
    with pytest.raises(ViewDefinitionError, match=r"reads a subquery or WITH query: .* use --backfill chunked"):
        seed_sql(plan, "snap")
