"""A two-view join's rows and operator state re-derived in Spark's tasks, for a rebuild after a Redis wipe
(a top-N's too: its ranking groups in the join key's place, one side; :mod:`mvlog.views.topn_routing`).

A join's live epochs take two shuffles (:mod:`mvlog.services.pipeline.join_tasks`): by join key for the
operator and its state, then by the view's key for the changelog partitions. A rebuild writes no
changelog, so it needs the first only: the join's state is per join key, and each of its rows comes from
the pairs (or the unmatched row) of one join key, so the task of join-key partition ``j`` holds every
input row and state key it needs, and stages rows no other task stages.

1. Spark SQL folds each side's changelog into its rows at the view's MCE (each key's last image, as
   ``replay derive`` folds a prefix), shaped as one epoch of inserts, and each row goes to the partition
   of its join key (:class:`~mvlog.services.pipeline.join_tasks.RouteJoinRows`, the live path's routing);
2. task ``j`` hydrates a fresh operator from its rows (the operator's hydration path: one epoch of the
   whole input, as a backfill's first step) and stages the rows it computes, their key-order members and
   its operator state for the rebuild (:meth:`~mvlog.connectors.redis.epoch_commit.EpochCommits.stage_rebuild`:
   several writers stage disjoint parts; a retried task stages the same values again);
3. the driver swaps the staged rebuild in for the view's in one script, refused when the MCE moved.

A staged join replacement's first state is computed the same way from the replacement's definition, at
the epoch F hydration starts from, into the replacement's own staging
(:func:`mvlog.services.replacement.hydration.hydrate_in_tasks` swaps it in); a side that starts from its
snapshot is folded from the snapshot's rows and its changelog after it.

``replay derive --into-topic --engine spark`` of such a join takes both shuffles of the live path
(:class:`JoinDerivation`): task ``j`` of the join-key shuffle hydrates a fresh operator with both sides'
rows at the epoch before the range (each side's log folded by Spark SQL) and computes the range's epochs
in order, emitting their changes as signed view rows; task ``p`` of the view-key shuffle consolidates
its partition's, and writes each epoch in a transaction of its own to the new changelog, as a
one-upstream view's derivation does (:func:`~mvlog.services.rederive.tasks.write_derived`).

The driver collects one small row per partition (and epoch): it never holds the upstreams' rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from mvlog.catalog import CatalogEntry
from mvlog.changes import apply_changes
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.connectors.spark.job_progress import JobProgress
from mvlog.replay import ReplayRangeError
from mvlog.row_schema import Key, Row
from mvlog.services.backfill.chunked import keep_covered
from mvlog.services.pipeline.join_tasks import (
    empty_joined,
    joined_by_epoch,
    joined_rows_schema,
    joined_to_groups,
    routed_sides,
    shaped_view_rows,
    side_epochs,
    view_changes_by_epoch,
    view_rows_schema,
)
from mvlog.services.pipeline.partition_tasks import (
    ROUTE_TOKEN,
    VIEW_PARTITION,
    check_owned,
    own_partition,
    partitions_of_task,
    require_every_partition,
)
from mvlog.services.pipeline.reading import EpochBatches
from mvlog.services.rederive.derive import DerivationPlan, new_replay_topic
from mvlog.services.rederive.tasks import (
    DERIVED_DDL,
    DERIVED_SCHEMA,
    STAGED_DDL,
    STAGED_SCHEMA,
    DerivedTopic,
    RebuiltState,
    ReplaySession,
    StageFor,
    as_hydration,
    derivation_input,
    folded_rows,
    index_derived,
    stage_part,
    write_derived,
)
from mvlog.services.view_ddl import plan_for
from mvlog.snapshot_plan import SnapshotRecord
from mvlog.views import ChangeBatch, InMemoryState, ViewOperator, ViewPlan
from mvlog.views.keyed_routing import OperatorKeyRouting, operator_key_routing
from mvlog.views.routing import partitions_table, view_key_partitions


@dataclass(frozen=True)
class JoinRebuildJob:
    """``mapInArrow``'s function after the join-key shuffle: one join-key partition's part of the rebuild
    (pickled to the executors)."""

    settings_json: str
    view: CatalogEntry
    upstreams: tuple[CatalogEntry, ...]  # by side: a join's two, a top-N's one
    plan: ViewPlan
    routing: OperatorKeyRouting
    epoch: int  # the view's MCE (a replacement's: F): the one epoch the folded rows carry
    stage_for: StageFor = "view"  # whose staging the tasks fill (see DeriveJob.stage_for)
    covers: Callable[[str, Key], bool] | None = None  # a view still backfilling (see DeriveJob.covers)

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found = own_partition(batches, VIEW_PARTITION)
        if found is None:
            return
        partition, rows = found
        if (groups := self.routing.groups) is None:
            yield pa.RecordBatch.from_pylist([self.stage(partition, rows)], schema=STAGED_SCHEMA)
            return
        # A GROUP BY over the join: the task stages the join's state only and sends its joined rows to their
        # groups' partitions (rows of ``joined_rows_schema``), where :class:`GroupRebuildJob` folds them.
        inputs = self._inputs(rows)
        state = InMemoryState()
        writes: dict[bytes, bytes | None] = {}
        joined = self.routing.first_step(partition).joined(inputs, state, writes) if inputs else None
        state.apply(writes)
        self._stage(partition, {}, state)
        if joined is not None and joined.num_rows:
            tokens = pa.array(partition_tokens(self.view.partitions), pa.int32())
            yield from joined_to_groups(joined_rows_schema(self.routing), joined, self.epoch, groups,
                                        tokens).to_batches()

    def stage(self, partition: int, rows: pa.Table | None) -> dict[str, Any]:
        """Partition ``partition``'s rows and operator state at the epoch, staged for the view's rebuild
        or its replacement's hydration."""
        state = InMemoryState()
        view_rows: dict[Key, Row] = {}
        if (inputs := self._inputs(rows)) is not None:
            output = self.routing.first_step(partition).apply_epoch(inputs, state)
            state.apply(output.state_writes)
            apply_changes(view_rows, output.changes.to_changes())
        return {"partition": partition, "rows": self._stage(partition, view_rows, state), "state": len(state.data),
                "changes": 0}

    def _stage(self, partition: int, view_rows: dict[Key, Row], state: InMemoryState) -> int:
        """Stage the task's part: its view rows and its join-key partition's state (checked to be its own)."""
        check_owned(self.view.name, partition, dict.fromkeys(state.data), self.routing.partitions_of_state_keys)
        return stage_part(Settings.from_executor_json(self.settings_json), self.stage_for, self.view, view_rows,
                          state.data)

    def _inputs(self, rows: pa.Table | None) -> dict[str, ChangeBatch] | None:
        """The task's rows at the epoch, each side's under its input name (those the backfill covers)."""
        epochs: EpochBatches = {}
        if rows is not None:
            side_epochs(rows, self.upstreams, self.routing, epochs)
        if (covers := self.covers) is not None:  # asked by upstream (a self-join's second side: its view's)
            upstream_of = dict(zip(self.routing.inputs(), self.routing.upstreams(), strict=True))
            keep_covered(epochs, lambda name, key: covers(upstream_of[name], key))
        return epochs.get(self.epoch)


