"""Both backfills as stages of a view's epoch pipeline (:mod:`mvlog.services.pipeline.stage`).

A view created with ``--backfill chunked`` starts at its upstreams' current epoch instead of their log's
start: :class:`ChunkedBackfillStage` turns each upstream epoch into the changes at or below the
positions plus a chunk of the upstream's rows, and its positions commit with the epoch. A view created
with ``--backfill snapshot`` starts at its upstream's snapshot epoch E: :class:`SnapshotSeedStage`
commits the snapshot's view as epoch E before anything is read, then the upstream's epochs after E
follow as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from pyspark.sql import SparkSession

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, CommittedEpoch
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.partition_staging import PartitionStaging
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.services.backfill.chunked import BackfillStep, ChunkedBackfill, backfill_needed
from mvlog.services.backfill.snapshot import (
    LOAD_PRODUCER_QUEUE,
    LoadedEpoch,
    SnapshotBackfill,
    snapshot_backfill_needed,
)
from mvlog.services.backfill.task_chunks import BackfillBatch
from mvlog.services.pipeline.committer import EpochCommitter, ScriptCommit
from mvlog.services.pipeline.reading import UpstreamReader
from mvlog.services.pipeline.stage import EpochWork, Stage
from mvlog.services.pipeline.task_epochs import TaskEpochs
from mvlog.views import ChangeBatch, ViewPlan

log = logging.getLogger(__name__)


class ChunkedBackfillStage:
    """A chunked backfill on the pipeline. It works in the row form (it routes each change by its key's
    position), so the epoch's input is turned into changes and back here, and only while it runs."""

    def __init__(self, backfill: ChunkedBackfill, upstreams: Mapping[str, CatalogEntry], *,
                 in_tasks: bool = False) -> None:
        """``in_tasks``: the view's operator runs in Spark's tasks, and so does the backfill's routing
        (:mod:`~mvlog.services.backfill.task_chunks`), the consumer asking :meth:`ChunkedBackfill.plan_in_tasks`
        for each micro-batch; epochs the consumer applies the driver's way still come here."""
        self.backfill, self._upstreams, self.in_tasks = backfill, upstreams, in_tasks
        self._step: BackfillStep | None = None

    def upkeep(self) -> None:
        pass

    def before_epoch(self, work: EpochWork) -> None:
        step = self._step = self.backfill.prepare(work.epoch, {
            name: batch.to_changes() if (batch := work.inputs.get(name)) else [] for name in self.backfill.sources})
        work.inputs = {name: ChangeBatch.from_changes(self._upstreams[name].schema, found)
                       for name, found in step.changes.items()}
        work.commit_fields.update(step.commit_fields())  # the positions commit with the epoch in Redis...
        work.mutation = step.mutation(self.backfill.view)  # ... and on its barriers, for a rebuild from Kafka

    def after_commit(self, work: EpochWork) -> None:
        assert self._step is not None
        self.backfill.committed(self._step, time.monotonic() - work.started)
        if self.backfill.done:
            log.info("%s: backfill done at epoch %d (%d rows)", self.backfill.view, work.epoch, self.backfill.rows_done)

    @property
    def finished(self) -> bool:
        return self.backfill.done

    @property
    def idle(self) -> bool:
        return self.finished

    def run_in_tasks(self, tasks: TaskEpochs, reader: UpstreamReader, upto: int | None) -> None:
        """The upstream's epochs up to ``upto`` (None: as far as the view may plan now; a stream's micro-batch
        is read again here) in micro-batches of the task path, each ending with its chunk's epoch
        (:mod:`~mvlog.services.backfill.task_chunks`); once the backfill is done, the rest as any."""
        backfill = self.backfill
        end = upto if upto is not None else tasks.plan_through()

        def after() -> int:  # the upstream epoch the view is at: the MCE, or the one the backfill began after
            return max(tasks.committer.mce, backfill.start_epoch)

        while not backfill.done and after() < end:
            if tasks.committer.ensure_serving_state():
                backfill.reload()  # Redis was rebuilt from Kafka: the backfill is where the view's changelog says
            started = time.monotonic()
            planned = backfill.plan_in_tasks(tasks.settings.to_executor_json(), after(), end)
            try:
                tasks.apply(reader, planned.upto, stage=planned, read_after=after())
            except Exception:
                if not self._lost_under(tasks, planned):
                    raise
                log.warning("%s: Redis was wiped under a micro-batch of its backfill: planned again", backfill.view)
                backfill.reload()
                continue
            if tasks.committer.mce < planned.upto:
                return  # not all committed (the upstream's index moved): the next micro-batch plans again
            backfill.committed_in_tasks(planned, time.monotonic() - started)
        if backfill.done and after() < end:
            tasks.apply(reader, end)

    def _lost_under(self, tasks: TaskEpochs, planned: BackfillBatch) -> bool:
        """Whether a micro-batch failed because Redis was wiped under it: its tasks found the saved chunk
        gone, or the commit found the view's state gone."""
        if tasks.committer.ensure_serving_state():
            return True
        chunk = planned.chunk
        return (chunk is not None and tasks.committer.mce < chunk.epoch
                and self.backfill.store.chunk_record(self.backfill.view) is None)


