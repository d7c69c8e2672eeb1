"""Driver side of a view whose operator runs in Spark's tasks (``Settings.operators_in_tasks``; issue 19,
first slice): the driver plans a micro-batch and commits its epochs, the tasks do the rest.

For a filter/project view keyed like its upstream (:mod:`mvlog.views.partitioning`), a micro-batch's
DataFrame (the data source's read: one Spark partition per upstream changelog partition, which is the
view's partition of the same number) goes through ``mapInArrow``: each task computes, writes and stages
its partition's epochs (:mod:`~mvlog.services.pipeline.partition_tasks`) and returns a row per epoch.
For a GROUP BY keyed by its groups (:mod:`mvlog.views.routing`), the DataFrame is first shuffled by
Spark so that Spark partition ``p`` holds the rows of the groups of view partition ``p``
(``RouteRows``, then ``repartition`` on a routing token), and each task also reads its groups' state
from Redis and stages the state it leaves. A filter/project that passes its upstream's key through under
other names, or over another partition count, is shuffled the same way by the partition of the key each
row will have (:mod:`mvlog.views.key_routing`: a changelog key's bytes hold its columns' names), with no
state. A two-view equi-join (inner, outer, semi
or anti: :mod:`mvlog.views.join_routing`) goes through two shuffles, by join key and then by view key
(:mod:`~mvlog.services.pipeline.join_tasks`), and so does a top-N, by ranking group and then by view key
(:mod:`mvlog.views.topn_routing`). A global aggregate and a windowed GROUP BY take the GROUP BY's shuffle.
The driver then commits each epoch through the view's
:class:`~mvlog.services.pipeline.committer.EpochCommitter`, in order: the Kafka side is already done
(the partitions' transactions), and the Redis side is one script that swaps every partition's staged
rows in with the epoch index and the MCE
(:class:`~mvlog.connectors.redis.partition_staging.PartitionStaging`). The driver's work per epoch
grows with partitions, never with changes.

Where an epoch becomes final differs from the driver path: a partition's transaction, once committed,
is the partition's attempt at the epoch, never redone (README, Wire format, "A transaction per
partition"). A driver killed after some partitions committed leaves them in Kafka; the next consumer's
tasks find them, write the others, stage all, and the driver commits the epoch in Redis.

What commits the staged epochs is a :class:`TaskCommits`: the view's :class:`ViewCommits`, or a staged
replacement's (:mod:`mvlog.services.replacement.tasks`), whose tasks stage under its own keys and write no
Kafka: the same jobs run either definition of a view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, cast

import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import IntegerType, StructField, StructType

from mvlog.catalog import CatalogEntry
from mvlog.changes import Mutation
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import CommittedEpoch
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.partition_staging import BackfillCommit, PartitionStaging, StagedCounts
from mvlog.connectors.redis.table_writers import TableWriters, plan_through
from mvlog.services.pipeline.committer import EpochCommitter, ScriptCommit
from mvlog.services.pipeline.join_tasks import (
    GroupPartitionJob,
    JoinKeyJob,
    ViewPartitionJob,
    joined_rows_schema,
    routed_sides,
    view_rows_schema,
)
from mvlog.services.pipeline.partition_tasks import (
    RESULT_DDL,
    ROUTE_TOKEN,
    VIEW_PARTITION,
    PartitionJob,
    PartitionTarget,
    RouteRows,
    require_every_partition,
)
from mvlog.services.pipeline.reading import UpstreamReader
from mvlog.services.pipeline.stage import Stage
from mvlog.views import ViewPlan
from mvlog.views.key_routing import KeyRouting
from mvlog.views.keyed_routing import OperatorKeyRouting
from mvlog.views.routing import GroupRouting
from mvlog.views.task_path import Upstream, task_path

log = logging.getLogger(__name__)

_NO_END = 1 << 62  # an epoch above any: EpochIndex.between's upper bound for "everything after"


class TaskEpochs:
    """Runs view ``entry``'s micro-batches in Spark's tasks and commits their epochs."""

    def __init__(self, settings: Settings, entry: CatalogEntry, upstreams: Sequence[CatalogEntry], plan: ViewPlan,
                 committer: TaskCommits, client: redis.Redis,
                 routing: GroupRouting | KeyRouting | OperatorKeyRouting | None = None) -> None:
        self.settings, self.entry, self.plan = settings, entry, plan
        self.upstreams = tuple(upstreams)  # by side: the query's FROM order (one, or a join's two)
        #: Commits what the tasks staged: the view's epochs (:class:`ViewCommits`), or a staged replacement's.
        self.committer = committer
        #: A GROUP BY's: the input is shuffled by its groups' partitions; a renamed or repartitioned
        #: stateless view's: by its key's; a join's: by its join keys' partitions, and the output again by
        #: the view key's (:mod:`~mvlog.services.pipeline.join_tasks`).
        self.routing = routing
        self.staging = PartitionStaging(client, settings.topic_prefix)
        #: Handed to the tasks (:attr:`PartitionTarget.on_written`): fault injection in tests.
        self.on_written: Callable[[int, int], None] | None = None
        self.epochs_written = 0  # partition epochs this consumer's tasks wrote (not found committed)
        #: Partitions of micro-batches this consumer's tasks wrote, and how many of them with a writer their
        #: Python worker kept from an earlier task (:mod:`~mvlog.services.pipeline.kept_writers`).
        self.partition_writes = self.kept_writers = 0
        #: Whether this consumer's last apply in tasks completed. Until one has (and after one failed), an
        #: epoch that some partitions committed may be pending, and only the task path may finish it (it
        #: never writes a partition's committed epoch again; the driver path writes every partition).
        self._resumed = False

    @classmethod
    def for_view(cls, settings: Settings, entry: CatalogEntry, upstreams: Mapping[str, CatalogEntry],
                 plan: ViewPlan, committer: EpochCommitter, client: redis.Redis) -> TaskEpochs | None:
        """The task path of the view, when the setting is on and the view can take it; else None."""
        commits = ViewCommits(committer, PartitionStaging(client, settings.topic_prefix), entry)
        return cls.for_definition(settings, entry, upstreams, plan, commits, client)

    @classmethod
    def for_definition(cls, settings: Settings, entry: CatalogEntry, upstreams: Mapping[str, CatalogEntry],
                       plan: ViewPlan, commits: TaskCommits, client: redis.Redis) -> TaskEpochs | None:
        """The task path of one definition of view ``entry`` (``plan``: the view's own, or a staged
        replacement's, ``entry`` then its entry too), its epochs committed by ``commits``; None when the
        setting is off or the definition's operator does not run in tasks."""
        if not settings.operators_in_tasks:
            return None
        layouts = [Upstream(tuple(upstreams[view].key_columns), upstreams[view].partitions) for view in entry.sources]
        if (path := task_path(plan, layouts, entry.partitions)) is None:
            return None
        routing = path.routing
        if isinstance(routing, (GroupRouting, KeyRouting)) or routing is None:
            return cls(settings, entry, [upstreams[entry.sources[0]]], plan, commits, client, routing)
        # A join, a top-N, a union, a nested GROUP BY: its sides' upstreams (a view read twice: twice).
        return cls(settings, entry, [upstreams[view] for view in routing.upstreams()], plan, commits, client,
                   routing)

    @property
    def resumed(self) -> bool:
        """This consumer's last apply in tasks completed: no epoch that some partitions committed is pending.
        Until then its epochs go the task path whatever the stages (a staged replacement's follower catches
        up in its upkeep): the driver path would write those partitions' epochs again."""
        return self._resumed

    def takes(self, stages: Sequence[Stage], after: int, *, any_size: bool = False) -> bool:
        """Whether the epochs after ``after`` go the task path: no stage of ``stages`` has anything to do to
        them (a backfill running on the driver's way, a replacement that cannot follow or cut over in tasks:
        those go the driver's way; the consumer leaves out the stages its tasks serve), and
        either this consumer's
        last apply in tasks has not completed (see ``_resumed``) or the upstreams hold at least
        ``Settings.tasks_min_records`` change events after it (fewer, a live micro-batch, commit sooner on
        the driver's way; ``any_size``: whatever their size, a replacement's cut-over waits on them)."""
        if not all(stage.idle for stage in stages):
            return False
        least = self.settings.tasks_min_records
        return any_size or not self._resumed or least == 0 or self._pending(after, least) >= least

    def next_epoch(self, after: int) -> int | None:
        """The upstreams' first committed epoch after epoch ``after`` (their epoch index), if any."""
        following = [f.epoch for u in self.upstreams
                     if (f := self.staging.index.first_at_or_after(u.name, 0, after + 1)) is not None]
        return min(following) if following else None

    def plan_through(self) -> int:
        """The last upstream epoch the view may plan through now: a one-upstream view's latest, a join's
        bound (:func:`~mvlog.connectors.redis.table_writers.plan_through`)."""
        return plan_through(self.staging.index, TableWriters(self.staging.redis, self.settings.topic_prefix),
                            self.upstreams)

    def _pending(self, after: int, enough: int) -> int:
        """Change events the upstreams committed after epoch ``after`` (counting stops at ``enough``)."""
        pending = 0
        for upstream in {u.name: u for u in self.upstreams}.values():  # a self-join's once
            for partition in range(upstream.partitions):
                pending += sum(e.records for e in self.staging.index.between(upstream.name, partition, after, _NO_END))
                if pending >= enough:
                    return pending
        return pending

    def apply(self, reader: UpstreamReader, upto: int | None, batch: DataFrame | None = None, *,
              stage: TaskStage | None = None, read_after: int = 0) -> int:
        """Compute, write and commit every epoch above the MCE up to ``upto`` (read with ``reader``), or of
        the stream's micro-batch ``batch`` (the first upstream's signed rows of whole epochs; for a join,
        ending with the data source's end marker); returns the number of epochs committed. ``stage``: a
        stage that shapes the input and adds to the barriers and commits (a chunked backfill);
        ``read_after``: the upstream epoch to read after when above the MCE (the epoch a
        chunked backfill started at)."""
        self._resumed = False  # until this apply completes: it may fail after some partitions committed
        self.committer.ensure_serving_state()  # a wiped Redis is rebuilt before anything is computed
        after = self.committer.mce
        read_after = max(after, read_after)
        target = PartitionTarget(self.settings.to_executor_json(), self.entry, after, self.committer.start_offsets(),
                                 self.next_epoch(read_after), self.on_written,
                                 stage.mutation if stage is not None else None, self.committer.replacement_id)
        if isinstance(self.routing, OperatorKeyRouting):
            results = self._joined(reader, target, upto, batch, stage, read_after)
            if results is None:
                return 0
        else:
            if batch is None:
                assert upto is not None
                batch = reader.frame(self.upstreams[0].name, read_after, upto)
            routing = self.routing
            if stage is not None:
                batch = stage.frame(reader.spark, self.upstreams[0].name, batch)
                assert batch is not None
                # Rows the stage adds come from tasks of their own: every view then takes the shuffle.
                routing = routing or KeyRouting(self.plan, tuple(self.upstreams[0].key_columns), self.entry.partitions)
            job = PartitionJob(target, self.upstreams[0], self.plan, routing)
            results = self._partitioned(batch, routing).mapInArrow(job.run, RESULT_DDL)
        by_epoch: dict[int, list[dict[str, int]]] = {}
        kept: dict[int, bool] = {}
        for row in results.toArrow().to_pylist():
            by_epoch.setdefault(row["epoch"], []).append(row)
            self.epochs_written += int(row["written"])
            kept[row["partition"]] = bool(row["kept_writer"])
        self.partition_writes += len(kept)
        self.kept_writers += sum(kept.values())
        committed = 0
        for epoch in sorted(by_epoch):
            if epoch > self.committer.mce:
                self.committer.commit(epoch, by_epoch[epoch], stage.commit(epoch) if stage is not None else None)
                committed += 1
        self._resumed = True
        if committed:
            what = self.entry.name if self.committer.replacement_id is None else f"{self.entry.name}'s replacement"
            log.debug("%s: %d epoch(s) committed in tasks, MCE %d", what, committed, self.committer.mce,
                      extra={"epochs_in_tasks": (what, committed)})  # counted by the tests' conftest
        return committed

    def _partitioned(self, frame: DataFrame, routing: GroupRouting | KeyRouting | None) -> DataFrame:
        """``frame`` with Spark partition ``p`` holding the input of view partition ``p``: as read (a
        stateless view keyed like its upstream), or shuffled by the partition of each row's group (or, a
        stateless view keyed otherwise, of its key)."""
        if routing is None:
            return frame
        # A new StructType: ``StructType.add`` would change the frame's own (cached) schema in place.
        schema = StructType([*frame.schema.fields, StructField(VIEW_PARTITION, IntegerType(), False),
                             StructField(ROUTE_TOKEN, IntegerType(), False)])
        routed = frame.mapInArrow(RouteRows(routing).run, schema)
        return routed.repartition(self.entry.partitions, ROUTE_TOKEN)

    def _joined(self, reader: UpstreamReader, target: PartitionTarget, upto: int | None, batch: DataFrame | None,
                stage: TaskStage | None, read_after: int) -> DataFrame | None:
        """A join's micro-batch through its two shuffles (:mod:`~mvlog.services.pipeline.join_tasks`): its
        result rows, or None when there is nothing to read. Each side is read after ``read_after`` up to
        ``upto`` or, when the stream gave ``batch`` (its first upstream's, whose end marker the tasks find),
        the other side up to its latest epoch (the tasks drop what is past the marker). A side is never read
        past its latest epoch: the join's bound says a stopped table has nothing more up to there
        (``read_settled``). ``stage`` shapes each side's input (a chunked backfill)."""
        routing = cast(OperatorKeyRouting, self.routing)
        end_side = next(i for i, u in enumerate(self.upstreams) if u.name == self.entry.sources[0])

        def read(upstream: CatalogEntry) -> DataFrame | None:
            if upstream.name == self.entry.sources[0] and batch is not None:
                frame: DataFrame | None = batch
            else:
                end = reader.settled_upto(upstream.name, upto)
                frame = reader.frame(upstream.name, read_after, end) if end > read_after else None
            return stage.frame(reader.spark, upstream.name, frame) if stage is not None else frame

        if (routed := routed_sides(routing, self.upstreams, read)) is None:
            return None
        by_join_key = routed.repartition(self.entry.partitions, ROUTE_TOKEN)
        upstreams = tuple(self.upstreams)
        last = upto if batch is None else None
        if routing.groups is not None:  # a GROUP BY: the joined rows go to their groups' partitions, folded there
            out_schema = joined_rows_schema(routing)
            join = JoinKeyJob(target, upstreams, self.plan, routing, last, end_side, out_schema)
            write: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] = GroupPartitionJob(
                target, routing).run
        else:
            out_schema = view_rows_schema(self.plan)
            join = JoinKeyJob(target, upstreams, self.plan, routing, last, end_side, out_schema)
            write = ViewPartitionJob(target, self.plan).run
        by_view_key = by_join_key.mapInArrow(join.run, from_arrow_schema(out_schema))
        return by_view_key.repartition(self.entry.partitions, ROUTE_TOKEN).mapInArrow(write, RESULT_DDL)



