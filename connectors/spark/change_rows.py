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
import pyarrow.compute as pc

from mvlog.changes import Change
from mvlog.row_schema import ColumnType, Row, RowSchema
from mvlog.schemas.codec import native_module

_native = native_module()  # appends a change's signed rows in one call; None: the loop below does
_DICT_OR_NONE = (dict, type(None))

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
    return _signed_images(change.before, change.after)


def _signed_images(before: Row | None, after: Row | None) -> Iterator[tuple[str, int, Row]]:
    if before is not None:
        yield ("update_preimage" if after is not None else "delete"), -1, before
    if after is not None:
        yield ("update_postimage" if before is not None else "insert"), 1, after


class SignedRowBuilder:
    """Accumulates one partition's signed rows column by column; :meth:`flush` makes a record batch."""

    def __init__(self, schema: RowSchema, partition: int) -> None:
        self.target = arrow_schema(schema)
        self.partition = partition
        self._names = tuple(schema.names)
        self._columns: dict[str, list[Any]] = {f.name: [] for f in self.target}
        self._lists = list(self._columns.values())  # in the target's order: the meta columns, then the names

    def __len__(self) -> int:
        return len(self._columns["_epoch"])

    def add_change(self, epoch: int, offset: int, key: bytes, change: Change) -> None:
        self.add_images(epoch, offset, key, change.before, change.after)

    def add_images(self, epoch: int, offset: int, key: bytes, before: Row | None, after: Row | None) -> None:
        """A change given by its row images: the retraction of ``before``, then the assertion of ``after``."""
        if _native is not None and type(before) in _DICT_OR_NONE and type(after) in _DICT_OR_NONE:
            _native.append_signed_rows(self._lists, self._names, epoch, self.partition, offset, key, before, after)
            return
        columns = self._columns
        for change_type, weight, row in _signed_images(before, after):
            columns["_epoch"].append(epoch)
            columns["_change_type"].append(change_type)
            columns["_weight"].append(weight)
            columns["_partition"].append(self.partition)
            columns["_offset"].append(offset)
            columns["_key"].append(key)
            for name in self._names:
                columns[name].append(row.get(name))

    def add_changes(self, epoch: int, changes: list[tuple[int, bytes, Row | None, Row | None]]) -> None:
        """:meth:`add_images` of each ``(offset, key, before, after)`` of one epoch's changes."""
        if _native is not None and all(type(c[2]) in _DICT_OR_NONE and type(c[3]) in _DICT_OR_NONE for c in changes):
            _native.append_changes(self._lists, self._names, epoch, self.partition, changes)
            return
        for offset, key, before, after in changes:
            self.add_images(epoch, offset, key, before, after)

    def add_barrier(self, epoch: int, offset: int) -> None:
        columns = self._columns
        for name, value in (("_epoch", epoch), ("_change_type", BARRIER), ("_weight", 0),
                            ("_partition", self.partition), ("_offset", offset), ("_key", b"")):
            columns[name].append(value)
        for name in self._names:
            columns[name].append(None)

    def flush_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """:meth:`flush` cut into record batches of at most ``max_rows`` rows."""
        batch = self.flush()
        for start in range(0, batch.num_rows, max_rows):
            yield batch.slice(start, max_rows)

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self._columns, schema=self.target)
        for values in self._columns.values():
            values.clear()
        return batch


def end_marker(schema: RowSchema, epoch: int) -> pa.Table:
    """One barrier row at ``epoch`` in partition -1 (no Kafka partition has it): the last epoch of a join's
    micro-batch, which may be none of the read view's epochs (``alignWith`` in
    :mod:`mvlog.connectors.spark.spark_source`). :func:`epoch_slices` yields the epoch with no rows, so the
    consumer sees where the micro-batch ends and reads the join's other upstreams up to there."""
    rows = SignedRowBuilder(schema, -1)
    rows.add_barrier(epoch, -1)
    return pa.Table.from_batches([rows.flush()])


# --- micro-batches of signed rows, cut into their epochs without leaving Arrow --------------------------
#
# An epoch whose barriers are its only rows still has to be committed (its barrier goes into the
# view's changelog), so every epoch is yielded.


def epoch_slices(batch: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """(epoch, its change rows), epochs ascending; barrier rows are dropped."""
    if len(batch) == 0:
        return
    ordered = batch.sort_by("_epoch")
    counts = pc.value_counts(ordered.column("_epoch"))  # in order of appearance: ascending
    start = 0
    for epoch, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
        rows = ordered.slice(start, count)
        start += count
        yield epoch, rows.filter(pc.not_equal(rows.column("_change_type"), BARRIER))
