"""``replay derive --engine spark`` in Spark's tasks: each partition of the view re-derived by one task.

The driver engines (:mod:`mvlog.services.rederive.derive`) fold the upstream's log into rows, collect them and
the range's epochs to the driver and run the operator there, one epoch at a time. For a view whose
operator runs in tasks (a filter/project that passes its upstream's key through, a GROUP BY keyed by
its groups: the routings of :mod:`mvlog.views.key_routing` and :mod:`mvlog.views.routing`), nothing of
that needs the driver:

1. Spark SQL folds the upstream's log up to the epoch before the range into its last image per key,
   shaped as the data source's signed rows of one epoch (``prev_epoch``: the hydration epoch, all
   inserts), and the range's epochs are read as they are (barriers included);
2. both go through the view's routing and one shuffle, so Spark partition ``p`` holds the input of view
   partition ``p`` (each barrier copied to every partition);
3. task ``p`` hydrates a fresh operator state from the prefix rows (the operator's hydration path, as a
   backfill does), computes the range's epochs in order, and writes partition ``p`` of each epoch to
   the new changelog in a transaction of its own (``<prefix>.<name>.p<p>``: its ``init_transactions``
   fences an earlier attempt of the partition; the epochs that attempt committed are found by their
   barriers and not written again, as a view's partition task does);
4. the driver collects one small row per partition and epoch and indexes the epochs.

``replay derive --rebuild`` runs the same tasks up to the view's MCE, but each task writes nothing to
Kafka: it stages its partition's rows, key-order members and operator state for the rebuild in Redis
(disjoint per partition; a retried task stages the same values again), and the driver swaps the staged
rebuild in for the view's in one script, refused when the MCE moved meanwhile. A staged replacement's
first state is staged the same way, from the replacement's definition, into the replacement's own
staging (:func:`mvlog.services.replacement.hydration.hydrate_in_tasks` swaps it in).

The result is the changelog the driver engines write, epoch for epoch and barrier for barrier (the same
``prev_epoch`` chain), and the driver's work grows with partitions and epochs, never with changes. A
join or a top-N (state per join key or ranking group) takes the join's two shuffles
(:mod:`mvlog.services.rederive.join_tasks`), and chains of joins still go the driver's way
(:meth:`TaskDerivation.for_plan` returns None for all three). A global aggregate's one row is derived by
the task of its partition (the others write barriers only), a windowed GROUP BY's windows by the tasks of
their partitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's convention)
from pyspark.sql.types import IntegerType, StructField, StructType

from mvlog.catalog import CatalogEntry
from mvlog.changes import apply_changes
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, encode_batch
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex, IndexEntry
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.change_rows import BARRIER, META_COLUMNS
from mvlog.connectors.spark.job_progress import JobProgress
from mvlog.connectors.spark.source_options import changelog_read
from mvlog.partition_epochs import prev_epochs, resume_partition
from mvlog.replay import ReplayRangeError
from mvlog.row_schema import Key, Row
from mvlog.services.backfill.chunked import keep_covered
from mvlog.services.pipeline.partition_tasks import (
    ROUTE_TOKEN,
    SOURCE_ORDER,
    VIEW_PARTITION,
    RouteRows,
    check_owned,
    partition_transactional_id,
    partitions_of_task,
    require_every_partition,
    written_or_found,
)
from mvlog.services.pipeline.reading import EpochBatches, batches_from_arrow
from mvlog.services.rederive.derive import DerivationPlan, last_images, new_replay_topic, serving_rows
from mvlog.services.snapshot_compaction import read_snapshot
from mvlog.services.view_ddl import plan_for
from mvlog.snapshot_plan import SnapshotRecord
from mvlog.views import ChangeBatch, EpochOutput, InMemoryState, ViewOperator, ViewPlan
from mvlog.views.key_routing import KeyRouting, one_upstream_routing
from mvlog.views.routing import GroupRouting

#: Whose staging a rebuild's tasks fill (:attr:`DeriveJob.stage_for`).
StageFor = Literal["view", "replacement"]

#: One row per (partition, epoch) a task wrote or found committed.
DERIVED_SCHEMA = pa.schema([("partition", pa.int32()), ("epoch", pa.int64()), ("offset", pa.int64()),
                            ("records", pa.int64()), ("written", pa.bool_())])
DERIVED_DDL = "`partition` INT, `epoch` BIGINT, `offset` BIGINT, `records` BIGINT, `written` BOOLEAN"
#: A rebuild's: one row per partition, what it staged.
STAGED_SCHEMA = pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("state", pa.int64()),
                           ("changes", pa.int64())])
STAGED_DDL = "`partition` INT, `rows` BIGINT, `state` BIGINT, `changes` BIGINT"


@dataclass(frozen=True)
class DeriveJob:
    """What every task of one derivation needs (pickled to the executors with the task function)."""

    settings_json: str
    target: str  # the name the new changelog is indexed under (a rebuild: the view's own name)
    view: CatalogEntry
    upstream: CatalogEntry
    plan: ViewPlan
    prev_epoch: int  # the hydration epoch: the prefix rows carry it; the first derived barrier names it
    epochs: tuple[int, ...]  # the epochs to derive, ascending
    routing: GroupRouting | KeyRouting  # how the rows reached their partitions (and whose state is whose)
    #: False: write the epochs to the target's changelog. True: write nothing to Kafka, and stage the
    #: partition's rows and operator state after the last epoch in Redis, for ``stage_for``.
    rebuild: bool = False
    #: Whose staging a rebuild fills: the view's own rebuild (``view``), or the first state of the view's
    #: staged replacement (``replacement``: ``view`` and ``plan`` are then the replacement's definition).
    stage_for: StageFor = "view"
    #: A rebuild of a view still backfilling: ``covers(upstream, key)``, the upstream keys its chunked
    #: backfill had reached at the last epoch (the view holds only those); None: every key.
    covers: Callable[[str, Key], bool] | None = None

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``'s function: the task's shuffled rows in, one row per partition and epoch (a
        rebuild: per partition) out."""
        settings = Settings.from_executor_json(self.settings_json)
        for partition, rows in partitions_of_task(batches, VIEW_PARTITION, shuffled=True):
            rows = rows.drop_columns([VIEW_PARTITION, ROUTE_TOKEN]).sort_by(SOURCE_ORDER)
            if self.rebuild:
                yield pa.RecordBatch.from_pylist([self.stage(settings, partition, rows)], schema=STAGED_SCHEMA)
            else:
                yield pa.RecordBatch.from_pylist(self.write(settings, partition, rows), schema=DERIVED_SCHEMA)

    def derive(self, partition: int, rows: pa.Table) -> tuple[Iterator[tuple[int, EpochOutput]], InMemoryState]:
        """The partition's epochs from its rows: the operator state hydrated from the hydration epoch's
        rows (the state the iterator's epochs then move on), and each epoch's output in order."""
        inputs: EpochBatches = {}
        batches_from_arrow(rows, self.upstream, inputs)
        if self.covers is not None:
            keep_covered(inputs, self.covers)
        operator, state = ViewOperator(self.plan, share=self.routing.share(partition)), InMemoryState()
        hydration = None
        if (prefix := inputs.get(self.prev_epoch)) is not None:
            hydration = operator.apply_epoch(prefix, state)
            state.apply(hydration.state_writes)

        def epochs() -> Iterator[tuple[int, EpochOutput]]:
            if hydration is not None:
                yield self.prev_epoch, hydration
            for epoch in self.epochs:
                output = operator.apply_epoch(inputs.get(epoch, {}), state)
                state.apply(output.state_writes)
                yield epoch, output

        return epochs(), state

    def write(self, settings: Settings, partition: int, rows: pa.Table) -> list[dict[str, Any]]:
        """Partition ``partition``'s epochs written to the target's changelog (:func:`write_derived`)."""
        epochs, _ = self.derive(partition, rows)
        changes = ((epoch, output.changes) for epoch, output in epochs
                   if epoch != self.prev_epoch)  # the hydration: the state before the range, not an epoch of it
        return write_derived(settings, self.target, self.view, partition, self.prev_epoch, self.epochs, changes)

    def stage(self, settings: Settings, partition: int, rows: pa.Table) -> dict[str, Any]:
        """Partition ``partition``'s rows and operator state after the last epoch, staged for the view's
        rebuild (:meth:`~mvlog.connectors.redis.epoch_commit.EpochCommits.stage_rebuild`)."""
        epochs, state = self.derive(partition, rows)
        view_rows: dict[Key, Row] = {}
        changes = 0
        for epoch, output in epochs:
            found = output.changes.to_changes()
            apply_changes(view_rows, found)
            changes += len(found) if epoch != self.prev_epoch else 0
        check_owned(self.view.name, partition, dict.fromkeys(state.data), self.routing.partitions_of_state_keys)
        staged = stage_part(settings, self.stage_for, self.view, view_rows, state.data)
        return {"partition": partition, "rows": staged, "state": len(state.data), "changes": changes}


