"""Executor side of an equi-join of two sources (inner, outer, semi, anti; a self-join too) whose operator
runs in Spark's tasks: two shuffles, one by join key for the operator and its state, one by the view's key
for the changelog partitions. A top-N of one view runs the same way, its ranking groups (its PARTITION BY
values) in the join key's place (:mod:`mvlog.views.topn_routing`, one side; :mod:`mvlog.views.keyed_routing`).

Why two (:mod:`mvlog.views.join_routing`): the join's state is per join key, its output rows are placed
by a key made of both sources' keys, and no routing of the inputs by the output's partition keeps every
pair of one join key in one task. A micro-batch goes:

1. :class:`RouteJoinRows` (before the first shuffle, per upstream read: :func:`routed_sides`): each
   change row of a side gets the partition of its join key (``JoinRouting``), each barrier row is copied
   to every partition. Both sides share one row layout (:func:`shuffled_schema`: the data source's meta
   columns, ``_side``, each side's columns under its own prefix, the other side's null) so that their
   frames are one ``union``. A self-join's one read is routed as both sides (each row twice, each time by
   that side's join key).
2. :class:`JoinKeyJob` (task ``j`` of the first shuffle, one per join-key partition): both sides' rows back
   in the data source's order, each side's under its input name (:func:`side_epochs`), the epochs above the
   MCE (up to the micro-batch's end) computed in order by the pure operator over the buckets of ``j``'s join
   keys, read from the view's committed operator state in Redis and layered epoch by epoch (as a GROUP BY
   task does); every bucket it writes is checked to be ``j``'s. It stages each epoch's state writes under
   partition ``j``'s staging keys (``pstage:<epoch>:<j>:sput/sdel``: the tasks' state keys are disjoint) and
   emits the epoch's output changes as signed view rows, each routed to the view partition of its key, plus
   one *count row* per epoch routed to partition ``j``: the state it staged, and the mark that epoch exists.
3. :class:`ViewPartitionJob` (task ``p`` of the second shuffle, one per changelog partition): per epoch
   of its count row (every epoch of the micro-batch, since every task ``j`` saw every barrier), its
   signed rows consolidated into one change per view key (a pair whose join key changed is retracted by
   the old key's task and asserted by the new one's: one update here; an equal row, nothing), then
   written and staged exactly as a filter's partition (:class:`PartitionWriter`: its own transactional
   producer, resume of what the partition committed, the count check), its rows only. Its result rows
   carry the state counts of ``j = p`` as well, so the driver's commit script checks both halves of
   partition ``p``'s staging, and swaps both in with the epoch index and the MCE.

Exactly once, as the README's "A transaction per partition" says: only step 3 writes Kafka, one
transaction per partition and epoch, never rewritten once committed. A recomputed epoch (a task retried,
a consumer restarted after its driver died between partitions) gives the same changes: step 2 reads the
state the MCE left (never a staging) and the same upstream epochs, sorted into the data source's order,
and step 3 sorts its rows by epoch and view key before consolidating; the records of a partition's
committed epoch are checked against the recomputed count. A stage-2 task that is retried reads the
first shuffle's output again (stage 1 reruns only if that output was lost, and restages the same state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial, reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.epoch_commit import EpochCommit
from mvlog.connectors.spark.change_rows import META_COLUMNS, arrow_schema
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.row_schema import RowSchema
from mvlog.services.pipeline.partition_tasks import (
    RESULT_SCHEMA,
    ROUTE_TOKEN,
    SOURCE_ORDER,
    VIEW_PARTITION,
    PartitionTarget,
    PartitionWriter,
    check_owned,
    committed_state,
    partitions_of_task,
    routed,
)
from mvlog.services.pipeline.reading import EpochBatches, batches_from_arrow
from mvlog.views import ChangeBatch, EpochOutput, ViewOperator, ViewPlan
from mvlog.views.batch import WEIGHT
from mvlog.views.change_batch import consolidate_signed
from mvlog.views.evaluate import arrow_type
from mvlog.views.keyed_routing import OperatorKeyRouting
from mvlog.views.operator import puts_and_deletes
from mvlog.views.routing import GroupRouting, partitions_table, view_key_partitions
from mvlog.views.state import InMemoryState, LayeredState

SIDE = "_side"  # first shuffle: 0 for the FROM view's rows, 1 for the JOIN's (or the subquery's view's)
COUNTS_OF = "_counts_of"  # second shuffle: -1 for a view row, j for the count row of join-key task j
STATE_PUTS, STATE_DELETES = "_state_puts", "_state_deletes"


def side_column(side: int, name: str) -> str:
    """A source column's name in the first shuffle's layout (both sides' columns side by side)."""
    return f"_s{side}__{name}"


def shuffled_schema(upstreams: Sequence[CatalogEntry]) -> pa.Schema:
    """The first shuffle's rows: the data source's meta columns, the side, each side's columns (the data
    source's types), the join-key partition and its routing token."""
    fields = [f for f in arrow_schema(upstreams[0].schema) if f.name in META_COLUMNS]
    fields.append(pa.field(SIDE, pa.int32()))
    for side, upstream in enumerate(upstreams):
        fields += [pa.field(side_column(side, f.name), f.type) for f in arrow_schema(upstream.schema)
                   if f.name not in META_COLUMNS]
    return pa.schema([*fields, pa.field(VIEW_PARTITION, pa.int32()), pa.field(ROUTE_TOKEN, pa.int32())])


def view_rows_schema(plan: ViewPlan) -> pa.Schema:
    """The second shuffle's rows: the view's columns, epoch, weight, the count row's fields, the view
    partition and its routing token."""
    columns = [pa.field(c.name, arrow_type(c.type)) for c in plan.schema.columns]
    return pa.schema([*columns, pa.field("_epoch", pa.int64()), pa.field("_weight", pa.int64()),
                      pa.field(COUNTS_OF, pa.int32()), pa.field(STATE_PUTS, pa.int64()),
                      pa.field(STATE_DELETES, pa.int64()), pa.field(VIEW_PARTITION, pa.int32()),
                      pa.field(ROUTE_TOKEN, pa.int32())])


def joined_rows_schema(routing: OperatorKeyRouting) -> pa.Schema:
    """An aggregate over a join's second shuffle: the operator's joined rows (their columns but the weight,
    under :func:`joined_column` names), epoch, weight, the count row's fields, the group's view partition and
    its routing token."""
    columns = [pa.field(joined_column(i), f.type) for i, f in enumerate(joined_fields(empty_joined(routing)))]
    return pa.schema([*columns, pa.field("_epoch", pa.int64()), pa.field("_weight", pa.int64()),
                      pa.field(COUNTS_OF, pa.int32()), pa.field(STATE_PUTS, pa.int64()),
                      pa.field(STATE_DELETES, pa.int64()), pa.field(VIEW_PARTITION, pa.int32()),
                      pa.field(ROUTE_TOKEN, pa.int32())])


def empty_joined(routing: OperatorKeyRouting) -> pa.Table:
    """The operator's joined rows of an epoch without changes: their columns, no row."""
    return ViewOperator(routing.operator_plan()).joined({}, InMemoryState(), {})


def joined_fields(joined: pa.Table) -> list[pa.Field]:
    """The joined rows' columns but the weight, in order."""
    return [f for f in joined.schema if f.name != WEIGHT]


def joined_column(index: int) -> str:
    """The shuffle's name of the joined rows' column ``index``: the operator's names (``s0.v1``) read as
    struct fields in Spark."""
    return f"_c{index}"


def joined_to_groups(schema: pa.Schema, joined: pa.Table, epoch: int, groups: GroupRouting,
                     tokens: pa.Array) -> pa.Table:
    """An epoch's joined rows (the operator's) as rows of the group shuffle (``schema``:
    :func:`joined_rows_schema`: each column under its :func:`joined_column` name, the weight apart), each to
    its group's view partition (a windowed GROUP BY's: once to each partition holding one of its windows,
    :meth:`~mvlog.views.routing.GroupRouting.fan_out_batch`)."""
    rows, parts = groups.fan_out_batch(joined)
    joined = joined.take(rows)
    shuffled = pa.table({joined_column(i): joined.column(f.name) for i, f in enumerate(joined_fields(joined))})
    return shaped_view_rows(schema, shuffled, epoch, joined.column(WEIGHT), -1, 0, 0, parts, tokens)


def sides(rows: pa.Table, upstreams: Sequence[CatalogEntry]) -> list[pa.Table]:
    """A join-key task's rows (the first shuffle's layout) split by side, each under its upstream's own
    column names and in the data source's order."""
    out = []
    for side, upstream in enumerate(upstreams):
        mine = rows.filter(pc.equal(rows.column(SIDE), side))
        prefix = side_column(side, "")
        names = [*META_COLUMNS, *(prefix + c.name for c in upstream.schema.columns)]
        mine = mine.select(names).rename_columns([n[len(prefix):] if n.startswith(prefix) else n for n in names])
        out.append(mine.sort_by(SOURCE_ORDER))
    return out


@dataclass(frozen=True)
class RouteJoinRows:
    """``mapInArrow``'s function over one upstream's read, before the first shuffle (see the module): its
    rows routed as the rows of each of ``sides`` (both, for a self-join's one upstream)."""

    routing: OperatorKeyRouting
    sides: tuple[int, ...]
    schema: pa.Schema  # shuffled_schema

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tokens = pa.array(partition_tokens(self.routing.partitions), pa.int32())
        for batch in batches:
            table = pa.Table.from_batches([batch])
            for side in self.sides:
                yield from routed(table, self.routing.partitions, partial(self._fan_out, side),
                                  partial(self._shape, side, tokens)).to_batches()

    def _fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Table, pa.Array]:
        # One partition a row, but a windowed inner GROUP BY's row once per partition of its windows.
        indices, parts = self.routing.fan_out(side, rows)
        return rows.take(indices), parts

    def _shape(self, side: int, tokens: pa.Array, rows: pa.Table, parts: pa.Array) -> pa.Table:
        """``rows`` of upstream ``side`` in the shared layout, to the join-key partitions ``parts``."""
        count, prefix = rows.num_rows, side_column(side, "")
        columns = []
        for f in self.schema:
            if f.name in META_COLUMNS:
                columns.append(rows.column(f.name).cast(f.type))
            elif f.name == SIDE:
                columns.append(pa.array([side] * count, pa.int32()))
            elif f.name.startswith(prefix):
                columns.append(rows.column(f.name[len(prefix):]).cast(f.type))
            elif f.name == VIEW_PARTITION:
                columns.append(parts)
            elif f.name == ROUTE_TOKEN:
                columns.append(tokens.take(parts))
            else:
                columns.append(pa.nulls(count, f.type))
        return pa.Table.from_arrays(columns, schema=self.schema)


