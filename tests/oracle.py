"""The independent oracle: a view evaluated in full by DuckDB (or Spark SQL) over its upstreams' rows.

Invariant I1 says rows(d, e) = Q(rows(u, e)) for every committed epoch e of d; the tests fold each
changelog up to every barrier and compare with this evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

from mvlog.changes import Epoch, apply_changes
from mvlog.row_schema import ColumnType, Key, Row, RowSchema
from mvlog.views import ViewPlan, to_duckdb_sql

ARROW = {ColumnType.INT: pa.int64(), ColumnType.FLOAT: pa.float64(), ColumnType.STRING: pa.string(),
         ColumnType.BOOLEAN: pa.bool_(), ColumnType.BYTES: pa.binary()}


def duckdb_view_rows(plan: ViewPlan, upstreams: Mapping[str, tuple[RowSchema, list[Row]]]) -> dict[Key, Row]:
    """Q(rows(u)) computed from scratch by DuckDB, keyed by the view's key."""
    con = duckdb.connect()
    for name, (schema, rows) in upstreams.items():
        arrow_schema = pa.schema([(c.name, ARROW[c.type]) for c in schema.columns])
        con.register(name, pa.Table.from_pylist([schema.normalize(r) for r in rows], arrow_schema))
    result = con.execute(to_duckdb_sql(plan, {s: s for s in plan.sources}))
    names = [d[0] for d in result.description]
    rows = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    by_key = {plan.schema.key_of(row): row for row in rows}
    assert len(by_key) == len(rows), f"{plan.name}: the view's key is not unique in the oracle's result"
    return by_key


def assert_same_rows(name: str, actual: Mapping[Key, Row], expected: Mapping[Key, Row], schema: RowSchema,
                     context: Any = "") -> None:
    assert set(actual) == set(expected), f"{name} {context}: keys differ: {dict(actual)} != {dict(expected)}"
    for key, row in expected.items():
        for column in schema.columns:
            mine, theirs = actual[key][column.name], row[column.name]
            where = (name, context, key, column.name, mine, theirs)
            if column.type is ColumnType.FLOAT and mine is not None and theirs is not None:
                assert math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-9), where
            else:
                assert mine == theirs, where


def rows_by_epoch(epochs: list[Epoch]) -> dict[int, dict[Key, Row]]:
    """The changelog summed up to each barrier: epoch -> rows."""
    rows: dict[Key, Row] = {}
    out: dict[int, dict[Key, Row]] = {}
    for epoch in epochs:
        apply_changes(rows, epoch.changes)
        out[epoch.epoch] = dict(rows)
    return out


def rows_at(history: dict[int, dict[Key, Row]], epoch: int) -> dict[Key, Row]:
    """rows(u, e): the upstream's rows at its last committed epoch at or before ``epoch``."""
    earlier = [e for e in history if e <= epoch]
    return history[max(earlier)] if earlier else {}