def stage_part(settings: Settings, stage_for: StageFor, view: CatalogEntry, rows: Mapping[Key, Row],
               state: Mapping[bytes, bytes]) -> int:
    """Stage a task's part of ``view``'s rows and operator state: for the view's rebuild, with the rows'
    key-order members, or for its staged replacement's hydration, whose apply diffs rows (it keeps no key
    order of its own). Returns the rows staged."""
    encoded, order = serving_rows(view.key_columns, rows)
    client = redis_client.task_client(settings)
    if stage_for == "replacement":
        ReplacementStore(client, settings.topic_prefix).stage_hydration(view.name, encoded, state)
    else:
        ViewStore(client, settings.topic_prefix).stage_rebuild(view.name, encoded, state, order)
    return len(encoded)


def write_derived(settings: Settings, target: str, view: CatalogEntry, partition: int, prev_epoch: int,
                  epochs: Sequence[int], changes: Iterable[tuple[int, ChangeBatch]]) -> list[dict[str, Any]]:
    """Partition ``partition``'s ``changes`` of ``epochs`` (in order; each epoch's) written to ``target``'s
    changelog, each epoch in its own transaction unless an earlier attempt committed it (its barrier
    found: then checked, not written again); one :data:`DERIVED_SCHEMA` row per epoch."""
    found = partition_barriers(settings, target, partition, 0)
    committed = resume_partition(partition, prev_epoch, list(epochs), found)
    prev = prev_epochs(prev_epoch, list(epochs))
    results: list[dict[str, Any]] = []
    writer = ChangelogWriter(settings, target, view.key_columns, view.partitions,
                             transactional_id=partition_transactional_id(settings, target, partition),
                             partition=partition)
    try:
        for epoch, batch in changes:
            encoded = encode_batch(view.key_columns, batch)
            barrier = written_or_found(writer, partition, epoch, prev[epoch], encoded, committed.get(epoch))
            results.append({"partition": partition, "epoch": epoch, "offset": barrier.offset,
                            "records": barrier.records, "written": epoch not in committed})
    finally:
        writer.close()
    return results


