"""Micro-batches of the ``mvlog`` data source, cut into their epochs without leaving Arrow.

A batch holds whole epochs of one upstream as signed rows (``_weight`` -1 for a row before a change,
+1 for the row after it) plus one ``barrier`` row per partition and epoch, in the shape of
:func:`mvlog.connectors.spark_source.arrow_schema`. An epoch whose barriers are its only rows still
has to be committed (its barrier goes into the view's changelog), so every epoch is yielded.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc


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
        yield epoch, rows.filter(pc.not_equal(rows.column("_change_type"), "barrier"))


def one_change_per_key(rows: pa.Table) -> bool:
    """Whether no key changes twice in these rows (then each key has at most one signed row per sign).

    The rows of one change share its partition and offset, and a key always lives in one partition,
    so there is one change per key exactly when there are as many distinct keys as distinct changes.
    """
    if len(rows) == 0:
        return True
    changes = pc.add(pc.multiply(rows.column("_partition").cast(pa.int64()), 1 << 40), rows.column("_offset"))
    distinct_changes: int = pc.count_distinct(changes).as_py()
    distinct_keys: int = pc.count_distinct(rows.column("_key")).as_py()
    return distinct_changes == distinct_keys
