"""Executor side of a view whose operator runs in Spark's tasks: one changelog partition's epochs,
computed, written to Kafka in the partition's own transactions, and staged in Redis.

A task gets the signed rows of one view partition of a micro-batch: for a filter/project keyed like its
upstream, upstream partition ``p`` itself (``mapInArrow`` over the data source's read; see
:mod:`mvlog.views.partitioning`); for a GROUP BY, the rows Spark shuffled to it by the partition of the
group each row falls in (:class:`RouteRows` before the shuffle, :mod:`mvlog.views.routing`); for a
filter/project that passes its upstream's key through under other names or over another partition
count, the rows shuffled by the partition of the key they will have (:mod:`mvlog.views.key_routing`); every
upstream barrier row copied to every partition so each task sees every epoch of the micro-batch. For
its partition it:

1. makes the partition's transactional producer (``<prefix>.<view>.p<partition>``): its
   ``init_transactions`` fences any earlier attempt of this partition (a retried or speculative task, a
   task of a consumer whose driver died) and aborts that attempt's open transaction; or uses the one
   its Python worker kept from an earlier task while no other was made since
   (:mod:`~mvlog.services.pipeline.kept_writers`);
2. reads the barriers the partition committed after the view's MCE, and writes only the epochs not
   among them, each in a transaction of its own (:func:`mvlog.partition_epochs.resume_partition`): a
   partition's committed epoch is never written twice;
3. computes the epochs in order with the pure operator; a GROUP BY reads the state of its groups from
   the view's committed operator state in Redis (what the MCE left: never an earlier attempt's
   staging), each epoch's writes layered over it for the next (:class:`~mvlog.views.state.LayeredState`);
   so an epoch recomputed by a retried attempt gives the changes its committed attempt holds (the
   counts are checked against its barrier);
4. stages every epoch's rows and state writes in Redis
   (:class:`~mvlog.connectors.redis.partition_staging.PartitionStaging`), whether written now or found
   committed;
5. returns one small row per epoch: partition, epoch, barrier offset, records, staged counts, and
   whether this attempt wrote it. The driver commits each epoch in Redis from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import redis
from pyspark import TaskContext

from mvlog.catalog import CatalogEntry
from mvlog.changes import Mutation
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, EncodedBatch, encode_batch
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.epoch_commit import EpochCommit, commit_from_encoded
from mvlog.connectors.redis.partition_staging import REPLACEMENT_SCOPE, PartitionStaging
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_rows import ViewRows
from mvlog.connectors.redis.writer_claims import WriterClaims
from mvlog.connectors.spark.change_rows import BARRIER
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.partition_epochs import (
    PartitionBarrier,
    cut_over_of,
    prev_epochs,
    require_next,
    resume_partition,
    same_definition,
)
from mvlog.services.pipeline.kept_writers import KEPT_WRITERS
from mvlog.services.pipeline.reading import EpochBatches, batches_from_arrow
from mvlog.views import EpochOutput, ViewOperator, ViewPlan
from mvlog.views.key_routing import KeyRouting
from mvlog.views.routing import GroupRouting
from mvlog.views.share import WHOLE
from mvlog.views.state import InMemoryState, LayeredState, StoredState

#: Columns :class:`RouteRows` adds: the view partition of the row, and the int Spark's hash partitioning
#: sends to that partition's index (``repartition(n, ROUTE_TOKEN)``).
VIEW_PARTITION, ROUTE_TOKEN = "_view_partition", "_route"

#: The data source's order of signed rows (epoch, upstream partition, offset, retraction first): a task
#: sorts shuffled rows back into it, so the operator's result does not depend on the shuffle's order.
SOURCE_ORDER = [("_epoch", "ascending"), ("_partition", "ascending"), ("_offset", "ascending"),
                ("_weight", "ascending")]

#: One row per (partition, epoch) a task handled: what the driver needs to commit the epoch.
RESULT_SCHEMA = pa.schema([
    ("partition", pa.int32()), ("epoch", pa.int64()), ("offset", pa.int64()), ("records", pa.int64()),
    ("puts", pa.int64()), ("deletes", pa.int64()), ("order_puts", pa.int64()), ("order_deletes", pa.int64()),
    ("state_puts", pa.int64()), ("state_deletes", pa.int64()), ("written", pa.bool_()),
    ("kept_writer", pa.bool_()),  # written by a writer its Python worker kept from an earlier task
])
_SQL_TYPES = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}
RESULT_DDL = ", ".join(f"`{f.name}` {_SQL_TYPES[f.type]}" for f in RESULT_SCHEMA)  # for mapInArrow


def partition_transactional_id(settings: Settings, view: str, partition: int) -> str:
    """The transactional id of the writer of one partition of ``view`` (fences that partition's attempts)."""
    return f"{settings.topic_prefix}.{view}.p{partition}"


@dataclass(frozen=True)
class RouteRows:
    """``mapInArrow``'s function before a one-upstream view's shuffle: each change row gets the view
    partition of its group (a GROUP BY) or of its passed-through key (a stateless view keyed by other
    names or over another partition count) and that partition's routing token; each barrier row is
    copied once per view partition (an epoch with no change for a partition still needs that partition's
    barrier)."""

    routing: GroupRouting | KeyRouting

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tokens = pa.array(partition_tokens(self.routing.partitions), pa.int32())

        def shape(rows: pa.Table, parts: pa.Array) -> pa.Table:
            return rows.append_column(VIEW_PARTITION, parts).append_column(ROUTE_TOKEN, tokens.take(parts))

        def fan_out(changes: pa.Table) -> tuple[pa.Table, pa.Array]:
            rows, parts = self.routing.fan_out(changes)
            return changes.take(rows), parts

        for batch in batches:
            yield from routed(pa.Table.from_batches([batch]), self.routing.partitions, fan_out, shape).to_batches()


def routed(table: pa.Table, partitions: int, fan_out: Callable[[pa.Table], tuple[pa.Table, pa.Array]],
           shape: Callable[[pa.Table, pa.Array], pa.Table]) -> pa.Table:
    """The rows of ``table`` (the data source's signed rows) before a shuffle: the change rows as
    ``fan_out(changes)`` sends them (rows, their partitions: each row once, but a windowed GROUP BY's
    once per partition of its windows); each barrier row once per partition (an epoch with no change for
    a partition still needs its barrier there). ``shape(rows, their partitions)``: the rows as shuffled."""
    barrier = pc.equal(table.column("_change_type"), BARRIER)
    changes = table.filter(pc.invert(barrier))
    out = [shape(*fan_out(changes))]
    barriers = table.filter(barrier)
    for p in range(partitions) if barriers.num_rows else ():
        out.append(shape(barriers, pa.array([p] * barriers.num_rows, pa.int32())))
    return pa.concat_tables(out)


@dataclass(frozen=True)
class PartitionTarget:
    """Where the tasks of one micro-batch write: view ``view``'s partitions, after its MCE ``after``
    (pickled to the executors with the task function)."""

    settings_json: str
    view: CatalogEntry
    after: int  # the view's MCE: epochs at or below it are skipped
    start_offsets: dict[int, int]  # view partition -> first offset after the MCE's barrier
    next_epoch: int | None  # the upstreams' first committed epoch after the MCE (their epoch index)
    #: Called in the task with (partition, epoch) after this attempt wrote and staged that epoch: the
    #: fault-injection tests kill the driver there (a partition committed, the others not yet).
    on_written: Callable[[int, int], None] | None = None
    #: The mutation each epoch's barriers carry (a chunked backfill's progress), if any.
    barrier_mutation: Callable[[int], Mutation] | None = None
    #: A staged replacement of the view the tasks compute instead (its id): they read and stage its rows
    #: and operator state, under its own keys, and write nothing to Kafka (``after``: its MCE).
    replacement_id: str | None = None

    def staging(self, client: redis.Redis) -> PartitionStaging:
        """Where the tasks stage their partitions: the view's staging, or its staged replacement's."""
        prefix = Settings.from_executor_json(self.settings_json).topic_prefix
        return PartitionStaging(client, prefix, REPLACEMENT_SCOPE if self.replacement_id is not None else "")


@dataclass(frozen=True)
class PartitionJob:
    """What every task of one micro-batch of a one-upstream view needs (pickled to the executors with the
    task function)."""

    target: PartitionTarget
    upstream: CatalogEntry
    plan: ViewPlan
    #: A GROUP BY's routing: the rows were shuffled by their group's partition (column
    #: :data:`VIEW_PARTITION`), and the operator reads and stages state; a :class:`KeyRouting`: shuffled
    #: by the partition of their passed-through key, no state. None: a stateless view whose partition is
    #: the upstream's (column ``_partition``).
    routing: GroupRouting | KeyRouting | None = None

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``'s function: the task's rows in, one result row per partition and epoch out."""
        shuffled = self.routing is not None
        for partition, rows in partitions_of_task(batches, VIEW_PARTITION if shuffled else "_partition", shuffled):
            if shuffled:  # a shuffle keeps no order: the data source's, per epoch
                rows = rows.drop_columns([VIEW_PARTITION, ROUTE_TOKEN]).sort_by(SOURCE_ORDER)
            results = PartitionEpochs(self, partition).run(rows)
            if results:
                yield pa.RecordBatch.from_pylist(results, schema=RESULT_SCHEMA)


def require_every_partition(what: str, partitions: Iterable[int], count: int) -> None:
    """The driver's check of a job's result rows: every one of the view's ``count`` partitions answered
    (a task that returned nothing would otherwise leave its partition's part out unnoticed)."""
    answered = sorted(partitions)
    if answered != list(range(count)):
        raise RuntimeError(f"{what} came back from partitions {answered}, not all {count}")


def check_routed(partition: int) -> None:
    """A shuffled task must hold one view partition, the one of its own index (:data:`ROUTE_TOKEN`):
    otherwise Spark's hash partitioning is not what ``hash_partitioning`` computes, and the partitions
    would silently share tasks."""
    context = TaskContext.get()
    if context is not None and context.partitionId() != partition:
        raise RuntimeError(f"Spark task {context.partitionId()} got the rows of view partition {partition}: "
                           "routing tokens out of step with Spark's hash partitioning")


def partitions_of_task(batches: Iterator[pa.RecordBatch], column: str, shuffled: bool
                       ) -> Iterator[tuple[int, pa.Table]]:
    """A task's rows (``mapInArrow``'s input), per partition named in ``column``; ``shuffled``: the rows
    came through a shuffle on a routing token, so the partition must be the task's own (:func:`check_routed`)."""
    collected = list(batches)
    if not collected:
        return
    table = pa.Table.from_batches(collected)
    for partition in pc.unique(table.column(column)).to_pylist():
        if shuffled:
            check_routed(partition)
        yield partition, table.filter(pc.equal(table.column(column), partition))


def own_partition(batches: Iterator[pa.RecordBatch], column: str) -> tuple[int, pa.Table | None] | None:
    """A shuffled task's view partition and its rows (:func:`partitions_of_task`). A task that got no rows
    is its partition's too (its index: Spark's hash partitioning puts partition ``p``'s rows, if any, in task
    ``p``), with None for rows: the partition's epoch still gets its barrier. None outside a Spark task."""
    for partition, rows in partitions_of_task(batches, column, shuffled=True):
        return partition, rows  # check_routed: the one partition of the task's own index
    context = TaskContext.get()
    return (context.partitionId(), None) if context is not None else None


class PartitionEpochs:
    """One partition's epochs of one micro-batch, in one task (see the module's docstring)."""

    def __init__(self, job: PartitionJob, partition: int) -> None:
        self.job, self.partition, self.target = job, partition, job.target

    def run(self, rows: pa.Table) -> list[dict[str, Any]]:
        job = self.job
        epochs: EpochBatches = {}
        batches_from_arrow(rows, job.upstream, epochs)
        todo = sorted(e for e in epochs if e > self.target.after)
        routing = job.routing
        operator = ViewOperator(job.plan, share=routing.share(self.partition) if routing is not None else WHOLE)
        writer = PartitionWriter(self.target, self.partition)

        def compute(epoch: int, state: LayeredState) -> EpochOutput:
            output = operator.apply_epoch(epochs[epoch], state)
            state.apply(output.state_writes)
            self._check_state_keys(output.state_writes)
            return output

        return writer.write(todo, compute, self._state)

    def _state(self, staging: PartitionStaging) -> LayeredState:
        """The operator state this partition's epochs start from: the view's committed state in Redis (a
        GROUP BY's groups of this partition; a stateless view reads none), under this task's own writes."""
        if not isinstance(self.job.routing, GroupRouting):
            return LayeredState(InMemoryState())
        return committed_state(staging, self.target)

    def _check_state_keys(self, writes: dict[bytes, bytes | None]) -> None:
        """Every state key an epoch writes must be one of this partition's groups: the partitions' state
        is disjoint only while the routing and the operator agree on where a group lives."""
        routing = self.job.routing
        if routing is None:
            if writes:
                raise RuntimeError(f"{self.target.view.name}: a view without routing wrote operator state")
            return
        check_owned(self.target.view.name, self.partition, writes, routing.partitions_of_state_keys)


#: Whose operator state a partition's task stages (:meth:`PartitionWriter.write`).
StateStaging = Literal["own", "none", "beside"]


def committed_state(staging: PartitionStaging, target: PartitionTarget) -> LayeredState:
    """The view's operator state as its MCE left it in Redis (never an earlier attempt's staging), or its
    staged replacement's as the replacement's MCE left it, under the epochs this task computed before the
    next."""
    prefix = Settings.from_executor_json(target.settings_json).topic_prefix
    store = (ViewRows(staging.redis, prefix) if target.replacement_id is None
             else ReplacementStore(staging.redis, prefix))
    return LayeredState(StoredState(partial(store.get_state, target.view.name)))


def check_owned(view: str, partition: int, writes: dict[bytes, bytes | None],
                owners: Callable[[list[bytes]], list[int]]) -> None:
    """Every state key a task writes must be its partition's (``owners``: the routing's owner of each key):
    the tasks' state is disjoint only while the routing and the operator agree on where a key lives."""
    keys = list(writes)
    wrong = [key for key, owner in zip(keys, owners(keys), strict=True) if owner != partition]
    if wrong:
        raise RuntimeError(f"{view} partition {partition}: state of other partitions' keys written: {wrong[:3]!r}")


def written_or_found(writer: ChangelogWriter, partition: int, epoch: int, prev_epoch: int, encoded: EncodedBatch,
                     found: PartitionBarrier | None, mutation: Mutation | None = None) -> PartitionBarrier:
    """The barrier of ``epoch`` in ``partition``: ``found``, the one an attempt committed already (checked
    against the recomputed epoch: the same record count, and a replacement's cut-over only where this is
    the same cut-over, :func:`~mvlog.partition_epochs.same_definition`; an epoch is never written twice),
    or the one of the transaction ``writer`` commits now (``mutation`` on its barrier)."""
    if found is None:
        entry = writer.commit_batches(epoch, prev_epoch, [encoded], mutation=mutation).index[partition]
        return PartitionBarrier(epoch, prev_epoch, entry.offset, entry.records)
    if not same_definition(found.mutation, mutation):
        def what(cut: str | None) -> str:
            return f"as replacement {cut}'s cut-over" if cut is not None else "under the view's definition"

        raise RuntimeError(f"{writer.view} partition {partition}: epoch {epoch} is committed "
                           f"{what(cut_over_of(found.mutation))}; recomputed, it is {what(cut_over_of(mutation))}")
    if found.records != len(encoded.keys):
        raise RuntimeError(f"{writer.view} partition {partition}: epoch {epoch} committed {found.records} change(s); "
                           f"recomputed, it has {len(encoded.keys)}")
    return found


class PartitionWriter:
    """Writes one view partition's epochs of a micro-batch: each in its own Kafka transaction unless the
    partition committed it already (then the recomputed count is checked against its barrier), its rows
    (and the operator state the epoch's output carries) staged in Redis; one result row per epoch."""

    def __init__(self, target: PartitionTarget, partition: int) -> None:
        self.target, self.partition = target, partition
        self.settings = Settings.from_executor_json(target.settings_json)

    def write(self, todo: list[int], compute: Callable[[int, LayeredState], EpochOutput],
              state: Callable[[PartitionStaging], LayeredState], *, stage_state: StateStaging = "own"
              ) -> list[dict[str, Any]]:
        """``compute(epoch, state)``: the epoch's output, in the order of ``todo`` (ascending, above the MCE);
        ``state(staging)``: the state the first epoch starts from. ``stage_state``: ``"none"`` when another
        task stages this partition's operator state (a join's join-key task), ``"beside"`` when this task's
        state goes beside another's (an aggregate over a join: its groups' beside the join's buckets)."""
        target, partition, view = self.target, self.partition, self.target.view
        if not todo:
            return []
        require_next(partition, target.after, todo, target.next_epoch)
        staging = target.staging(redis_client.task_client(self.settings))
        if target.replacement_id is not None:  # a staged replacement's epochs: staged only, nothing to Kafka
            return self._write(None, False, staging, todo, compute, state, stage_state)
        return KEPT_WRITERS.run(
            self.settings, view, partition, partition_transactional_id(self.settings, view.name, partition),
            WriterClaims(staging.redis, self.settings.topic_prefix),
            lambda writer, kept: self._write(writer, kept, staging, todo, compute, state, stage_state))

    def _write(self, writer: ChangelogWriter | None, kept: bool, staging: PartitionStaging, todo: list[int],
               compute: Callable[[int, LayeredState], EpochOutput], state: Callable[[PartitionStaging], LayeredState],
               stage_state: StateStaging) -> list[dict[str, Any]]:
        """:meth:`write` with ``writer``, the partition's writer, which fenced every earlier attempt when it
        was made (None: a staged replacement's epochs, which only Redis holds); ``kept``: its Python worker
        kept it from an earlier task (:mod:`~mvlog.services.pipeline.kept_writers`)."""
        target, partition, view = self.target, self.partition, self.target.view
        found = (partition_barriers(self.settings, view.name, partition, target.start_offsets.get(partition, 0))
                 if writer is not None else [])
        committed = resume_partition(partition, target.after, todo, found)
        prev = prev_epochs(target.after, todo)
        layered = state(staging)
        results: list[dict[str, Any]] = []
        for epoch in todo:
            output = compute(epoch, layered)
            encoded = encode_batch(view.key_columns, output.changes)
            mutation = target.barrier_mutation(epoch) if target.barrier_mutation is not None else None
            state_puts, state_deletes = output.state_puts_and_deletes()
            if writer is None:  # a replacement keeps no key order: its cut-over's diff gives the view's
                barrier = PartitionBarrier(epoch, prev[epoch], -1, len(encoded.keys))
                rows_left = EpochCommit(epoch, encoded.row_puts, encoded.row_deletes, {}, state_puts=state_puts,
                                        state_deletes=state_deletes)
            else:
                barrier = written_or_found(writer, partition, epoch, prev[epoch], encoded, committed.get(epoch),
                                           mutation)
                rows_left = commit_from_encoded(epoch, output.changes.keys, encoded, {}, state_puts=state_puts,
                                                state_deletes=state_deletes)
            counts = staging.stage(view.name, partition, rows_left, state=stage_state != "none",
                                   beside=stage_state == "beside")
            if target.on_written is not None and epoch not in committed:
                target.on_written(partition, epoch)
            results.append({"partition": partition, "epoch": epoch, "offset": barrier.offset,
                            "records": barrier.records, "puts": counts.puts, "deletes": counts.deletes,
                            "order_puts": counts.order_puts, "order_deletes": counts.order_deletes,
                            "state_puts": counts.state_puts, "state_deletes": counts.state_deletes,
                            "written": epoch not in committed, "kept_writer": kept})
        return results
