"""Incremental top-N per partition: each partition's rows in state, the changes of its first N out.

A partition keeps all its rows, not only the first N (``t[...]``, see ``state_codec``; the array holds
the PARTITION BY values): when a row of the top N is deleted or falls back, the next one moves up
without rereading the input. An epoch reads only the partitions its changes touch, ranks each before
and after the epoch's changes, and emits the difference of the two top Ns as signed view rows: a row
that enters, leaves, or changes rank (when ``rn`` is selected) or values.

The order is the ORDER BY terms (each ascending or descending, NULLs first or last as planned), then
the sources' key ascending, so ties rank the same here and in the rendered SQL.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from functools import cmp_to_key
from typing import Any

import pyarrow as pa

from mvlog.changes import Change
from mvlog.row_schema import ColumnType, Key, Row, RowSchema
from mvlog.views.batch import WEIGHT
from mvlog.views.deltas import consolidate
from mvlog.views.errors import InconsistentChanges
from mvlog.views.evaluate import evaluate
from mvlog.views.expr import Expr, RowNumber
from mvlog.views.query import Query
from mvlog.views.state import StateReader
from mvlog.views.state_codec import TOP_N_TAG, decode_value, dumps, encode_key, encode_value, key_value, loads

# One row of a partition: (ORDER BY values, tiebreak values (its identity), output values).
Entry = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]


class TopNStage:
    """Turns a filtered batch of signed rows into the changes of the top-N rows it touches."""

    def __init__(self, query: Query, schema: RowSchema) -> None:
        assert query.top_n is not None
        self.top_n = query.top_n
        self.schema = schema
        self.names = [o.name for o in query.outputs]
        self.rank_at = [i for i, o in enumerate(query.outputs) if isinstance(o.expr, RowNumber)]
        self.values: list[Expr] = [o.expr for o in query.outputs if not isinstance(o.expr, RowNumber)]
        self.partition_types = [p.type for p in self.top_n.partition]
        self.order_types = [k.expr.type for k in self.top_n.order]
        self.tiebreak_types = [t.type for t in self.top_n.tiebreak]
        self.value_types = [v.type for v in self.values]
        self._sort_key = cmp_to_key(self._compare)

    def apply(self, batch: pa.Table, state: StateReader, writes: dict[bytes, bytes | None]) -> list[Change]:
        if batch.num_rows == 0:
            return []
        weights = batch.column(WEIGHT).to_pylist()

        def column(expr: Expr) -> list[Any]:
            return list(evaluate(expr, batch).to_pylist())

        partitions = [column(p) for p in self.top_n.partition]
        orders = [column(k.expr) for k in self.top_n.order]
        tiebreaks = [column(t) for t in self.top_n.tiebreak]
        values = [column(v) for v in self.values]
        # Summed per row: a join's epoch may assert and retract one joined row (they cancel).
        deltas: dict[Key, Counter[Entry]] = {}
        for i, weight in enumerate(weights):
            partition = tuple(key_value(p[i], k) for p, k in zip(partitions, self.partition_types, strict=True))
            entry = (tuple(o[i] for o in orders), tuple(t[i] for t in tiebreaks), tuple(v[i] for v in values))
            deltas.setdefault(partition, Counter())[entry] += weight
        keys = {partition: encode_key(TOP_N_TAG, partition, self.partition_types) for partition in deltas}
        stored = state.get_many(list(keys.values()))
        signed: list[tuple[int, Row]] = []
        for partition, changes in deltas.items():
            raw = stored.get(keys[partition])
            rows = self._decode(raw) if raw is not None else {}
            before = self._top(rows)
            for entry, weight in sorted(changes.items(), key=lambda change: change[1]):  # retractions first
                if weight not in (-1, 0, 1):
                    raise InconsistentChanges(f"top-N partition {partition!r}: row {entry!r} has net count "
                                              f"{weight} in one epoch")
                if weight < 0:
                    if rows.pop(entry[1], None) != entry:
                        raise InconsistentChanges(f"top-N partition {partition!r}: retracted row {entry!r} is "
                                                  "not in the operator state")
                elif weight > 0:
                    rows[entry[1]] = entry
            after = self._top(rows)
            if before != after:
                signed.extend((-1, self._row(rank, entry)) for rank, entry in enumerate(before, 1))
                signed.extend((1, self._row(rank, entry)) for rank, entry in enumerate(after, 1))
            writes[keys[partition]] = self._encode(rows) if rows else None
        return consolidate(signed, self.schema)

    def _top(self, rows: dict[tuple[Any, ...], Entry]) -> list[Entry]:
        return heapq.nsmallest(self.top_n.limit, rows.values(), key=self._sort_key)

    def _compare(self, a: Entry, b: Entry) -> int:
        for sort, x, y in zip(self.top_n.order, a[0], b[0], strict=True):
            if x is None or y is None:
                if x is None and y is None:
                    continue
                return (-1 if x is None else 1) * (1 if sort.nulls_first else -1)
            if x != y:
                result = -1 if x < y else 1
                return -result if sort.descending else result
        for x, y in zip(a[1], b[1], strict=True):  # the sources' key, ascending, NULLs first (Spark's default)
            if x != y:
                if x is None or y is None:
                    return -1 if x is None else 1
                return -1 if x < y else 1
        return 0

    def _row(self, rank: int, entry: Entry) -> Row:
        values = list(entry[2])
        for position in self.rank_at:
            values.insert(position, rank)
        return dict(zip(self.names, values, strict=True))

    # -- state encoding -----------------------------------------------------------------------------

    def _encode(self, rows: dict[tuple[Any, ...], Entry]) -> bytes:
        def encoded(values: Sequence[Any], types: Sequence[ColumnType | None]) -> list[Any]:
            return [encode_value(v, t) for v, t in zip(values, types, strict=True)]

        data: bytes = dumps([[encoded(order, self.order_types), encoded(ident, self.tiebreak_types),
                              encoded(values, self.value_types)]
                             for order, ident, values in sorted(rows.values(), key=self._sort_key)])
        return data

    def _decode(self, data: bytes) -> dict[tuple[Any, ...], Entry]:
        def decoded(values: Sequence[Any], types: Sequence[ColumnType | None]) -> tuple[Any, ...]:
            return tuple(decode_value(v, t) for v, t in zip(values, types, strict=True))

        rows: dict[tuple[Any, ...], Entry] = {}
        for order, ident, values in loads(data):
            entry = (decoded(order, self.order_types), decoded(ident, self.tiebreak_types),
                     decoded(values, self.value_types))
            rows[entry[1]] = entry
        return rows