def routed_sides(routing: OperatorKeyRouting, upstreams: Sequence[CatalogEntry],
                 read: Callable[[CatalogEntry], DataFrame | None]) -> DataFrame | None:
    """Both sides' input of the first shuffle, not yet shuffled: ``read(upstream)`` (None: nothing read)
    once per upstream, its rows routed as each side that upstream is (a self-join's one upstream: twice)."""
    schema = shuffled_schema(upstreams)
    spark_schema = from_arrow_schema(schema)
    frames = []
    for upstream in {u.name: u for u in upstreams}.values():
        if (frame := read(upstream)) is not None:
            of = tuple(side for side, u in enumerate(upstreams) if u.name == upstream.name)
            frames.append(frame.mapInArrow(RouteJoinRows(routing, of, schema).run, spark_schema))
    return reduce(DataFrame.union, frames) if frames else None


def side_epochs(rows: pa.Table, upstreams: Sequence[CatalogEntry], routing: OperatorKeyRouting,
                into: EpochBatches) -> None:
    """A join-key task's rows (the first shuffle's layout) into ``into``: each side's changes per epoch
    under its input name (:meth:`JoinRouting.inputs`), for the operator of :meth:`JoinRouting.operator_plan`."""
    for upstream, name, mine in zip(upstreams, routing.inputs(), sides(rows, upstreams), strict=True):
        batches_from_arrow(mine, upstream, into, name)