def index_derived(settings: Settings, client: redis.Redis, name: str, topic: str, view: CatalogEntry,
                  epochs: Sequence[int], results: Iterable[dict[str, Any]]) -> DerivedTopic:
    """Index the epochs the tasks wrote into ``name``'s changelog (their :data:`DERIVED_SCHEMA` rows),
    each epoch once every partition has it."""
    by_epoch: dict[int, dict[int, IndexEntry]] = {}
    changes = 0
    for row in results:
        by_epoch.setdefault(row["epoch"], {})[row["partition"]] = IndexEntry(row["epoch"], row["offset"],
                                                                              row["records"])
        changes += row["records"]
    index = EpochIndex(client, settings.topic_prefix)
    for epoch in epochs:
        require_every_partition(f"{name}: epoch {epoch}", by_epoch.get(epoch, {}), view.partitions)
        index.add(name, by_epoch[epoch])
    return DerivedTopic(name, topic, len(epochs), changes)


def derivation_input(spark: SparkSession, settings: Settings, client: redis.Redis, plan: DerivationPlan,
                     upstream: CatalogEntry) -> DataFrame:
    """``upstream``'s part of a derivation: its last image per key up to the plan's ``prev_epoch``, as
    signed rows of that one epoch (the hydration), then the range's epochs as read."""
    frame = changelog_read(spark, settings, upstream.name, plan.prev_epoch, plan.upto(upstream.name))
    index = EpochIndex(client, settings.topic_prefix)
    if (prefix := rows_before(spark, settings, index, plan, upstream)) is None:
        return frame
    return as_hydration(prefix, plan.prev_epoch).select(*frame.columns).unionByName(frame)


def rows_before(spark: SparkSession, settings: Settings, index: EpochIndex, plan: DerivationPlan,
                upstream: CatalogEntry) -> DataFrame | None:
    """``upstream``'s rows as of the epoch before ``plan``'s range (:func:`folded_rows`, from the snapshot the
    plan starts it from, if any), not run yet; None when it has none there."""
    before = index.before(upstream.name, 0, min(plan.prev_epoch, plan.upto(upstream.name)) + 1)
    snapshot = plan.snapshot_of(upstream.name)
    if before is None and snapshot is None:
        return None
    return folded_rows(spark, settings, upstream, before.epoch if before is not None else 0, snapshot)