@dataclass(frozen=True)
class GroupRebuildJob:
    """``mapInArrow``'s function after the group shuffle of a GROUP BY over a join's rebuild: one view
    partition's groups folded from their joined rows at the epoch, staged beside the join-key tasks' state
    (other keys: the rebuild's staging takes disjoint parts)."""

    settings_json: str
    view: CatalogEntry
    routing: OperatorKeyRouting  # its groups: a GROUP BY over the join's
    epoch: int
    stage_for: StageFor = "view"

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found = own_partition(batches, VIEW_PARTITION)
        if found is None:
            return
        partition, rows = found
        empty = empty_joined(self.routing)
        joined = joined_by_epoch(rows, empty).get(self.epoch, empty) if rows is not None else empty
        assert self.routing.groups is not None
        operator = ViewOperator(self.routing.operator_plan(), share=self.routing.groups.share(partition))
        output = operator.aggregate_joined(joined, InMemoryState())
        check_owned(self.view.name, partition, output.state_writes, self.routing.groups.partitions_of_state_keys)
        view_rows: dict[Key, Row] = {}
        apply_changes(view_rows, output.changes.to_changes())
        state, _ = output.state_puts_and_deletes()
        settings = Settings.from_executor_json(self.settings_json)
        staged = stage_part(settings, self.stage_for, self.view, view_rows, state)
        yield pa.RecordBatch.from_pylist([{"partition": partition, "rows": staged, "state": len(state), "changes": 0}],
                                         schema=STAGED_SCHEMA)


