"""The signed-row shape of a changelog in Arrow: what the ``mvlog`` data source and the log cache serve.

Both the Kafka read path of the Spark data source and the Faust log-cache worker build the same record
batches with :class:`SignedRowBuilder`, so a reader cannot tell where an epoch came from. Columns:
``_epoch``, ``_change_type`` (Delta change-data-feed names, plus one ``barrier`` row per partition and
epoch), ``_weight`` (+1 / -1, 0 for barriers), ``_partition``, ``_offset``, ``_key`` (the Avro key
bytes), then the view's columns (null on barrier rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from mvlog.changes import Change
from mvlog.row_schema import ColumnType, Row, RowSchema

META_COLUMNS = ("_epoch", "_change_type", "_weight", "_partition", "_offset", "_key")
BARRIER = "barrier"
_ARROW_TYPES = {ColumnType.INT: pa.int64(), ColumnType.FLOAT: pa.float64(), ColumnType.STRING: pa.string(),
                ColumnType.BOOLEAN: pa.bool_(), ColumnType.BYTES: pa.binary()}


def arrow_schema(schema: RowSchema) -> pa.Schema:
    meta = [pa.field("_epoch", pa.int64()), pa.field("_change_type", pa.string()), pa.field("_weight", pa.int32()),
            pa.field("_partition", pa.int32()), pa.field("_offset", pa.int64()), pa.field("_key", pa.binary())]
    return pa.schema(meta + [pa.field(c.name, _ARROW_TYPES[c.type]) for c in schema.columns])


def change_rows(change: Change) -> Iterator[tuple[str, int, Row]]:
    """A change as signed rows: the retraction of ``before`` and the assertion of ``after``."""
    if change.before is not None:
        yield ("update_preimage" if change.after is not None else "delete"), -1, change.before
    if change.after is not None:
        yield ("update_postimage" if change.before is not None else "insert"), 1, change.after


class SignedRowBuilder:
    """Accumulates one partition's signed rows column by column; :meth:`flush` makes a record batch."""

    def __init__(self, schema: RowSchema, partition: int) -> None:
        self.target = arrow_schema(schema)
        self.partition = partition
        self._names = schema.names
        self._columns: dict[str, list[Any]] = {f.name: [] for f in self.target}

    def __len__(self) -> int:
        return len(self._columns["_epoch"])

    def add_change(self, epoch: int, offset: int, key: bytes, change: Change) -> None:
        columns = self._columns
        for change_type, weight, row in change_rows(change):
            columns["_epoch"].append(epoch)
            columns["_change_type"].append(change_type)
            columns["_weight"].append(weight)
            columns["_partition"].append(self.partition)
            columns["_offset"].append(offset)
            columns["_key"].append(key)
            for name in self._names:
                columns[name].append(row.get(name))

    def add_barrier(self, epoch: int, offset: int) -> None:
        columns = self._columns
        for name, value in (("_epoch", epoch), ("_change_type", BARRIER), ("_weight", 0),
                            ("_partition", self.partition), ("_offset", offset), ("_key", b"")):
            columns[name].append(value)
        for name in self._names:
            columns[name].append(None)

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self._columns, schema=self.target)
        for values in self._columns.values():
            values.clear()
        return batch
