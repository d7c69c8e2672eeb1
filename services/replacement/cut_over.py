"""A replacement's cut-over computed by Spark's tasks, a view partition each (issue 19, item 5).

The cut-over's epoch ``C`` of view ``V`` has as its changes the diff between ``V``'s rows at its MCE (the
epoch before ``C``) and the staged replacement's rows at ``C``; its barriers carry the apply_replacement
mutation, and its Redis commit makes the replacement's rows and state ``V``'s. On the driver's way the
driver read both row sets whole; here the rows never reach it:

1. the driver fixes the cut-over at ``C`` in the replacement's record
   (:meth:`~mvlog.connectors.redis.replacement_store.ReplacementStore.begin_cut_over`). From then on the
   apply can be neither withdrawn nor discarded: once a partition holds ``C`` in Kafka, the other
   partitions' ``C`` must be the same cut-over, so a consumer killed half-way leaves it for the next one
   to complete (both row sets stay as they are until then: only this consumer writes them);
2. two tasks scan the two row hashes, each row routed to the view partition of its key's vnode, and Spark
   shuffles them there (:class:`ScanRows`);
3. each view partition's task diffs its keys (:func:`~mvlog.replacement.diff_rows`, in key order, so a
   recomputed diff is the same), writes the partition's changes and barrier in its own transaction, or
   finds them committed by an earlier attempt and checks their count, and stages the diff's rows and
   key-order members (:class:`DiffPartition`, through the task path's
   :class:`~mvlog.services.pipeline.partition_tasks.PartitionWriter`: the same fencing and resume rule as
   any epoch of a partition);
4. the driver commits ``C`` in Redis with one script: the replacement's rows and state renamed to the
   view's, the staged part applied over them (the rows are the same; the key-order index gains the
   inserted keys and loses the deleted ones), the epoch index, the MCE and the record marked applied
   (:meth:`~mvlog.connectors.redis.replacement_store.ReplacementStore.apply_partitions`).

Only a replacement whose key columns are the view's, by name and type, is cut over here: a key's
partition is then the same in both row sets, and each partition's diff is the whole diff's part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from mvlog.catalog import CatalogEntry
from mvlog.changes import Mutation
from mvlog.config import Settings
from mvlog.connectors.kafka.partition_tail import barriers_above
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.partition_staging import StagedCounts
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_rows import ViewRows
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.partition_epochs import cut_over_of
from mvlog.replacement import diff_rows
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.committer import EpochCommitter
from mvlog.services.pipeline.partition_tasks import (
    RESULT_DDL,
    RESULT_SCHEMA,
    ROUTE_TOKEN,
    VIEW_PARTITION,
    PartitionTarget,
    PartitionWriter,
    own_partition,
)
from mvlog.services.pipeline.task_epochs import commit_results
from mvlog.views import ChangeBatch, EpochOutput
from mvlog.views.state import InMemoryState, LayeredState
from mvlog.vnode import partition_of_vnode, vnode_of

#: Which row set a scanned row is of: the view's at its MCE, or the replacement's at the cut-over's epoch.
OLD, NEW = 0, 1
SIDE = "_side"
SCAN_SCHEMA = pa.schema([(SIDE, pa.int8()), ("row", pa.binary()), (VIEW_PARTITION, pa.int32()),
                         (ROUTE_TOKEN, pa.int32())])
SCAN_CHUNK = 10_000  # rows per Arrow batch of a scan


def same_keys(view: RowSchema, replacement: RowSchema) -> bool:
    """Whether the two definitions key their rows alike (names and types): the condition of a cut-over in
    tasks (see the module's docstring)."""
    return view.primary_key == replacement.primary_key and all(
        view.column(name).type == replacement.column(name).type for name in view.primary_key)


def cut_over_in_log(settings: Settings, view: CatalogEntry, start_offsets: Mapping[int, int],
                    replacement_id: str) -> dict[int, int]:
    """The epoch of ``replacement_id``'s cut-over in each partition of ``view`` that holds one above its MCE
    (``start_offsets``: per partition, the first offset after the MCE's barrier). A cut-over in tasks
    commits partition by partition before its Redis commit: a record that does not say so (Redis lost it
    and it was staged again from the catalog) must still complete it there, since the partitions that
    hold it can hold nothing else at that epoch."""
    above = barriers_above(settings, view.name, view.partitions, start_offsets)
    return {partition: cut[0] for partition, barriers in above.items()
            if (cut := [b.epoch for b in barriers if cut_over_of(b.mutation) == replacement_id])}


@dataclass(frozen=True)
class ScanRows:
    """``mapInArrow``'s function over ``spark.range(2)``: task ``OLD`` scans the view's rows, task ``NEW``
    the replacement's, each row with its view partition and that partition's routing token."""

    settings_json: str
    view: str
    partitions: int

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settings = Settings.from_executor_json(self.settings_json)
        client = redis_client.task_client(settings)
        tokens = partition_tokens(self.partitions)
        for batch in batches:
            for side in batch.column(0).to_pylist():
                rows = (ViewRows(client, settings.topic_prefix) if side == OLD
                        else ReplacementStore(client, settings.topic_prefix)).scan_rows(self.view)
                while chunk := list(islice(rows, SCAN_CHUNK)):  # (key bytes, row bytes)
                    parts = [partition_of_vnode(vnode_of(key), self.partitions) for key, _ in chunk]
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([side] * len(chunk), pa.int8()), pa.array([row for _, row in chunk], pa.binary()),
                         pa.array(parts, pa.int32()), pa.array([tokens[p] for p in parts], pa.int32())],
                        schema=SCAN_SCHEMA)


