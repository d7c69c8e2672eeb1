"""The Spark consumer that maintains one view, exactly once per epoch: a short loop over its epoch pipeline.

Spark reads the upstream changelogs (:mod:`~mvlog.services.pipeline.reading`; the backlog, then a
streaming query: :mod:`~mvlog.services.pipeline.streaming`). Where the view's operator runs in Spark's
tasks (:mod:`~mvlog.services.pipeline.task_epochs`), a micro-batch goes there whole, a staged replacement's
epochs first (:mod:`~mvlog.services.replacement.tasks`). Otherwise, for every epoch above the MCE, in
order, the stages see it first (:mod:`~mvlog.services.pipeline.stage`: a replacement followed or cut
over, a chunked backfill's filter and chunk), the operator computes its changes from the state at the
MCE, and the :class:`~mvlog.services.pipeline.committer.EpochCommitter` commits them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import partial

import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.table_writers import TableWriters, plan_through
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.spark_source import trigger_ends
from mvlog.services.backfill.chunked import ChunkedBackfill
from mvlog.services.backfill.stages import backfill_stages
from mvlog.services.pipeline.committer import EpochCommitter
from mvlog.services.pipeline.reading import EpochBatches, UpstreamReader, batches_from_arrow
from mvlog.services.pipeline.stage import EpochWork, Stage
from mvlog.services.pipeline.streaming import MicroBatchRunner
from mvlog.services.pipeline.task_epochs import TaskEpochs
from mvlog.services.pipeline.view_commit import commit_view_epoch
from mvlog.services.rederive.state_rebuild import rederive_state
from mvlog.services.replacement.operations import complete_apply
from mvlog.services.replacement.stage import ReplacementStage
from mvlog.services.spark.session import spark_session
from mvlog.services.view_ddl import plan_for
from mvlog.views import ChangeBatch, EpochOutput, ViewOperator, ViewPlan
from mvlog.views.state import StoredState


class ViewConsumer:
    """Maintains view ``view`` from its upstream changelog(s)."""

    def __init__(self, settings: Settings, view: str, *, spark: SparkSession | None = None,
                 client: redis.Redis | None = None, max_epochs_per_trigger: int | None = None,
                 trigger_interval: str = "200 milliseconds") -> None:
        self.settings, self.trigger_interval = settings, trigger_interval
        self._redis = client or redis_client.connect(settings)
        self.catalog = CatalogStore(settings, self._redis)
        if (entry := self.catalog.get(view)).kind != "view" or entry.sql is None:
            raise ValueError(f"{view} is a {entry.kind}; only views are maintained by a consumer")
        replacements = ReplacementStore(self._redis, settings.topic_prefix)
        self.entry = complete_apply(self.catalog, replacements, view)  # finish an interrupted apply
        assert self.entry.sql is not None
        self.upstreams = {name: self.catalog.get(name) for name in self.entry.sources}
        self.plan = plan_for(self.catalog, view, self.entry.sql)
        self.operator = ViewOperator(self.plan)
        self.store = ViewStore(self._redis, settings.topic_prefix)
        self.spark = spark or spark_session(settings, app_name=f"mvlog-{view}")
        self.max_epochs_per_trigger = max_epochs_per_trigger or settings.max_epochs_per_trigger
        # Its writer fences earlier consumers; it rebuilds a wiped Redis (or waits), re-derives state left to it.
        in_tasks = self.spark if settings.operators_in_tasks else None
        self.committer = EpochCommitter.for_view(
            settings, self._redis, self.entry, self.catalog, lambda: self.backfills.lifecycle(),
            lambda: rederive_state(settings, self._redis, self.entry, in_tasks))
        self.committer.rebuild_if_wiped()
        self.tasks = self._task_path()
        self.reader = UpstreamReader(settings, self.spark, self.upstreams, self.store.index,
                                     self.max_epochs_per_trigger, task_per_partition=self.tasks is not None)
        self.backfills = backfill_stages(settings, self._redis, self.store, self.catalog, self.entry, self.upstreams,
                                         self.plan, self.committer, self.spark, in_tasks=self.tasks is not None)
        self.replacement = ReplacementStage(self.entry, self.catalog, replacements, self.store,
                                            SnapshotStore.of(settings, self._redis), self.reader, self.committer,
                                            self._adopt)
        # The replacement first: it sees the upstream's epoch as it is, and may take it (a cut-over).
        self.stages: list[Stage] = [self.replacement, *self.backfills.stages]
        self._lock = threading.RLock()  # epochs and upkeep never interleave (micro-batches, the idle upkeep)
        self._stopped = False  # set under the lock by stop(): nothing is applied after (see stop)
        # Reads the backlog, then the stream; applies micro-batches on its worker thread (see apply_batch).
        self.runner = MicroBatchRunner(view, lambda table: self.apply_batch(table), self._upkeep)
        self._state = StoredState(partial(self.store.get_state, view))  # the operator's, in Redis

    @property
    def mce(self) -> int:
        """The view's MCE, as this consumer follows it."""
        return self.committer.mce

    @property
    def _after(self) -> int:
        """The last upstream epoch applied: the MCE, or the epoch a chunked backfill started after."""
        return max(self.committer.mce, self.backfills.start_epoch)

    @property
    def epochs_applied(self) -> int:
        return self.committer.epochs_committed

    @property
    def backfill(self) -> ChunkedBackfill | None:
        """The chunked backfill still running, if any."""
        return self.backfills.running

    def _adopt(self, entry: CatalogEntry, plan: ViewPlan, operator: ViewOperator) -> None:
        """The view's definition after a replacement's cut-over (its task path planned anew: it may differ)."""
        self.entry = self.committer.entry = entry
        self.plan, self.operator = plan, operator
        self.tasks = self._task_path()
        self.reader.task_per_partition = self.tasks is not None

    def _task_path(self) -> TaskEpochs | None:
        """The view's epochs in Spark's tasks for its current definition, if the setting is on and it can."""
        return TaskEpochs.for_view(self.settings, self.entry, self.upstreams, self.plan, self.committer, self._redis)

    # --- the loop ---------------------------------------------------------------------------------

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """foreachBatch: the micro-batch in tasks, or collected for the worker thread (which applies it after
        the previous one, or raises the previous one's error)."""
        if self._in_tasks(None, batch):
            return
        self.runner.submit(batch.toArrow())  # the executors read while the worker applies the previous one

    def _in_tasks(self, upto: int | None, batch: DataFrame | None = None) -> bool:
        """Apply the epochs up to ``upto``, or of the stream's ``batch``, in Spark's tasks (``TaskEpochs``) when
        the setting is on, the view can and no stage has work on them; False: the driver applies them."""
        if self.tasks is None:
            return False
        self.runner.worker.drain()  # a micro-batch the driver path took commits first
        with self._lock:  # the idle upkeep waits (a replacement staged meanwhile follows the next epochs)
            self._upkeep()
            if self._stopped:
                return True  # nothing is applied after stop()
            backfill = self.backfills.in_tasks  # a chunked backfill the tasks run, with its micro-batches
            # Until a micro-batch completed in tasks, any replacement waits beside them (see TaskEpochs.resumed).
            follows = self.replacement.follows_in_tasks or not self.tasks.resumed
            replacement = self.replacement if backfill is None and follows else None
            cutting = replacement is not None and self.replacement.cuts_over_in_tasks(self.tasks.resumed)
            if not self.tasks.takes([s for s in self.stages if s not in (backfill, replacement)], self.mce,
                                    any_size=cutting):  # a cut-over's diff is the view's size, not the epoch's
                return False
            if backfill is not None:
                backfill.run_in_tasks(self.tasks, self.reader, upto)  # finished, the next upkeep drops it
            elif self.backfills.start_epoch > self.mce:
                return False  # a chunked backfill the driver's way left it before its first commit
            elif self.replacement.before_micro_batch(self.tasks, upto, batch, cutting):  # may adopt a new self.tasks
                self.tasks.apply(self.reader, upto, batch)
            return True

    def apply_batch(self, table: pa.Table) -> None:
        """Apply every epoch above the MCE of a collected micro-batch, in order."""
        sources = self.entry.sources
        table = self.reader.with_undelivered(sources[0], self._after, table)
        with self._lock:  # the idle upkeep waits until the micro-batch is applied
            self._upkeep()
            epochs: EpochBatches = {}
            batches_from_arrow(table, self.upstreams[sources[0]], epochs)
            if epochs:  # a join reads its other sides up to the micro-batch's last epoch (its end marker)
                self.apply_epochs(self.reader.epochs(sources[1:], self._after, max(epochs), epochs, settled=True))

    def apply_epochs(self, epochs: EpochBatches) -> None:
        with self._lock:
            for epoch in sorted(epochs):
                if epoch > self._after and not self._stopped:  # else applied before a restart or a backfill
                    self.apply_epoch(epoch, epochs[epoch])

    def apply_epoch(self, epoch: int, changes: Mapping[str, ChangeBatch]) -> None:
        """Run one upstream epoch through the stages, the operator and the commit (``changes``: each
        upstream's; an absent one had none)."""
        work = EpochWork(epoch, dict(changes))
        for stage in self.stages:
            stage.before_epoch(work)
            if work.taken:
                return

        def compute() -> EpochOutput:
            self.reader.require_committed(self.entry.name, self.entry.sources, epoch)
            return self.operator.apply_epoch(work.inputs, self._state)

        output = self.committer.compute(compute, epoch)
        if output is None:
            return  # the rebuilt Redis holds the epoch already
        commit_view_epoch(self.committer, self.store, self.entry, work, output)
        for stage in self.stages:
            stage.after_commit(work)
        self.stages = [stage for stage in self.stages if not stage.finished]

    def _upkeep(self) -> None:
        """The stages' work outside epochs (:meth:`Stage.upkeep`), never during an epoch (the lock)."""
        with self._lock:
            for stage in () if self._stopped else self.stages:
                stage.upkeep()
            self.stages = [stage for stage in self.stages if not stage.finished]

    # --- running ----------------------------------------------------------------------------------

    def catch_up(self, upto: int | None = None) -> int:
        """Apply every committed upstream epoch above the MCE with batch reads; returns the new MCE (the
        streaming query's one-shot form: tests, replay)."""
        self._upkeep()
        end = plan_through(self.store.index, TableWriters(self._redis, self.settings.topic_prefix),
                           list(self.upstreams.values()))
        end = min(end, upto) if upto is not None else end
        if end > self._after and not self._in_tasks(end):
            self.apply_epochs(self.reader.epochs(self.entry.sources, self._after, end, settled=True))
        return self.mce

    def start(self, on_catch_up: Callable[[int, int], None] | None = None) -> StreamingQuery:
        """Apply the backlog (``on_catch_up(epoch read, last epoch of the backlog)`` after each
        micro-batch of it is read), then start the streaming query that follows the upstream(s)
        (:mod:`~mvlog.services.pipeline.streaming`)."""
        self._upkeep()  # a snapshot backfill's first epoch, before anything is read
        self.store.set_lifecycle(self.entry.name, self.backfills.lifecycle())
        sources, after = self.entry.sources, self._after
        ends = trigger_ends(self.settings, [self.upstreams[s] for s in sources], after,
                            self.max_epochs_per_trigger, self.settings.max_records_per_trigger)
        ranges = list(zip([after, *ends], ends, strict=False))
        while ranges and self._in_tasks(ranges[0][1]):
            if on_catch_up is not None:
                on_catch_up(ranges[0][1], ends[-1])
            ranges.pop(0)
        reads = [(end, partial(self.reader.backlog_read, sources, begin, end)) for begin, end in ranges]
        self.runner.run_backlog(reads, None if on_catch_up is None else lambda end: on_catch_up(end, ends[-1]))
        name = f"mvlog_{self.settings.topic_prefix}_{self.entry.name}".replace(".", "_")
        return self.runner.start(self.reader.stream(sources, ends[-1] if ends else after), self.process_batch,
                                 self.trigger_interval, name)

    def failure(self) -> BaseException | None:
        """Why the consumer's reads stopped, None while they run (:meth:`MicroBatchRunner.failure`: the
        query's error, a failed apply's, or the query stopped): what supervisors check."""
        return self.runner.failure()

    def wait_for_epoch(self, epoch: int, timeout: float = 120.0) -> None:
        """Block until the view's MCE reaches ``epoch`` (raises the query's error if it failed)."""
        self.runner.wait_until(lambda: self.mce >= epoch, f"MCE {epoch}", timeout)

    def stop(self) -> None:
        """Once this returns, nothing commits: ``query.stop()`` may return while a ``foreachBatch`` call still
        runs here (SPARK-39218). An epoch being applied commits first; the rest is above the MCE, read again."""
        with self._lock:
            self._stopped = True
        self.runner.stop()
        self.committer.close()
        self.catalog.close()  # a cut-over wrote the catalog topic with its producer
