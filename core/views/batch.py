"""Signed input rows as one Arrow table, the unit every expression of an epoch is evaluated on.

Each row of the batch is one signed row of the epoch: for a single source its values, for a join the
values of the matched rows (NULLs for a source an outer join null-extends), plus its weight
(``WEIGHT``: -1 retraction, +1 assertion). Only the columns the query reads are converted.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from mvlog.views.deltas import Values
from mvlog.views.evaluate import arrow_type, column_field
from mvlog.views.expr import ColumnRef, walk
from mvlog.views.query import PRESENT, Query

WEIGHT = "__weight"

JoinedRow = tuple[int, tuple[Values | None, ...]]  # weight, values of each side (None: null-extended)


def referenced_columns(query: Query) -> set[tuple[int, str]]:
    """(side, column) pairs the query's expressions read."""
    exprs = [o.expr for o in query.outputs] + list(query.group_by)
    exprs += [call.arg for call in query.aggregates if call.arg is not None]
    exprs += [call.filter for call in query.aggregates if call.filter is not None]
    if query.where is not None:
        exprs.append(query.where)
    if query.window is not None:
        exprs.append(query.window.time)
    if query.top_n is not None:
        exprs += [*query.top_n.partition, *(k.expr for k in query.top_n.order), *query.top_n.tiebreak]
    return {(e.side, e.column) for expr in exprs for e in walk(expr) if isinstance(e, ColumnRef)}


def build_batch(query: Query, rows: Sequence[JoinedRow], columns: set[tuple[int, str]]) -> pa.Table:
    """The batch of ``rows``; a side whose values are None (null-extended by an outer join) gives NULLs,
    and its ``PRESENT`` pseudo-column NULL instead of TRUE."""
    arrays: dict[str, pa.Array] = {}
    for side, source in enumerate(query.sources):
        for index, column in enumerate(source.schema.columns):
            if (side, column.name) in columns:
                arrays[column_field(side, column.name)] = pa.array(
                    [None if (row := values[side]) is None else row[index] for _, values in rows],
                    arrow_type(column.type))
        if (side, PRESENT) in columns:
            arrays[column_field(side, PRESENT)] = pa.array(
                [None if values[side] is None else True for _, values in rows], pa.bool_())
    arrays[WEIGHT] = pa.array([weight for weight, _ in rows], pa.int64())
    return pa.table(arrays)