class TaskCommits(Protocol):
    """What commits the epochs of a micro-batch that Spark's tasks computed and staged, a view partition
    each: the view's (:class:`ViewCommits`), or a staged replacement's
    (:class:`~mvlog.services.replacement.tasks.ReplacementCommits`)."""

    #: The replacement whose epochs these are (its id; the tasks then stage its keys and write no Kafka), or None.
    replacement_id: str | None

    @property
    def mce(self) -> int:
        """The last epoch committed."""
        ...

    def ensure_serving_state(self) -> bool:
        """Before a micro-batch is computed: rebuild a wiped serving state (True: it was)."""
        ...

    def start_offsets(self) -> dict[int, int]:
        """Per view partition, the changelog offset after the MCE's barrier, where the tasks look for
        the epochs an earlier attempt committed."""
        ...

    def commit(self, epoch: int, rows: Sequence[Mapping[str, int]], backfill: BackfillCommit | None) -> None:
        """Commit ``epoch`` from its partitions' result rows (``backfill``: what a chunked backfill adds)."""
        ...


class ViewCommits:
    """A view's epochs computed in tasks, committed by its :class:`EpochCommitter`: the Kafka side is the
    tasks' transactions, the Redis side the partitions' staging swapped in with the index and the MCE."""

    replacement_id: str | None = None

    def __init__(self, committer: EpochCommitter, staging: PartitionStaging, entry: CatalogEntry) -> None:
        self.committer, self.staging, self.entry = committer, staging, entry

    @property
    def mce(self) -> int:
        return self.committer.mce

    def ensure_serving_state(self) -> bool:
        return self.committer.ensure_serving_state()

    def start_offsets(self) -> dict[int, int]:
        return self.staging.index.offsets_after(self.entry.name, self.entry.partitions, self.mce or None)

    def commit(self, epoch: int, rows: Sequence[Mapping[str, int]], backfill: BackfillCommit | None) -> None:
        commit_partition_results(self.committer, self.staging, self.entry, epoch, rows, backfill)


