"""How many epochs one streaming micro-batch admits.

A view that was stopped for an hour must not collect the whole hour into one micro-batch: the driver
holds a micro-batch's changes while it computes the view (I4). Spark's Kafka source bounds a batch in
offsets (``maxOffsetsPerTrigger``); mvlog's offsets are epochs, so a batch is bounded in epochs and in
records, and always admits at least one whole epoch however large it is (an epoch is never split).
"""

from __future__ import annotations

from collections.abc import Sequence


def last_admitted(epochs: Sequence[tuple[int, int]], max_epochs: int | None, max_records: int | None) -> int | None:
    """The last epoch of a micro-batch over ``epochs`` ((epoch, records) pairs, ascending), or None
    when there is none."""
    if not epochs:
        return None
    admitted = epochs[: max_epochs] if max_epochs is not None else epochs
    if max_records is not None:
        total = 0
        for count, (_, records) in enumerate(admitted):
            total += records
            if total > max_records and count > 0:
                return admitted[count - 1][0]
    return admitted[-1][0]