@dataclass(frozen=True)
class ApplyBarrier:
    """What the cut-over's barriers carry (:attr:`PartitionTarget.barrier_mutation`): its mutation."""

    mutation: Mutation

    def __call__(self, epoch: int) -> Mutation:
        return self.mutation


@dataclass(frozen=True)
class DiffPartition:
    """``mapInArrow``'s function after the scan's shuffle: one view partition's part of the cut-over,
    written and staged (see the module's docstring); one result row
    (:data:`~mvlog.services.pipeline.partition_tasks.RESULT_SCHEMA`)."""

    target: PartitionTarget  # the view's, after its MCE, with the apply mutation on its barriers
    epoch: int
    old: RowSchema  # the view's rows' schema
    new: RowSchema  # the replacement's

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found = own_partition(batches, VIEW_PARTITION)
        if found is None:
            return
        partition, rows = found
        before: dict[Key, Row] = {}
        after: dict[Key, Row] = {}
        if rows is not None:
            for side, raw in zip(rows.column(SIDE).to_pylist(), rows.column("row").to_pylist(), strict=True):
                row = decode_row(raw)
                if side == OLD:
                    before[self.old.key_of(row)] = row
                else:
                    after[self.new.key_of(row)] = row
        changes = ChangeBatch.from_changes(self.new, diff_rows(before, after, self.new))

        def compute(epoch: int, state: LayeredState) -> EpochOutput:
            return EpochOutput(changes)

        results = PartitionWriter(self.target, partition).write(
            [self.epoch], compute, lambda _staging: LayeredState(InMemoryState()), stage_state="none")
        yield pa.RecordBatch.from_pylist(results, schema=RESULT_SCHEMA)


def cut_over_in_tasks(spark: SparkSession, settings: Settings, entry: CatalogEntry, new: RowSchema,
                      committer: EpochCommitter, replacements: ReplacementStore, replacement_id: str, epoch: int,
                      mutation: Mutation, version: int, start_offsets: Mapping[int, int],
                      on_written: Callable[[int, int], None] | None = None) -> bool:
    """Cut view ``entry`` over to its staged replacement (``new``: its rows' schema) at ``epoch``, the
    view's next upstream epoch, in Spark's tasks (see the module's docstring). False (nothing done) when
    the cut-over cannot be fixed at ``epoch``: the apply was withdrawn or the replacement discarded; raises
    :class:`~mvlog.connectors.redis.replacement_store.CutOverNotReachedError` when the replacement is not at
    ``epoch`` (the caller follows it there first). ``start_offsets``: per view partition, the changelog
    offset after the MCE's barrier (where the tasks look for an earlier attempt's cut-over); ``on_written``:
    fault injection."""
    view = entry.name
    if not replacements.begin_cut_over(view, replacement_id, epoch):
        return False
    target = PartitionTarget(settings.to_executor_json(), entry, committer.mce, dict(start_offsets), epoch,
                             on_written, ApplyBarrier(mutation))
    scanned = spark.range(0, 2, 1, 2).mapInArrow(ScanRows(target.settings_json, view, entry.partitions).run,
                                                 from_arrow_schema(SCAN_SCHEMA))
    diffed = scanned.repartition(entry.partitions, ROUTE_TOKEN).mapInArrow(
        DiffPartition(target, epoch, entry.schema, new).run, RESULT_DDL)
    rows = diffed.toArrow().to_pylist()

    def apply(index: Mapping[int, IndexEntry], staged: Mapping[int, StagedCounts]) -> bool:
        return replacements.apply_partitions(view, replacement_id, epoch, staged, index, version)

    commit_results(committer, entry, epoch, rows, apply)
    return True