class SnapshotSeedStage:
    """Loads the upstream snapshot's view as the view's first epoch E (in :meth:`upkeep`, which the
    consumer runs before it reads anything), through the committer like any epoch."""

    def __init__(self, settings: Settings, backfill: SnapshotBackfill, committer: EpochCommitter,
                 spark: SparkSession, *, in_tasks: bool = False) -> None:
        """``in_tasks``: the view's operator runs in Spark's tasks, and so does the load
        (:mod:`~mvlog.services.backfill.snapshot_tasks`)."""
        self.settings, self.backfill, self._committer, self._spark = settings, backfill, committer, spark
        self._in_tasks = in_tasks
        self._loaded = False

    def upkeep(self) -> None:
        if self._loaded:
            return
        backfill, view = self.backfill, self.backfill.entry.name
        rows = self._load_in_tasks() if self._in_tasks else self._load()
        backfill.publish(backfill.record.rows, done=True, view_rows=rows)
        log.info("%s: loaded %d rows from %s's snapshot at epoch %d", view, rows, backfill.upstream.name,
                 backfill.epoch)
        self._loaded = True

    def _load_timeouts(self) -> dict[str, Any]:
        """The epoch holds the whole view at E: its transaction(s) get a timeout of their own, and a
        bounded producer queue."""
        timeout = max(self.settings.transaction_timeout_ms, self.settings.snapshot_load_transaction_timeout_ms)
        return {"transaction.timeout.ms": timeout, **LOAD_PRODUCER_QUEUE}

    def _load_in_tasks(self) -> int:
        """The load by a Spark task per view partition, committed in Redis here; the view's rows at E."""
        from mvlog.services.backfill.snapshot_tasks import SeedJob, seed_results
        from mvlog.services.pipeline.task_epochs import commit_partition_results

        backfill = self.backfill
        backfill.clear_interrupted()  # the setting may have been off when a load was interrupted
        job = SeedJob(self.settings.to_executor_json(), backfill.entry, backfill.plan, backfill.epoch,
                      self._load_timeouts())
        with backfill.seed_frame(self._spark) as seed:
            results = seed_results(seed, job)
        staging = PartitionStaging(backfill.store.redis, self.settings.topic_prefix)
        commit_partition_results(self._committer, staging, backfill.entry, backfill.epoch, results)
        backfill.store.set_lifecycle(backfill.entry.name, Lifecycle.LIVE)
        return sum(row["puts"] for row in results)

    def _load(self) -> int:
        """The load by this process (the driver), one Kafka transaction; the view's rows at E."""
        backfill, view = self.backfill, self.backfill.entry.name
        loads: list[LoadedEpoch] = []

        def produce(writer: ChangelogWriter) -> CommittedEpoch:
            loads.append(backfill.load(self._spark, writer))
            return CommittedEpoch(loads[0].epoch, loads[0].index)

        def apply(index: Mapping[int, IndexEntry]) -> bool:
            return backfill.store.commit_load(view, backfill.epoch, index, loads[0].rows, Lifecycle.LIVE.value)

        with self._committer.writer_configured(self._load_timeouts()):  # on a writer of its own
            self._committer.commit(backfill.epoch, produce, ScriptCommit(apply))
        return loads[0].rows

    def before_epoch(self, work: EpochWork) -> None:
        pass

    def after_commit(self, work: EpochWork) -> None:
        pass

    @property
    def finished(self) -> bool:
        return self._loaded

    @property
    def idle(self) -> bool:
        return self.finished