@dataclass(frozen=True)
class KeyedView:
    """A view the tasks run by operator key (an equi-join of two views or of one with itself, a top-N of
    one view: :func:`~mvlog.views.keyed_routing.routed_by_operator_key`): what its jobs need."""

    entry: CatalogEntry
    upstreams: tuple[CatalogEntry, ...]  # by side
    plan: ViewPlan
    routing: OperatorKeyRouting

    @classmethod
    def of(cls, settings: Settings, client: redis.Redis, name: str) -> KeyedView | None:
        """View ``name``'s, or None when the tasks do not run it by operator key."""
        catalog = CatalogStore(settings, client)
        entry = catalog.get(name)
        plan = plan_for(catalog, entry.name, entry.sql or "")
        if (routing := operator_key_routing(plan, entry.partitions)) is None:
            return None
        return cls(entry, tuple(catalog.get(upstream) for upstream in routing.upstreams()), plan, routing)


@dataclass(frozen=True)
class SideRead:
    """What one side's rows at the epoch are folded from: its changelog up to ``upto`` (its last epoch at
    or before the join's), after its ``snapshot``'s rows when it starts from one."""

    upto: int
    snapshot: SnapshotRecord | None = None


class JoinRebuild(ReplaySession):
    """Computes the rows and operator state of a two-view join at one epoch in Spark's tasks (see the
    module): the view's own at its MCE, or a join replacement's first state."""

    def __init__(self, settings: Settings, client: redis.Redis, epoch: int, keyed: KeyedView,
                 reads: dict[str, SideRead], spark: SparkSession | None = None,
                 covers: Callable[[str, Key], bool] | None = None) -> None:
        """``keyed``: the view's (a replacement's: its definition under the view's entry)."""
        self.settings, self.client, self.epoch, self._spark, self.reads = settings, client, epoch, spark, reads
        self.view, self.upstreams, self.view_plan = keyed.entry, keyed.upstreams, keyed.plan
        self.routing = keyed.routing
        self.covers = covers  # a view still backfilling (see DeriveJob.covers)

    @classmethod
    def for_plan(cls, settings: Settings, client: redis.Redis, plan: DerivationPlan,
                 spark: SparkSession | None = None, covers: Callable[[str, Key], bool] | None = None
                 ) -> JoinRebuild | None:
        """The rebuild in tasks, or None when the view is not one the tasks run by operator key
        (:func:`~mvlog.views.keyed_routing.routed_by_operator_key`). ``covers``: of a view still backfilling."""
        if (keyed := KeyedView.of(settings, client, plan.view)) is None:
            return None
        reads = {upstream.name: SideRead(plan.upto(upstream.name), plan.snapshot_of(upstream.name))
                 for upstream in keyed.upstreams}
        return cls(settings, client, plan.last, keyed, reads, spark, covers)

    def rebuild(self, on_progress: Callable[[int, int], None] | None = None) -> RebuiltState:
        """Recompute the view's rows and operator state at the epoch, which must be its MCE, and swap them
        in (refused, nothing changed, when the MCE moved meanwhile). ``on_progress(tasks done, tasks)``:
        called while the job runs."""
        store = ViewStore(self.client, self.settings.topic_prefix)
        store.clear_rebuild(self.view.name)
        rebuilt = self.staged("view", on_progress)
        if not store.swap_rebuild(self.view.name, self.epoch):
            raise ReplayRangeError(f"{self.view.name}: its MCE is no longer {self.epoch}; a consumer "
                                   "of the view is running")
        return rebuilt

    def staged(self, stage_for: StageFor, on_progress: Callable[[int, int], None] | None = None) -> RebuiltState:
        """Run the tasks that stage each join-key partition's rows and operator state at the epoch for
        ``stage_for``; swapping them in is the caller's."""
        settings_json, partitions = self.settings.to_executor_json(), self.view.partitions
        job = JoinRebuildJob(settings_json, self.view, self.upstreams, self.view_plan, self.routing, self.epoch,
                             stage_for, self.covers if stage_for == "view" else None)
        with JobProgress(self.spark, f"mvlog-rebuild-{self.view.name}", on_progress):
            shuffled = self._input().repartition(partitions, ROUTE_TOKEN)
            if self.routing.groups is None:
                results = shuffled.mapInArrow(job.run, STAGED_DDL).toArrow().to_pylist()
            else:  # the join's state by join key, then its joined rows to their groups' partitions
                joined = shuffled.mapInArrow(job.run, from_arrow_schema(joined_rows_schema(self.routing)))
                fold = GroupRebuildJob(settings_json, self.view, self.routing, self.epoch, stage_for)
                results = (joined.repartition(partitions, ROUTE_TOKEN).mapInArrow(fold.run, STAGED_DDL)
                           .toArrow().to_pylist())
        require_every_partition(f"{self.view.name}: the rebuild", (row["partition"] for row in results),
                                self.view.partitions)
        return RebuiltState(sum(row["rows"] for row in results), 0)

    def _input(self) -> DataFrame:
        """Each side's rows at the epoch, one epoch of inserts, routed to the partitions of their join keys."""

        def folded(upstream: CatalogEntry) -> DataFrame:
            read = self.reads[upstream.name]
            return as_hydration(folded_rows(self.spark, self.settings, upstream, read.upto, read.snapshot), self.epoch)

        routed = routed_sides(self.routing, self.upstreams, folded)
        assert routed is not None  # every side is read
        return routed