class TaskStage(Protocol):
    """What a stage does to a micro-batch run in tasks (a chunked backfill:
    :class:`~mvlog.services.backfill.task_chunks.BackfillBatch`)."""

    def frame(self, spark: SparkSession, source: str, read: DataFrame | None) -> DataFrame | None:
        """The view's input from upstream ``source``'s read (None: nothing read of it)."""
        ...

    def mutation(self, epoch: int) -> Mutation:
        """What the epoch's barriers carry (called in the tasks)."""
        ...

    def commit(self, epoch: int) -> BackfillCommit:
        """What the epoch's Redis commit adds."""
        ...


def commit_partition_results(committer: EpochCommitter, staging: PartitionStaging, entry: CatalogEntry, epoch: int,
                             rows: Sequence[Mapping[str, int]], backfill: BackfillCommit | None = None) -> None:
    """One epoch's Redis commit through the committer, from its partitions' result rows
    (:data:`~mvlog.services.pipeline.partition_tasks.RESULT_SCHEMA`): its Kafka side is the tasks'
    transactions, its Redis side the partitions' staging swapped in with the index and the MCE (and
    ``backfill``'s fields)."""
    follows = committer.mce

    def apply(index: Mapping[int, IndexEntry], staged: Mapping[int, StagedCounts]) -> bool:
        return staging.commit(entry.name, epoch, follows, staged, index, backfill)

    commit_results(committer, entry, epoch, rows, apply)


