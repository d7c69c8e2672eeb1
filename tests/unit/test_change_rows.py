"""Cutting the data source's micro-batches into epochs."""

from __future__ import annotations

import pyarrow as pa

from mvlog.connectors.spark.change_rows import arrow_schema, epoch_slices
from mvlog.row_schema import RowSchema

SCHEMA = RowSchema.of({"id": "int", "v": "int"}, ["id"])


def rows(*specs: tuple[int, str, int, int, int, bytes, int | None]) -> pa.Table:
    """(epoch, change type, weight, partition, offset, key, v) per row."""
    names = ["_epoch", "_change_type", "_weight", "_partition", "_offset", "_key", "v"]
    columns = {n: [s[i] for s in specs] for i, n in enumerate(names)}
    columns["id"] = [s[6] for s in specs]
    return pa.Table.from_pydict(columns, schema=arrow_schema(SCHEMA))


def test_epochs_come_in_order_with_their_change_rows_and_barrier_only_epochs_too() -> None:
    batch = rows((30, "insert", 1, 0, 7, b"a", 1),
                 (10, "update_preimage", -1, 1, 2, b"b", 2), (10, "update_postimage", 1, 1, 2, b"b", 3),
                 (10, "barrier", 0, 0, 3, b"", None), (20, "barrier", 0, 0, 5, b"", None),
                 (30, "barrier", 0, 0, 8, b"", None))
    sliced = [(epoch, part.column("_offset").to_pylist()) for epoch, part in epoch_slices(batch)]
    assert sliced == [(10, [2, 2]), (20, []), (30, [7])]
    assert list(epoch_slices(batch.slice(0, 0))) == []