@dataclass(frozen=True)
class JoinKeyJob:
    """``mapInArrow``'s function after the first shuffle: one join-key partition's epochs (the module's step 2)."""

    target: PartitionTarget
    upstreams: tuple[CatalogEntry, ...]  # by side: a join's two, a top-N's one
    plan: ViewPlan
    routing: OperatorKeyRouting
    upto: int | None  # the micro-batch's last epoch; None: the last epoch of side ``end_side``'s rows
    end_side: int  # the side read by the stream, whose micro-batch ends with the data source's end marker
    out_schema: pa.Schema  # view_rows_schema; a GROUP BY over the join's (``routing.groups``): joined_rows_schema

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for partition, rows in partitions_of_task(batches, VIEW_PARTITION, True):
            out = self._partition(partition, rows)
            if out.num_rows:
                yield from out.to_batches()

    def _epochs(self, rows: pa.Table) -> tuple[EpochBatches, int]:
        """Each side's changes per epoch, and the micro-batch's last epoch."""
        epochs: EpochBatches = {}
        upto = self.upto
        if upto is None:
            mine = sides(rows, self.upstreams)[self.end_side]
            upto = pc.max(mine.column("_epoch")).as_py() if mine.num_rows else self.target.after
        side_epochs(rows, self.upstreams, self.routing, epochs)
        assert upto is not None
        return epochs, upto

    def _partition(self, partition: int, rows: pa.Table) -> pa.Table:
        target, view = self.target, self.target.view
        epochs, upto = self._epochs(rows)
        todo = sorted(e for e in epochs if target.after < e <= upto)
        settings = Settings.from_executor_json(target.settings_json)
        operator = self.routing.first_step(partition)
        of_vnode = partitions_table(view.partitions)
        tokens = pa.array(partition_tokens(view.partitions), pa.int32())
        out: list[pa.Table] = [self.out_schema.empty_table()]
        staging = target.staging(redis_client.task_client(settings))
        state = committed_state(staging, target)
        for epoch in todo:
            if (groups := self.routing.groups) is None:
                output = operator.apply_epoch(epochs[epoch], state)
                rows_out, weights = output.changes.signed()
                parts = view_key_partitions(self.plan.schema, rows_out, of_vnode)
                out.append(shaped_view_rows(self.out_schema, rows_out, epoch, weights, -1, 0, 0, parts, tokens))
                writes = output.state_writes
            else:  # an aggregate over the join: the joined rows, to their groups' partitions
                writes = {}
                joined = operator.joined(epochs[epoch], state, writes)
                out.append(joined_to_groups(self.out_schema, joined, epoch, groups, tokens))
            state.apply(writes)
            check_owned(view.name, partition, writes, self.routing.partitions_of_state_keys)
            puts, deletes = puts_and_deletes(writes)
            counts = staging.stage(view.name, partition, EpochCommit(epoch, {}, (), {}, state_puts=puts,
                                                                     state_deletes=deletes), rows=False)
            mark = pa.array([partition], pa.int32())
            out.append(shaped_view_rows(self.out_schema, None, epoch, pa.array([0], pa.int64()), partition,
                                        counts.state_puts, counts.state_deletes, mark, tokens))
        return pa.concat_tables(out)