def commit_results(committer: EpochCommitter, entry: CatalogEntry, epoch: int, rows: Sequence[Mapping[str, int]],
                   apply: Callable[[Mapping[int, IndexEntry], Mapping[int, StagedCounts]], bool]) -> None:
    """Commit ``epoch`` of view ``entry`` through its committer from its partitions' result rows (every
    partition's, checked): the Kafka side is the tasks' transactions (their barriers the epoch's index), the
    Redis side ``apply(index, staged counts)``, one script (a view's epoch, or a replacement's cut-over)."""
    require_every_partition(f"{entry.name}: epoch {epoch}", (row["partition"] for row in rows), entry.partitions)
    index = {row["partition"]: IndexEntry(epoch, row["offset"], row["records"]) for row in rows}
    staged = staged_counts(rows)
    committer.commit(epoch, lambda _writer: CommittedEpoch(epoch, index), ScriptCommit(lambda _: apply(index, staged)))


def staged_counts(rows: Sequence[Mapping[str, int]]) -> dict[int, StagedCounts]:
    """Per partition, what its task staged for one epoch, from the epoch's result rows."""
    return {row["partition"]: StagedCounts(row["puts"], row["deletes"], row["order_puts"], row["order_deletes"],
                                           row["state_puts"], row["state_deletes"]) for row in rows}