@dataclass(frozen=True)
class JoinDeriveKeyJob:
    """``mapInArrow``'s function after the join-key shuffle of a derivation into a new changelog: one
    join-key partition's epochs from a fresh operator state, as signed view rows routed to their view
    partitions, plus a count row to view partition ``j`` (so its task runs even without a change)."""

    view: CatalogEntry
    upstreams: tuple[CatalogEntry, ...]  # by side: a join's two, a top-N's one
    plan: ViewPlan
    routing: OperatorKeyRouting
    prev_epoch: int  # the hydration epoch: both sides' folded rows carry it
    epochs: tuple[int, ...]  # the range, ascending
    out_schema: pa.Schema  # view_rows_schema; a GROUP BY over the join's (``routing.groups``): joined_rows_schema

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for partition, rows in partitions_of_task(batches, VIEW_PARTITION, shuffled=True):
            yield from self._partition(partition, rows).to_batches()

    def _partition(self, partition: int, rows: pa.Table) -> pa.Table:
        inputs: EpochBatches = {}
        side_epochs(rows, self.upstreams, self.routing, inputs)
        operator, state = self.routing.first_step(partition), InMemoryState()
        of_vnode = partitions_table(self.view.partitions)
        tokens = pa.array(partition_tokens(self.view.partitions), pa.int32())
        mark = pa.array([partition], pa.int32())
        out = [shaped_view_rows(self.out_schema, None, self.prev_epoch, pa.array([0], pa.int64()), partition, 0, 0,
                                mark, tokens)]
        for epoch in (self.prev_epoch, *self.epochs):
            if epoch not in inputs:
                continue  # neither side changed in this join-key partition
            if (groups := self.routing.groups) is not None:  # the joined rows, to their groups' partitions (the
                # hydration's too), where GroupDeriveWriteJob folds them
                writes: dict[bytes, bytes | None] = {}
                joined = operator.joined(inputs[epoch], state, writes)
                state.apply(writes)
                check_owned(self.view.name, partition, writes, self.routing.partitions_of_state_keys)
                out.append(joined_to_groups(self.out_schema, joined, epoch, groups, tokens))
                continue
            output = operator.apply_epoch(inputs[epoch], state)
            state.apply(output.state_writes)
            check_owned(self.view.name, partition, output.state_writes, self.routing.partitions_of_state_keys)
            if epoch == self.prev_epoch:
                continue  # the hydration: the state before the range, not an epoch of it
            changed, weights = output.changes.signed()
            parts = view_key_partitions(self.plan.schema, changed, of_vnode)
            out.append(shaped_view_rows(self.out_schema, changed, epoch, weights, -1, 0, 0, parts, tokens))
        return pa.concat_tables(out)


@dataclass(frozen=True)
class JoinDeriveWriteJob:
    """``mapInArrow``'s function after the view-key shuffle: one view partition's epochs written to the
    target's changelog (:func:`~mvlog.services.rederive.tasks.write_derived`)."""

    settings_json: str
    target: str
    view: CatalogEntry
    plan: ViewPlan
    prev_epoch: int
    epochs: tuple[int, ...]

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settings = Settings.from_executor_json(self.settings_json)
        for partition, rows in partitions_of_task(batches, VIEW_PARTITION, shuffled=True):
            by_epoch = view_changes_by_epoch(rows, self.plan.schema)
            changes = ((epoch, by_epoch.get(epoch) or ChangeBatch.empty(self.plan.schema)) for epoch in self.epochs)
            results = write_derived(settings, self.target, self.view, partition, self.prev_epoch, self.epochs,
                                    changes)
            yield pa.RecordBatch.from_pylist(results, schema=DERIVED_SCHEMA)