def shaped_view_rows(schema: pa.Schema, rows: pa.Table | None, epoch: int, weights: pa.Array, counts_of: int,
                     puts: int, deletes: int, parts: pa.Array, tokens: pa.Array) -> pa.Table:
    """Rows of the second shuffle (``schema``: :func:`view_rows_schema`): signed view rows (``counts_of``
    -1), or a join-key task's count row (``rows`` None, ``counts_of`` its partition), to ``parts``."""
    count = len(parts)
    columns: dict[str, Any] = {}
    for f in schema:
        if rows is not None and f.name in rows.column_names:
            columns[f.name] = rows.column(f.name).cast(f.type)
        else:
            columns[f.name] = pa.nulls(count, f.type)
    columns.update({"_epoch": pa.array([epoch] * count, pa.int64()), "_weight": weights.cast(pa.int64()),
                    COUNTS_OF: pa.array([counts_of] * count, pa.int32()),
                    STATE_PUTS: pa.array([puts] * count, pa.int64()),
                    STATE_DELETES: pa.array([deletes] * count, pa.int64()),
                    VIEW_PARTITION: parts, ROUTE_TOKEN: tokens.take(parts)})
    return pa.table(columns, schema=schema)


@dataclass(frozen=True)
class ViewPartitionJob:
    """``mapInArrow``'s function after the second shuffle: one view partition's epochs (the module's step 3)."""

    target: PartitionTarget
    plan: ViewPlan

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return partition_results(batches, self._partition)

    def _partition(self, partition: int, rows: pa.Table) -> list[dict[str, Any]]:
        view = self.target.view
        state_counts = join_state_counts(view.name, partition, rows)
        by_epoch = view_changes_by_epoch(rows, self.plan.schema)
        if set(by_epoch) - set(state_counts):
            raise RuntimeError(f"{view.name} partition {partition}: changes of epochs no join-key task counted")

        def compute(epoch: int, _state: LayeredState) -> EpochOutput:
            return EpochOutput(by_epoch.get(epoch) or ChangeBatch.empty(self.plan.schema))

        results = PartitionWriter(self.target, partition).write(
            sorted(state_counts), compute, lambda _staging: LayeredState(InMemoryState()), stage_state="none")
        for result in results:  # partition p's staging is both halves: its rows, join-key task p's state
            result["state_puts"], result["state_deletes"] = state_counts[result["epoch"]]
        return results