def folded_rows(spark: SparkSession, settings: Settings, upstream: CatalogEntry, upto: int,
                snapshot: SnapshotRecord | None = None) -> DataFrame:
    """``upstream``'s rows at epoch ``upto`` (the data source's signed rows, each key's last image): Spark SQL
    folds its changelog up to there (:func:`~mvlog.services.rederive.last_images`), from its first epoch,
    or after ``snapshot``'s epoch over that snapshot's rows (retention deleted the log's start)."""
    log = changelog_read(spark, settings, upstream.name, snapshot.epoch if snapshot is not None else 0, upto)
    if snapshot is not None:
        log = snapshot_hydration(spark, upstream, snapshot).unionByName(log)
    return last_images(log)


def as_hydration(rows: DataFrame, epoch: int) -> DataFrame:
    """``rows`` (a changelog's columns) as the data source's signed rows of one epoch, ``epoch``, all
    inserts: an operator's hydration."""
    return (rows.withColumn("_epoch", F.lit(epoch).cast("bigint")).withColumn("_change_type", F.lit("insert"))
            .withColumn("_weight", F.lit(1).cast("int")))


@dataclass(frozen=True)
class DerivedTopic:
    name: str
    topic: str
    epochs: int
    changes: int


@dataclass(frozen=True)
class RebuiltState:
    rows: int  # the view's rows, swapped in
    changes: int  # the changes of the plan's epochs (the hydration's not counted)


def replay_session(settings: Settings, view: str) -> SparkSession:
    """The Spark session of a replay or rebuild of ``view`` run by a command (not a consumer's)."""
    from mvlog.services.spark.session import spark_session

    return spark_session(settings, app_name=f"mvlog-replay-{view}")


class ReplaySession:
    """A derivation's Spark session: the one it was given (a consumer's), or made on first use, so that a
    dry run starts no Spark."""

    settings: Settings
    view: CatalogEntry
    _spark: SparkSession | None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = replay_session(self.settings, self.view.name)
        return self._spark


