"""A snapshot backfill's first epoch written by Spark's tasks, one per view partition, for a view whose
operator runs in tasks (``Settings.operators_in_tasks``; :mod:`mvlog.services.pipeline.task_epochs`).

The seed at the snapshot's epoch E (:func:`~mvlog.views.seed.seed_sql`: the view's rows, or per group
the totals its operator state holds) is one row per view row or group, and each decodes alone
(:class:`~mvlog.views.seed.SeedDecoder`). So the seed query's rows get the partition of the view row
they become (the view key's vnode; a group's values for a GROUP BY: :class:`RouteSeed`), Spark
shuffles them so that task ``p`` holds partition ``p``'s, and each task (:class:`SeedJob`):

1. makes the partition's transactional writer (``<prefix>.<view>.p<p>``), fencing an earlier attempt,
   and looks for the partition's barrier of E (an earlier attempt that committed it);
2. decodes its rows ``snapshot_load_batch_rows`` at a time into view rows and operator state, stages
   each batch in Redis for epoch E and partition ``p`` (:class:`PartitionStaging`) and, unless E is
   committed in the partition already, sends its changes in the partition's one transaction of E
   (its barrier last);
3. returns one small row: the barrier's offset, the records, the staged counts.

The driver commits E in Redis from those rows, as every epoch of the task path
(:func:`~mvlog.services.pipeline.task_epochs.commit_partition_results`). Nothing of the seed passes
through the driver, and a task holds its partition's seed in Arrow and one batch as Python objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import IntegerType, StructField, StructType

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, EncodedBatch, encode_batch
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.epoch_commit import commit_from_encoded
from mvlog.connectors.redis.partition_staging import PartitionStaging, StagedCounts
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.partition_epochs import resume_partition
from mvlog.services.pipeline.partition_tasks import (
    RESULT_DDL,
    RESULT_SCHEMA,
    ROUTE_TOKEN,
    VIEW_PARTITION,
    own_partition,
    partition_transactional_id,
)
from mvlog.views import ChangeBatch, ViewPlan
from mvlog.views.routing import GroupRouting, partitions_table, view_key_partitions
from mvlog.views.seed import SeedDecoder, group_column


@dataclass(frozen=True)
class RouteSeed:
    """``mapInArrow``'s function before the shuffle: each seed row gets the partition of the view row
    it becomes (and that partition's routing token)."""

    plan: ViewPlan
    partitions: int

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tokens = pa.array(partition_tokens(self.partitions), pa.int32())
        for batch in batches:
            table = pa.Table.from_batches([batch])
            parts = self.partitions_of(table)
            yield from table.append_column(VIEW_PARTITION, parts).append_column(ROUTE_TOKEN, tokens.take(parts)) \
                .to_batches()

    def partitions_of(self, seed: pa.Table) -> pa.Array:
        if self.plan.is_aggregate:  # a group's row: its GROUP BY values are the view key's
            groups = [seed.column(group_column(i)) for i in range(len(self.plan.query.group_by))]
            return GroupRouting(self.plan, self.partitions).partitions_of_group_values(groups, seed.num_rows)
        return view_key_partitions(self.plan.schema, seed, partitions_table(self.partitions))


@dataclass(frozen=True)
class SeedJob:
    """What every task of the seed needs (pickled to the executors with the task function)."""

    settings_json: str
    view: CatalogEntry
    plan: ViewPlan
    epoch: int  # the snapshot's: the view's first
    producer_config: dict[str, Any]  # the load's transaction timeout and bounded queue

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``'s function: the task's shuffled seed rows in, the partition's result row out. A
        partition without a seed row still gets its barrier of E (its task's index is its partition)."""
        if (own := own_partition(batches, VIEW_PARTITION)) is None:
            return
        partition, rows = own
        seed = rows.drop_columns([VIEW_PARTITION, ROUTE_TOKEN]) if rows is not None else None
        yield pa.RecordBatch.from_pylist([self.load(partition, seed)], schema=RESULT_SCHEMA)

    def load(self, partition: int, seed: pa.Table | None) -> dict[str, Any]:
        """Stage partition ``partition``'s seed and commit its epoch E to Kafka (unless committed)."""
        settings = Settings.from_executor_json(self.settings_json)
        view, epoch = self.view, self.epoch
        staging = PartitionStaging(redis_client.task_client(settings), settings.topic_prefix)
        decoder, budget = SeedDecoder(self.plan), settings.snapshot_load_batch_rows
        staged = [StagedCounts(0, 0, 0, 0)]

        def batches() -> Iterator[EncodedBatch]:
            for batch in seed.to_batches(max_chunksize=budget) if seed is not None else ():
                for part in decoder.split(batch, budget):
                    decoded = decoder.decode(part)
                    schema = self.plan.schema
                    reads = ChangeBatch.from_changes(schema, [Change(Op.READ, schema.key_of(row), None, row)
                                                              for row in decoded.rows])
                    encoded = encode_batch(view.key_columns, reads)
                    commit = commit_from_encoded(epoch, reads.keys, encoded, {}, state_puts=decoded.state)
                    staged.append(staging.stage(view.name, partition, commit, fresh=False))
                    yield encoded

        writer = ChangelogWriter(settings, view.name, view.key_columns, view.partitions,
                                 transactional_id=partition_transactional_id(settings, view.name, partition),
                                 producer_config=self.producer_config, partition=partition)
        try:
            staging.clear(view.name, epoch, partition)  # this attempt's staging grows batch by batch
            barriers = partition_barriers(settings, view.name, partition, 0)
            committed = resume_partition(partition, 0, [epoch], barriers).get(epoch)
            if committed is None:
                entry = writer.commit_batches(epoch, 0, batches()).index[partition]
                offset, records = entry.offset, entry.records
            else:
                records = sum(len(encoded.keys) for encoded in batches())
                if records != committed.records:
                    raise RuntimeError(f"{view.name} partition {partition}: the seed's epoch {epoch} committed "
                                       f"{committed.records} change(s); recomputed, it has {records}")
                offset = committed.offset
        finally:
            writer.close()
        total = [sum(getattr(c, f) for c in staged) for f in ("puts", "deletes", "order_puts", "order_deletes",
                                                              "state_puts", "state_deletes")]
        return {"partition": partition, "epoch": epoch, "offset": offset, "records": records,
                "puts": total[0], "deletes": total[1], "order_puts": total[2], "order_deletes": total[3],
                "state_puts": total[4], "state_deletes": total[5], "written": committed is None,
                "kept_writer": False}


def seed_results(seed: DataFrame, job: SeedJob) -> list[dict[str, int]]:
    """Run the seed's tasks (the seed query routed, shuffled by partition, loaded); their result rows."""
    partitions = job.view.partitions
    schema = StructType([*seed.schema.fields, StructField(VIEW_PARTITION, IntegerType(), False),
                         StructField(ROUTE_TOKEN, IntegerType(), False)])
    routed = seed.mapInArrow(RouteSeed(job.plan, partitions).run, schema).repartition(partitions, ROUTE_TOKEN)
    rows: list[dict[str, int]] = routed.mapInArrow(job.run, RESULT_DDL).toArrow().to_pylist()
    return rows