@dataclass(frozen=True)
class GroupPartitionJob:
    """``mapInArrow``'s function after the second shuffle of an aggregate over a join: one view partition's
    epochs, its groups' joined rows folded into their groups (read from and staged into the view's operator
    state, beside join-key task ``p``'s buckets), written as the partition's epochs."""

    target: PartitionTarget
    routing: OperatorKeyRouting  # its groups: a GROUP BY over the join's

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return partition_results(batches, self._partition)

    def _partition(self, partition: int, rows: pa.Table) -> list[dict[str, Any]]:
        view = self.target.view
        state_counts = join_state_counts(view.name, partition, rows)
        empty = empty_joined(self.routing)
        by_epoch = joined_by_epoch(rows, empty)
        if set(by_epoch) - set(state_counts):
            raise RuntimeError(f"{view.name} partition {partition}: joined rows of epochs no join-key task counted")
        groups = self.routing.groups
        assert groups is not None
        operator = ViewOperator(self.routing.operator_plan(), share=groups.share(partition))

        def compute(epoch: int, state: LayeredState) -> EpochOutput:
            output = operator.aggregate_joined(by_epoch.get(epoch, empty), state)
            state.apply(output.state_writes)
            check_owned(view.name, partition, output.state_writes, groups.partitions_of_state_keys)
            return output

        results = PartitionWriter(self.target, partition).write(
            sorted(state_counts), compute, lambda staging: committed_state(staging, self.target), stage_state="beside")
        for result in results:  # partition p's state staging: its groups' and join-key task p's buckets
            puts, deletes = state_counts[result["epoch"]]
            result["state_puts"] += puts
            result["state_deletes"] += deletes
        return results


def partition_results(batches: Iterator[pa.RecordBatch],
                      results_of: Callable[[int, pa.Table], list[dict[str, Any]]]) -> Iterator[pa.RecordBatch]:
    """A task's result rows after the last shuffle: ``results_of(partition, rows)`` of its view partition."""
    for partition, rows in partitions_of_task(batches, VIEW_PARTITION, True):
        if results := results_of(partition, rows):
            yield pa.RecordBatch.from_pylist(results, schema=RESULT_SCHEMA)


def join_state_counts(view: str, partition: int, rows: pa.Table) -> dict[int, tuple[int, int]]:
    """The state join-key task ``partition`` staged for each epoch (its count rows: one per epoch of the
    micro-batch), checked to be that task's, each epoch once."""
    marks = rows.filter(pc.greater_equal(rows.column(COUNTS_OF), 0))
    if set(marks.column(COUNTS_OF).to_pylist()) - {partition}:
        raise RuntimeError(f"{view} partition {partition}: got another join-key task's counts")
    counts: dict[int, tuple[int, int]] = {}
    for epoch, puts, deletes in zip(*(marks.column(c).to_pylist() for c in ("_epoch", STATE_PUTS, STATE_DELETES)),
                                    strict=True):
        if epoch in counts:
            raise RuntimeError(f"{view} partition {partition}: epoch {epoch} counted twice")
        counts[epoch] = (puts, deletes)
    return counts


def joined_by_epoch(rows: pa.Table, empty: pa.Table) -> dict[int, pa.Table]:
    """A view partition's joined rows of the second shuffle (count rows skipped), per epoch, in the
    operator's layout (``empty``'s columns) and in one order whatever the join-key tasks' (every column
    ascending: a recomputed epoch folds its rows, floats included, in the same order)."""
    joined = rows.filter(pc.equal(rows.column(COUNTS_OF), -1))
    fields = joined_fields(empty)
    shuffled = [joined_column(i) for i in range(len(fields))]
    joined = joined.sort_by([("_epoch", "ascending"), *((name, "ascending") for name in shuffled),
                             ("_weight", "ascending")])
    out = {}
    for epoch, part in epoch_parts(joined):
        arrays = {f.name: part.column(name) for f, name in zip(fields, shuffled, strict=True)}
        out[epoch] = pa.table(arrays | {WEIGHT: part.column("_weight")}, schema=empty.schema)
    return out


def epoch_parts(rows: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """``rows`` (sorted by ``_epoch``) epoch by epoch."""
    counts = pc.value_counts(rows.column("_epoch"))
    start = 0
    for epoch, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
        yield epoch, rows.slice(start, count)
        start += count


def view_changes_by_epoch(rows: pa.Table, schema: RowSchema) -> dict[int, ChangeBatch]:
    """A view partition's signed rows of the second shuffle (count rows skipped), per epoch, consolidated
    into one change per view key: sorted by epoch and view key first, so that a recomputed epoch gives the
    same changes in the same order (a pair whose join key changed is retracted by the old key's task and
    asserted by the new one's: one update here)."""
    changes = rows.filter(pc.equal(rows.column(COUNTS_OF), -1))
    order = [("_epoch", "ascending"), *((k, "ascending") for k in schema.primary_key), ("_weight", "ascending")]
    changes = changes.sort_by(order)
    names = list(schema.names)
    return {epoch: consolidate_signed(signed.select(names), signed.column("_weight").to_pylist(), schema)
            for epoch, signed in epoch_parts(changes)}
