"""Executor side of a view whose operator runs in Spark's tasks: one changelog partition's epochs,
computed, written to Kafka in the partition's own transactions, and staged in Redis.

A task gets one upstream partition's signed rows of a micro-batch (``mapInArrow`` over the data
source's read; upstream partition ``p`` holds exactly view partition ``p``'s keys, see
:mod:`mvlog.views.partitioning`). For its partition it:

1. makes the partition's transactional producer (``<prefix>.<view>.p<partition>``): its
   ``init_transactions`` fences any earlier attempt of this partition (a retried or speculative task, a
   task of a consumer whose driver died) and aborts that attempt's open transaction;
2. reads the barriers the partition committed after the view's MCE, and writes only the epochs not
   among them, each in a transaction of its own (:func:`mvlog.partition_epochs.resume_partition`): a
   partition's committed epoch is never written twice;
3. stages every epoch's rows in Redis (:class:`~mvlog.connectors.redis.partition_staging.PartitionStaging`),
   whether written now or found committed (the operator is stateless, so recomputing an epoch gives
   the changes its committed attempt holds; the counts are checked against its barrier);
4. returns one small row per epoch: partition, epoch, barrier offset, records, staged counts, and
   whether this attempt wrote it. The driver commits each epoch in Redis from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, encode_batch
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.epoch_commit import commit_from_encoded
from mvlog.connectors.redis.partition_staging import PartitionStaging
from mvlog.partition_epochs import PartitionBarrier, prev_epochs, require_next, resume_partition
from mvlog.services.pipeline.reading import EpochBatches, batches_from_arrow
from mvlog.views import ViewOperator, ViewPlan
from mvlog.views.state import InMemoryState

#: One row per (partition, epoch) a task handled: what the driver needs to commit the epoch.
RESULT_SCHEMA = pa.schema([
    ("partition", pa.int32()), ("epoch", pa.int64()), ("offset", pa.int64()), ("records", pa.int64()),
    ("puts", pa.int64()), ("deletes", pa.int64()), ("order_puts", pa.int64()), ("order_deletes", pa.int64()),
    ("written", pa.bool_()),
])


def partition_transactional_id(settings: Settings, view: str, partition: int) -> str:
    """The transactional id of the writer of one partition of ``view`` (fences that partition's attempts)."""
    return f"{settings.topic_prefix}.{view}.p{partition}"


@dataclass(frozen=True)
class PartitionJob:
    """What every task of one micro-batch needs (pickled to the executors with the task function)."""

    settings_json: str
    view: CatalogEntry
    upstream: CatalogEntry
    plan: ViewPlan
    after: int  # the view's MCE: epochs at or below it are skipped
    start_offsets: dict[int, int]  # view partition -> first offset after the MCE's barrier
    next_epoch: int | None  # the upstream's first committed epoch after the MCE (its epoch index)
    #: Called in the task with (partition, epoch) after this attempt wrote and staged that epoch: the
    #: fault-injection tests kill the driver there (a partition committed, the others not yet).
    on_written: Callable[[int, int], None] | None = None

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``'s function: the task's rows in, one result row per partition and epoch out."""
        table = _table(batches)
        if table is None:
            return
        for partition in pc.unique(table.column("_partition")).to_pylist():
            rows = table.filter(pc.equal(table.column("_partition"), partition))
            results = PartitionEpochs(self, partition).run(rows)
            if results:
                yield pa.RecordBatch.from_pylist(results, schema=RESULT_SCHEMA)


def _table(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    collected = list(batches)
    return pa.Table.from_batches(collected) if collected else None


class PartitionEpochs:
    """One partition's epochs of one micro-batch, in one task (see the module's docstring)."""

    def __init__(self, job: PartitionJob, partition: int) -> None:
        self.job, self.partition = job, partition
        self.settings = Settings.model_validate_json(job.settings_json)

    def run(self, rows: pa.Table) -> list[dict[str, Any]]:
        job, partition, view = self.job, self.partition, self.job.view
        epochs: EpochBatches = {}
        batches_from_arrow(rows, job.upstream, epochs)
        todo = sorted(e for e in epochs if e > job.after)
        if not todo:
            return []
        require_next(partition, job.after, todo, job.next_epoch)
        writer = ChangelogWriter(self.settings, view.name, view.key_columns, view.partitions,
                                 transactional_id=partition_transactional_id(self.settings, view.name, partition),
                                 partition=partition)  # fences every earlier attempt of the partition
        staging = PartitionStaging(redis_client.connect(self.settings), self.settings.topic_prefix)
        try:
            found = partition_barriers(self.settings, view.name, partition, job.start_offsets.get(partition, 0))
            committed = resume_partition(partition, job.after, todo, found)
            operator, prev = ViewOperator(job.plan), prev_epochs(job.after, todo)
            results: list[dict[str, Any]] = []
            for epoch in todo:
                output = operator.apply_epoch(epochs[epoch], InMemoryState())  # stateless: reads nothing
                encoded = encode_batch(view.key_columns, output.changes)
                barrier = committed.get(epoch)
                if barrier is None:
                    entry = writer.commit_batches(epoch, prev[epoch], [encoded]).index[partition]
                    barrier = PartitionBarrier(epoch, prev[epoch], entry.offset, entry.records)
                elif barrier.records != len(encoded.keys):
                    raise RuntimeError(f"{view.name} partition {partition}: epoch {epoch} committed {barrier.records} "
                                       f"change(s); recomputed, it has {len(encoded.keys)}")
                rows_left = commit_from_encoded(epoch, output.changes.keys, encoded, {})
                counts = staging.stage(view.name, partition, rows_left)
                if job.on_written is not None and epoch not in committed:
                    job.on_written(partition, epoch)
                results.append({"partition": partition, "epoch": epoch, "offset": barrier.offset,
                                "records": barrier.records, "puts": counts.puts, "deletes": counts.deletes,
                                "order_puts": counts.order_puts, "order_deletes": counts.order_deletes,
                                "written": epoch not in committed})
            return results
        finally:
            writer.close()
            staging.redis.close()