@dataclass(frozen=True)
class ViewBackfills:
    """The backfill a view still needs (at most one kind), as stages of its pipeline, and what its consumer
    and the commands ask of it."""

    chunked_stage: ChunkedBackfillStage | None = None
    seed_stage: SnapshotSeedStage | None = None

    @property
    def stages(self) -> list[Stage]:
        return [stage for stage in (self.chunked_stage, self.seed_stage) if stage is not None]

    @property
    def chunked(self) -> ChunkedBackfill | None:
        """The chunked backfill, running or done (its final progress); None if the view has none."""
        return self.chunked_stage.backfill if self.chunked_stage is not None else None

    @property
    def running(self) -> ChunkedBackfill | None:
        """The chunked backfill still running, if any."""
        return self.chunked if self.chunked_stage is not None and not self.chunked_stage.finished else None

    @property
    def in_tasks(self) -> ChunkedBackfillStage | None:
        """The chunked backfill's stage while it runs, if its routing runs in Spark's tasks."""
        stage = self.chunked_stage
        return stage if stage is not None and stage.in_tasks and not stage.finished else None

    @property
    def snapshot(self) -> SnapshotBackfill | None:
        """The snapshot not loaded yet, if any."""
        return self.seed_stage.backfill if self.seed_stage is not None and not self.seed_stage.finished else None

    @property
    def start_epoch(self) -> int:
        """The upstream epoch the view starts after: a chunked backfill starts at its upstreams' epoch
        when it began, not at the start of their log."""
        return self.chunked.start_epoch if self.chunked is not None else 0

    def lifecycle(self) -> Lifecycle:
        return Lifecycle.BACKFILLING if self.running else Lifecycle.LIVE


def backfill_stages(settings: Settings, client: redis.Redis, store: ViewStore, catalog: CatalogStore,
                    entry: CatalogEntry, upstreams: Mapping[str, CatalogEntry], plan: ViewPlan,
                    committer: EpochCommitter, spark: SparkSession, *, in_tasks: bool = False) -> ViewBackfills:
    """The backfill a view still needs: chunked, from a snapshot, or none (it replays its upstreams'
    changelogs from their start, or has committed epochs already). ``in_tasks``: the view's operator runs
    in Spark's tasks (a snapshot's load then does too, and a chunked backfill's routing)."""
    if backfill_needed(store, entry):
        chunked = ChunkedBackfill(settings, store, catalog, entry, upstreams)
        return ViewBackfills(chunked_stage=ChunkedBackfillStage(chunked, upstreams, in_tasks=in_tasks))
    if snapshot_backfill_needed(store, entry):
        snapshot = SnapshotBackfill(settings, store, SnapshotStore.of(settings, client), entry,
                                    upstreams[entry.sources[0]], plan)
        return ViewBackfills(seed_stage=SnapshotSeedStage(settings, snapshot, committer, spark, in_tasks=in_tasks))
    return ViewBackfills()