@dataclass(frozen=True)
class GroupDeriveWriteJob:
    """``mapInArrow``'s function after the group shuffle of a GROUP BY over a join's derivation: one view
    partition's groups hydrated from their joined rows at the epoch before the range, then each epoch of
    the range folded and written to the target's changelog (:func:`~mvlog.services.rederive.tasks.write_derived`)."""

    settings_json: str
    target: str
    view: CatalogEntry
    routing: OperatorKeyRouting
    prev_epoch: int
    epochs: tuple[int, ...]

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settings = Settings.from_executor_json(self.settings_json)
        empty = empty_joined(self.routing)
        groups = self.routing.groups
        assert groups is not None
        for partition, rows in partitions_of_task(batches, VIEW_PARTITION, shuffled=True):
            by_epoch = joined_by_epoch(rows, empty)
            operator = ViewOperator(self.routing.operator_plan(), share=groups.share(partition))
            state = InMemoryState()
            state.apply(operator.aggregate_joined(by_epoch.get(self.prev_epoch, empty), state).state_writes)

            def changes(by_epoch: dict[int, pa.Table] = by_epoch, state: InMemoryState = state,
                        operator: ViewOperator = operator) -> Iterator[tuple[int, ChangeBatch]]:
                for epoch in self.epochs:
                    output = operator.aggregate_joined(by_epoch.get(epoch, empty), state)
                    state.apply(output.state_writes)
                    yield epoch, output.changes

            results = write_derived(settings, self.target, self.view, partition, self.prev_epoch, self.epochs,
                                    changes())
            yield pa.RecordBatch.from_pylist(results, schema=DERIVED_SCHEMA)


#: The write step of a join's derivation (after the view-key shuffle, or a GROUP BY's group shuffle).
DeriveWrite = JoinDeriveWriteJob | GroupDeriveWriteJob


class JoinDerivation(ReplaySession):
    """Runs a :class:`~mvlog.services.rederive.DerivationPlan` of a two-view equi-join in Spark's tasks,
    into a new changelog (see the module)."""

    def __init__(self, settings: Settings, client: redis.Redis, plan: DerivationPlan, keyed: KeyedView,
                 spark: SparkSession | None = None) -> None:
        self.settings, self.client, self.plan, self._spark = settings, client, plan, spark
        self.view, self.upstreams, self.view_plan = keyed.entry, keyed.upstreams, keyed.plan
        self.routing = keyed.routing

    @classmethod
    def for_plan(cls, settings: Settings, client: redis.Redis, plan: DerivationPlan,
                 spark: SparkSession | None = None) -> JoinDerivation | None:
        """The derivation in tasks, or None when the view is not one the tasks run by operator key."""
        if (keyed := KeyedView.of(settings, client, plan.view)) is None:
            return None
        return cls(settings, client, plan, keyed, spark)

    def run(self, name: str | None = None, on_progress: Callable[[int, int], None] | None = None) -> DerivedTopic:
        """Derive the plan's epochs into the changelog of ``name`` (made up when None; refused when it is a
        table or view, or holds epochs already) and index them."""
        name, topic = new_replay_topic(self.settings, self.client, self.view, name)
        with JobProgress(self.spark, f"mvlog-replay-{name}", on_progress):
            results = self.derive_into(name).toArrow().to_pylist()
        return index_derived(self.settings, self.client, name, topic, self.view, self.plan.epochs, results)

    def derive_into(self, name: str, on_job: Callable[[DeriveWrite], DeriveWrite] | None = None) -> DataFrame:
        """The Spark job that writes the epochs into ``name``'s changelog (not run yet): one result row per
        partition and epoch. ``on_job``: the tests' hook to alter what the partitions write."""
        epochs, partitions = tuple(self.plan.epochs), self.view.partitions
        settings_json, prev = self.settings.to_executor_json(), self.plan.prev_epoch
        write: DeriveWrite
        if self.routing.groups is not None:  # the joined rows to their groups' partitions, folded there
            rows_schema = joined_rows_schema(self.routing)
            keys = JoinDeriveKeyJob(self.view, self.upstreams, self.view_plan, self.routing, prev, epochs, rows_schema)
            write = GroupDeriveWriteJob(settings_json, name, self.view, self.routing, prev, epochs)
        else:
            rows_schema = view_rows_schema(self.view_plan)
            keys = JoinDeriveKeyJob(self.view, self.upstreams, self.view_plan, self.routing, prev, epochs, rows_schema)
            write = JoinDeriveWriteJob(settings_json, name, self.view, self.view_plan, prev, epochs)
        if on_job is not None:
            write = on_job(write)
        routed = routed_sides(self.routing, self.upstreams, lambda upstream: derivation_input(
            self.spark, self.settings, self.client, self.plan, upstream))
        assert routed is not None  # every side is read
        joined = (routed.repartition(partitions, ROUTE_TOKEN)
                  .mapInArrow(keys.run, from_arrow_schema(rows_schema)))
        return joined.repartition(partitions, ROUTE_TOKEN).mapInArrow(write.run, DERIVED_DDL)