class TaskDerivation(ReplaySession):
    """Runs a :class:`~mvlog.services.rederive.DerivationPlan` of a one-upstream view in Spark's tasks,
    into a new changelog (see the module's docstring)."""

    def __init__(self, settings: Settings, client: redis.Redis, plan: DerivationPlan, view: CatalogEntry,
                 upstream: CatalogEntry, view_plan: ViewPlan, routing: GroupRouting | KeyRouting,
                 spark: SparkSession | None = None, covers: Callable[[str, Key], bool] | None = None,
                 snapshot: SnapshotRecord | None = None) -> None:
        self.settings, self.client, self.plan, self._spark = settings, client, plan, spark
        self.view, self.upstream, self.view_plan, self.routing = view, upstream, view_plan, routing
        self.covers = covers  # see DeriveJob.covers
        #: The upstream's snapshot at the hydration epoch (``plan.prev_epoch``), read instead of folding
        #: its changelog (a replacement's hydration from a snapshot: ``plan`` then has no epoch).
        self.snapshot = snapshot

    @classmethod
    def for_plan(cls, settings: Settings, client: redis.Redis, plan: DerivationPlan,
                 spark: SparkSession | None = None, covers: Callable[[str, Key], bool] | None = None
                 ) -> TaskDerivation | None:
        """The derivation in tasks, or None when the view's operator does not run in tasks this way (a
        join or a top-N: :class:`~mvlog.services.rederive.join_tasks.JoinDerivation`; a chain of joins: the
        driver engines). ``covers``: a rebuild's of
        a view still backfilling (:attr:`DeriveJob.covers`)."""
        catalog = CatalogStore(settings, client)
        view = catalog.get(plan.view)
        if len(view.sources) != 1:
            return None
        upstream = catalog.get(view.sources[0])
        view_plan = plan_for(catalog, view.name, view.sql or "")
        routing = one_upstream_routing(view_plan, upstream.key_columns, view.partitions)
        if routing is None:
            return None
        return cls(settings, client, plan, view, upstream, view_plan, routing, spark, covers)

    def run(self, name: str | None = None, on_progress: Callable[[int, int], None] | None = None) -> DerivedTopic:
        """Derive the plan's epochs into the changelog of ``name`` (made up when None; refused when it is
        a table or view, or holds epochs already) and index them. ``on_progress(tasks done, tasks)``:
        called while the job runs (:class:`~mvlog.connectors.spark.job_progress.JobProgress`)."""
        name, topic = new_replay_topic(self.settings, self.client, self.view, name)
        with JobProgress(self.spark, f"mvlog-replay-{name}", on_progress):
            results = self.derive_into(name).toArrow().to_pylist()
        return index_derived(self.settings, self.client, name, topic, self.view, self.plan.epochs, results)

    def rebuild(self, on_progress: Callable[[int, int], None] | None = None) -> RebuiltState:
        """Recompute the view's rows and operator state at the plan's last epoch, which must be its MCE, and
        swap them in for the view's (refused, nothing changed, when the MCE moved meanwhile: a consumer of
        the view is running). Each task stages its partition's part; the driver swaps them in in one step."""
        store = ViewStore(self.client, self.settings.topic_prefix)
        store.clear_rebuild(self.view.name)
        rebuilt = self.staged("view", on_progress)
        if not store.swap_rebuild(self.view.name, self.plan.last):
            raise ReplayRangeError(f"{self.view.name}: its MCE is no longer {self.plan.last}; a consumer "
                                   "of the view is running: stop it before rebuilding")
        return rebuilt

    def staged(self, stage_for: StageFor, on_progress: Callable[[int, int], None] | None = None) -> RebuiltState:
        """Run the tasks that stage each partition's rows and operator state at the plan's last epoch for
        ``stage_for`` (see :attr:`DeriveJob.stage_for`); swapping them in is the caller's."""
        with JobProgress(self.spark, f"mvlog-rebuild-{self.view.name}", on_progress):
            job = self._job(self.view.name, rebuild=True, stage_for=stage_for)
            results = self._derived(job).toArrow().to_pylist()
        require_every_partition(f"{self.view.name}: the rebuild", (row["partition"] for row in results),
                                self.view.partitions)
        return RebuiltState(sum(row["rows"] for row in results), sum(row["changes"] for row in results))

    def derive_into(self, name: str, on_job: Callable[[DeriveJob], DeriveJob] | None = None) -> DataFrame:
        """The Spark job that writes the epochs into ``name``'s changelog (not run yet): one result row per
        partition and epoch. ``on_job``: the tests' hook to alter the job."""
        job = self._job(name, rebuild=False)
        return self._derived(on_job(job) if on_job is not None else job)

    def _job(self, target: str, *, rebuild: bool, stage_for: StageFor = "view") -> DeriveJob:
        return DeriveJob(self.settings.to_executor_json(), target, self.view, self.upstream, self.view_plan,
                         self.plan.prev_epoch, tuple(self.plan.epochs), self.routing, rebuild, stage_for,
                         self.covers if rebuild else None)

    def _derived(self, job: DeriveJob) -> DataFrame:
        """``job`` over the input, routed and shuffled so that task ``p`` holds view partition ``p``'s."""
        frame = self._input()
        schema = StructType([*frame.schema.fields, StructField(VIEW_PARTITION, IntegerType(), False),
                             StructField(ROUTE_TOKEN, IntegerType(), False)])
        routed = frame.mapInArrow(RouteRows(self.routing).run, schema)
        shuffled = routed.repartition(self.view.partitions, ROUTE_TOKEN)
        return shuffled.mapInArrow(job.run, STAGED_DDL if job.rebuild else DERIVED_DDL)

    def _input(self) -> DataFrame:
        """The upstream's last image per key up to ``prev_epoch``, as signed rows of that one epoch, then the
        range's epochs as read."""
        if self.snapshot is not None:
            return snapshot_hydration(self.spark, self.upstream, self.snapshot)
        return derivation_input(self.spark, self.settings, self.client, self.plan, self.upstream)


def snapshot_hydration(spark: SparkSession, upstream: CatalogEntry, snapshot: SnapshotRecord) -> DataFrame:
    """The snapshot's rows as the data source's signed rows of its epoch (all inserts, each a change of its
    own), and one barrier row of that epoch, which the routing copies to every view partition: each
    partition's task then runs, with rows or without."""
    rows = (as_hydration(read_snapshot(spark, upstream, snapshot.path), snapshot.epoch)
            .withColumn("_partition", F.lit(0).cast("int")).withColumn("_offset", F.monotonically_increasing_id())
            .select(*(f"`{name}`" for name in upstream.schema.names), *META_COLUMNS))
    barrier = {**dict.fromkeys(upstream.schema.names), "_epoch": snapshot.epoch, "_change_type": BARRIER,
               "_weight": 0, "_partition": 0, "_offset": -1, "_key": b""}
    return rows.unionByName(spark.createDataFrame([tuple(barrier[f.name] for f in rows.schema)], rows.schema))
