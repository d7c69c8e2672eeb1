"""The Spark consumer that maintains one view, exactly once per epoch.

A Structured Streaming query reads the upstream changelog with ``format("mvlog")`` (executors read
Kafka; a micro-batch holds whole epochs). For every epoch above the view's MCE, in order, the driver
feeds the epoch's changes to the view's incremental operator, writes the resulting changes and the
epoch's barriers to the view's changelog in one Kafka transaction, then commits rows, operator state,
epoch index and MCE to Redis in one script. Redis is the commit point: an epoch that reached Kafka but
not Redis is redone under a new transaction, and readers drop the abandoned attempt (chain rule).
``foreachBatch`` only collects a micro-batch: a worker thread applies it while Spark reads the next
(:mod:`mvlog.services.micro_batch_worker`). The backlog a consumer finds when it starts is read the same
way, micro-batch by micro-batch, with batch reads; the streaming query starts after it.

A view created with ``backfill=chunked`` starts at its upstreams' current epoch instead of their log's
start: a :class:`~mvlog.services.backfill.ChunkedBackfill` turns each upstream epoch into the changes
at or below its positions plus a chunk of the upstream's rows, and its positions commit with the epoch.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from mvlog.catalog import CatalogEntry, CatalogError, ViewDroppedError
from mvlog.changes import Change, Mutation, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, encode_batch
from mvlog.connectors.kafka.retention import has_records
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import Lifecycle, ServingStateLostError, ViewStore, commit_from_encoded
from mvlog.connectors.spark.change_rows import epoch_slices
from mvlog.connectors.spark.spark_source import trigger_ends
from mvlog.key_order import order_member
from mvlog.replacement import APPLY_MUTATION, ReplacementError, Status, applied_entry, diff_rows
from mvlog.schemas.codec import decode_row
from mvlog.services.backfill import ChunkedBackfill, backfill_needed
from mvlog.services.micro_batch_worker import MicroBatchWorker
from mvlog.services.replacement_follower import ReplacementFollower
from mvlog.services.replacement_hydration import first_inputs, hydration_start
from mvlog.services.replacements import complete_apply, plan_replacement
from mvlog.services.snapshot_backfill import LOAD_PRODUCER_QUEUE, SnapshotBackfill, snapshot_backfill_needed
from mvlog.services.spark_session import spark_session
from mvlog.services.view_ddl import plan_for
from mvlog.views import ChangeBatch, EpochOutput, ViewDefinitionError, ViewOperator

log = logging.getLogger(__name__)

EpochBatches = dict[int, dict[str, ChangeBatch]]  # epoch -> upstream view -> its changes


class _ViewState:
    """The operator's state as stored in Redis (the ``StateReader`` protocol)."""

    def __init__(self, store: ViewStore, view: str) -> None:
        self._store, self._view = store, view

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return self._store.get_state(self._view, keys)


def batches_from_arrow(table: pa.Table, upstream: CatalogEntry, into: EpochBatches) -> None:
    """Each epoch's changes in the data source's signed rows, as one batch per epoch (barrier-only epochs
    too: their barriers still have to be committed). The rows of a change share its partition and
    offset; they are paired in Arrow, so a row never becomes a Python object here."""
    for epoch, rows in epoch_slices(table):
        change_ids = pc.add(pc.multiply(rows.column("_partition").cast(pa.int64()), 1 << 40), rows.column("_offset"))
        into.setdefault(epoch, {})[upstream.name] = ChangeBatch.from_signed(upstream.schema, rows,
                                                                             rows.column("_weight"), change_ids)


class UpstreamEpochLostError(RuntimeError):
    """An upstream epoch this consumer was about to compute is no longer committed upstream."""


class ViewConsumer:
    """Maintains view ``view`` from its upstream changelog(s)."""

    def __init__(self, settings: Settings, view: str, *, spark: SparkSession | None = None,
                 client: redis.Redis | None = None, max_epochs_per_trigger: int | None = None,
                 trigger_interval: str = "200 milliseconds") -> None:
        self.settings = settings
        self._redis = client or redis_client.connect(settings)
        self.catalog = CatalogStore(settings, self._redis)
        self.entry = self.catalog.get(view)
        if self.entry.kind != "view" or self.entry.sql is None:
            raise ValueError(f"{view} is a {self.entry.kind}; only views are maintained by a consumer")
        self.replacements = ReplacementStore(self._redis, settings.topic_prefix)
        self.entry = complete_apply(self.catalog, self.replacements, view)  # finish an interrupted apply
        assert self.entry.sql is not None
        self.replacement: ReplacementFollower | None = None  # a staged replacement, hydrated read-only
        # Epochs and replacement upkeep never interleave: micro-batches and the idle watcher take turns
        # (re-entrant: a micro-batch holds it across its sync, its choice of path and apply_epochs).
        self._replacement_lock = threading.RLock()
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()
        self.upstreams = {name: self.catalog.get(name) for name in self.entry.sources}
        self.plan = plan_for(self.catalog, view, self.entry.sql)
        self.operator = ViewOperator(self.plan)
        self.store = ViewStore(self._redis, settings.topic_prefix)
        self.spark = spark or spark_session(settings, app_name=f"mvlog-{view}")
        self.max_epochs_per_trigger = max_epochs_per_trigger or settings.max_epochs_per_trigger
        self.trigger_interval = trigger_interval
        # A new transactional producer fences any earlier consumer of this view.
        self.writer = ChangelogWriter(settings, view, self.entry.key_columns, self.entry.partitions)
        self._last_committed: dict[int, IndexEntry] | None = None
        topic = settings.changelog_topic(view)
        if (self.store.mce(view) is None or self.catalog.wiped()) and has_records(settings, topic,
                                                                                   self.entry.partitions):
            from mvlog.services.control_plane import recover_after_wipe

            # Redis was wiped (and maybe is being rebuilt by another process): rebuild from Kafka, or wait.
            recover_after_wipe(settings, self._redis, self.entry, None)
        self.mce = self.store.mce(view) or 0
        # Proof that the MCE committed, should Redis be wiped before this consumer commits an epoch.
        self._last_committed = self.store.index.entries_at(view, self.entry.partitions, self.mce or None)
        # A view created with --backfill chunked starts at its upstreams' current epoch and reads their
        # rows from Redis in chunks; otherwise it replays the upstream changelog from its start.
        self.backfill: ChunkedBackfill | None = None
        if backfill_needed(self.store, self.entry):
            self.backfill = ChunkedBackfill(settings, self.store, self.catalog, self.entry, self.upstreams)
        # A view created with --backfill snapshot starts at its upstream's snapshot epoch E: the snapshot's
        # rows are its epoch E (loaded by start() or catch_up()), then the upstream's epochs after E follow.
        self.snapshot_backfill: SnapshotBackfill | None = None
        if self.backfill is None and snapshot_backfill_needed(self.store, self.entry):
            self.snapshot_backfill = SnapshotBackfill(settings, self.store,
                                                      SnapshotStore.of(settings, self._redis),
                                                      self.entry, self.upstreams[self.entry.sources[0]], self.plan)
        self._after = max(self.mce, self.backfill.start_epoch if self.backfill is not None else 0)
        self._state = _ViewState(self.store, view)
        self._query: StreamingQuery | None = None
        self._worker = MicroBatchWorker(view)
        self._checkpoint_dir: str | None = None
        self.epochs_applied = 0
        self.backfill_done: ChunkedBackfill | None = None  # the completed backfill (its final progress)

    # --- reading ----------------------------------------------------------------------------------

    def _source_options(self, view: str) -> dict[str, str]:
        return {"view": view, "bootstrapServers": self.settings.bootstrap_servers,
                "redisUrl": self.settings.redis_url, "topicPrefix": self.settings.topic_prefix}

    def stream(self, after: int) -> DataFrame:
        """The streaming read of the upstream(s), from the epoch after ``after``."""
        reader = self.spark.readStream.format("mvlog").options(**self._source_options(self.entry.sources[0]))
        reader = reader.option("startingEpoch", str(after))
        reader = reader.option("maxEpochsPerTrigger", str(self.max_epochs_per_trigger))
        reader = reader.option("maxRecordsPerTrigger", str(self.settings.max_records_per_trigger))
        if len(self.entry.sources) > 1:
            reader = reader.option("alignWith", ",".join(self.entry.sources[1:]))
        return reader.load()

    def _read_range(self, view: str, after: int, upto: int) -> pa.Table:
        reader = self.spark.read.format("mvlog").options(**self._source_options(view))
        return reader.option("startingEpoch", str(after)).option("endingEpoch", str(upto)).load().toArrow()

    # --- processing -------------------------------------------------------------------------------

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """foreachBatch: collect the micro-batch and hand it to the worker thread, which applies it once
        the previous one is applied (raises the previous one's error instead)."""
        table = batch.toArrow()  # the Spark job: the executors read while the worker applies the previous one
        self._worker.submit(partial(self.apply_batch, table))

    def apply_batch(self, table: pa.Table) -> None:
        """Apply every epoch above the MCE of a collected micro-batch, in order."""
        source = self.entry.sources[0]
        first = pc.min(table.column("_epoch")).as_py() if len(table) else None
        if first is not None and self.store.index.between(source, 0, self._after, first - 1):
            # Epochs the stream never delivered (planned while Redis was wiped): read them now.
            table = pa.concat_tables([self._read_range(source, self._after, first - 1), table],
                                     promote_options="default")
        with self._replacement_lock:  # the watcher must not stage a follower between the check and the apply
            self._sync_replacement()
            epochs: EpochBatches = {}
            batches_from_arrow(table, self.upstreams[source], epochs)
            if not epochs:
                return
            end = max(epochs)
            for other in self.entry.sources[1:]:  # a join reads its other side up to the same epoch
                batches_from_arrow(self._read_range(other, self._after, end), self.upstreams[other], epochs)
            self.apply_epochs(epochs)

    def apply_epochs(self, epochs: EpochBatches) -> None:
        with self._replacement_lock:
            self._sync_replacement()
            for epoch in sorted(epochs):
                if epoch <= self._after:
                    continue  # applied before a restart (never twice), or before the backfill started
                self.apply_epoch(epoch, epochs[epoch])

    def apply_epoch(self, epoch: int, changes: Mapping[str, ChangeBatch]) -> None:
        """Compute and commit one upstream epoch (``changes``: each upstream's; an absent one had none)."""
        started = time.monotonic()
        inputs = dict(changes)
        if self.replacement is not None and self._follow_replacement(epoch, inputs):
            return  # the replacement took over at this epoch
        step = None
        if self.backfill is not None:  # the backfill filters and extends the changes row by row
            step = self.backfill.prepare(epoch, {name: batch.to_changes() if (batch := inputs.get(name)) else []
                                                 for name in self.entry.sources})
            inputs = {name: ChangeBatch.from_changes(self.upstreams[name].schema, found)
                      for name, found in step.changes.items()}
        output = self._compute(epoch, lambda: self.operator.apply_epoch(inputs, self._state))
        if output is None:
            return
        if step is None:
            self._commit(epoch, output)
        else:
            self._commit(epoch, output, step.commit_fields(), step.mutation(self.entry.name))
        if self.backfill is not None and step is not None:
            self.backfill.committed(step, time.monotonic() - started)
            if self.backfill.done:
                log.info("%s: backfill done at epoch %d (%d rows)", self.entry.name, epoch, self.backfill.rows_done)
                self.backfill_done = self.backfill
                self.backfill = None

    def _compute(self, epoch: int, compute: Callable[[], EpochOutput]) -> EpochOutput | None:
        """The operator's output for ``epoch``, from the operator state of the MCE: a wiped Redis is
        rebuilt from Kafka first (and the epoch recomputed if it was wiped while the operator ran);
        None when the rebuilt state already holds the epoch."""
        self._ensure_serving_state()
        self._check_upstream_has(epoch)
        output = compute()
        while self._ensure_serving_state():
            if epoch <= self.mce:
                return None
            self._check_upstream_has(epoch)
            output = compute()
        return output

    def _check_upstream_has(self, epoch: int) -> None:
        """Refuse an upstream epoch that its upstream's epoch index no longer has.

        A micro-batch planned before Redis was wiped may hold the upstream's last epoch, which the rebuild
        abandons when nothing proves it committed (its writer died before saying so): computing it would
        leave this view holding an epoch its upstream dropped. Raising restarts the consumer, which plans
        again from the rebuilt index."""
        if not any(self.store.index.between(source, 0, epoch - 1, epoch) for source in self.entry.sources):
            raise UpstreamEpochLostError(f"{self.entry.name}: epoch {epoch} is no longer in the epoch index of "
                                         f"{', '.join(self.entry.sources)} (abandoned after Redis was wiped); "
                                         "restart to plan again from the index")

    def _commit(self, epoch: int, output: EpochOutput, extra: Mapping[str, Any] | None = None,
                mutation: Mutation | None = None) -> None:
        """The epoch's changes and barriers (with ``mutation``: the backfill's progress) to Kafka in one
        transaction, then rows, state, MCE (and the backfill's positions, ``extra``) to Redis in one script.
        Keys and rows are encoded once, column-wise, for both."""
        encoded = encode_batch(self.entry.key_columns, output.changes)
        committed = self.writer.commit_batches(epoch, self.mce, [encoded], mutation=mutation)
        puts = {k: v for k, v in output.state_writes.items() if v is not None}
        deletes = [k for k, v in output.state_writes.items() if v is None]
        commit = commit_from_encoded(epoch, output.changes.keys, encoded, committed.index, state_puts=puts,
                                     state_deletes=deletes, follows=self.mce, **(extra or {}))
        self._commit_redis(epoch, committed.index, partial(self.store.commit, self.entry.name, commit))

    def _commit_redis(self, epoch: int, index: dict[int, IndexEntry], commit: Callable[[], bool]) -> None:
        """Commit an epoch that is in Kafka (``index``: its barriers) to Redis with ``commit``; when Redis
        was wiped meanwhile, roll it forward from Kafka instead."""
        self._last_committed = index
        try:
            applied = commit() or self.store.holds(self.entry.name, epoch)  # a retry of an applied commit
            lost = self.catalog.wiped()  # committed, or refused, into a Redis that another process rebuilds
        except ServingStateLostError:
            applied, lost = False, True
        if lost:
            self._recover()  # waits for the rebuild, rolls Redis forward over this epoch too, derives the state
            applied = self.mce == epoch
        if not applied:
            raise RuntimeError(f"{self.entry.name}: epoch {epoch} is at or below the MCE in Redis; "
                               "another consumer of this view is running")
        self.mce = self._after = epoch
        self.epochs_applied += 1

    def _ensure_serving_state(self) -> bool:
        """True when Redis had lost this view's state (wiped) and it was rebuilt from Kafka.

        The control-plane marker must be there too: while another process rebuilds Redis, this view's
        MCE may already be back with its operator state not re-derived yet; the consumer waits for the
        rebuild (its lock) instead of computing an epoch from that state."""
        if self.store.mce(self.entry.name) == (self.mce or None) and not self.catalog.wiped():
            return False
        if self.catalog.find(self.entry.name) is None and not self.catalog.wiped():
            raise ViewDroppedError(f"{self.entry.name}: the view was dropped while this consumer maintained it")
        self._recover()
        return True

    def _recover(self) -> None:
        from mvlog.services.control_plane import recover_after_wipe

        log.warning("%s: Redis no longer holds its MCE %d: rebuilding from Kafka", self.entry.name, self.mce)
        mce = recover_after_wipe(self.settings, self._redis, self.entry, self._last_committed) or 0
        if mce < self.mce:
            raise RuntimeError(f"{self.entry.name}: Redis could only be rebuilt up to epoch {mce}, "
                               f"below this consumer's {self.mce}")
        self.mce = mce
        self._after = max(self._after, mce)
        self.store.set_lifecycle(self.entry.name, Lifecycle.BACKFILLING if self.backfill else Lifecycle.LIVE)

    def catch_up(self, upto: int | None = None) -> int:
        """Apply every committed upstream epoch above the MCE with batch reads; returns the new MCE.

        The streaming query does the same continuously; this is the one-shot form (tests, replay).
        """
        self.load_snapshot()
        committed = self.store.mce_many(list(self.entry.sources))
        end = min(m or 0 for m in committed.values())
        if upto is not None:
            end = min(end, upto)
        if end <= self._after:
            return self.mce
        epochs: EpochBatches = {}
        for source in self.entry.sources:
            batches_from_arrow(self._read_range(source, self._after, end), self.upstreams[source], epochs)
        self.apply_epochs(epochs)
        return self.mce

    def load_snapshot(self) -> None:
        """Commit the upstream snapshot's rows as the view's first epoch (a view created with
        ``--backfill snapshot`` that has none yet); the upstream's later epochs then follow."""
        backfill = self.snapshot_backfill
        if backfill is None:
            return
        # The epoch holds the whole view at E: its transaction gets a timeout of its own, on a writer of
        # its own (same transactional id: it fences the consumer's writer, which is made again after).
        self.writer.close()
        timeout = max(self.settings.transaction_timeout_ms, self.settings.snapshot_load_transaction_timeout_ms)
        writer = ChangelogWriter(self.settings, self.entry.name, self.entry.key_columns, self.entry.partitions,
                                 producer_config={"transaction.timeout.ms": timeout, **LOAD_PRODUCER_QUEUE})
        try:
            loaded = backfill.load(self.spark, writer)
        finally:
            writer.close()
            self.writer = ChangelogWriter(self.settings, self.entry.name, self.entry.key_columns,
                                          self.entry.partitions)
        self._commit_redis(loaded.epoch, loaded.index, partial(
            self.store.commit_load, self.entry.name, loaded.epoch, loaded.index, loaded.rows, Lifecycle.LIVE.value))
        backfill.publish(backfill.record.rows, done=True, view_rows=loaded.rows)
        log.info("%s: loaded %d rows from %s's snapshot at epoch %d", self.entry.name, loaded.rows,
                 self.entry.sources[0], loaded.epoch)
        self.snapshot_backfill = None

    # --- replacement ------------------------------------------------------------------------------

    def _sync_replacement(self) -> None:
        """Pick up a staged, discarded or apply-requested replacement (once per micro-batch) and bring
        it to the view's MCE: hydrated from scratch, or caught up after a restart."""
        record = self.replacements.record(self.entry.name)
        if record is None or record.status is not Status.STAGED or "error" in (record.fields or {}):
            self.replacement = None
            return
        follower = self.replacement
        if follower is None or follower.id != record.id:
            try:
                plan = plan_replacement(self.catalog, self.entry, record.sql)
            except (CatalogError, ViewDefinitionError) as error:
                self._replacement_failed(record.id, error)
                return
            follower = self.replacement = ReplacementFollower(record, plan, self.replacements)
        follower.apply_requested = record.apply_requested
        if follower.mce is None:
            # Each upstream from its snapshot or its whole changelog: a trimmed changelog alone would give
            # the replacement wrong rows, and its apply a wrong diff.
            try:
                start = hydration_start(self.settings, self.store, SnapshotStore.of(self.settings, self._redis),
                                        self.upstreams, self.mce)
            except ReplacementError as error:
                self._replacement_failed(record.id, error)
                return
            follower.start(start.epoch, first_inputs(start, self.spark, self.upstreams, self._upstream_changes),
                           start.describe())
            if follower.stale:
                self.replacement = None
                return
        if follower.mce is None or follower.mce < self.mce:
            follower.hydrate(self.mce, self._upstream_history)

    def _watch_replacement(self, interval: float = 1.0) -> None:
        """Hydrate a newly staged replacement while the upstream is idle (no micro-batch comes then)."""
        while not self._stopping.wait(interval):
            try:
                with self._replacement_lock:
                    self._sync_replacement()
            except Exception as error:  # the next micro-batch retries, and reports a persistent failure
                log.warning("%s: replacement upkeep failed: %s", self.entry.name, error)

    def _upstream_history(self, after: int, upto: int) -> dict[str, list[Change]]:
        """Each upstream's changes of its epochs in (after, upto], read from its changelog."""
        return {source: self._upstream_changes(source, after, upto) for source in self.entry.sources}

    def _upstream_changes(self, source: str, after: int, upto: int) -> list[Change]:
        """One upstream's changes of its epochs in (after, upto], in epoch order (the row form: a
        replacement's hydration nets them in one operator step)."""
        epochs: EpochBatches = {}
        batches_from_arrow(self._read_range(source, after, upto), self.upstreams[source], epochs)
        return [change for epoch in sorted(epochs) for change in epochs[epoch][source].to_changes()]

    def _replacement_failed(self, replacement_id: str, error: BaseException) -> None:
        """A replacement that cannot be maintained stops; the view itself carries on unchanged."""
        log.warning("%s: replacement %s stopped: %s", self.entry.name, replacement_id, error)
        self.replacements.fail(self.entry.name, replacement_id, f"{type(error).__name__}: {error}")
        self.replacement = None

    def _follow_replacement(self, epoch: int, inputs: Mapping[str, ChangeBatch]) -> bool:
        """Feed the epoch to the replacement; cut over to it at this epoch when an apply is pending."""
        follower = self.replacement
        assert follower is not None
        try:
            follower.follow(epoch, inputs)
        except Exception as error:  # a broken replacement must not stop the view
            self._replacement_failed(follower.id, error)
            return False
        if follower.stale:
            self.replacement = None
            return False
        if not follower.apply_requested or follower.mce is None or follower.mce < epoch:
            return False
        return self._cut_over(epoch, follower)

    def _cut_over(self, epoch: int, follower: ReplacementFollower) -> bool:
        """Epoch ``epoch``'s changes are diff(view rows at the MCE, replacement rows at ``epoch``), with an
        apply_replacement mutation on its barriers; then one Redis script moves the replacement's rows
        and state into the view's and commits the epoch. False (nothing applied) when the apply was
        withdrawn or discarded meanwhile: the epoch is then redone under the old definition, and readers
        drop the Kafka attempt by the chain rule, as for any epoch that reached Kafka but not Redis."""
        view = self.entry.name
        entry = self.catalog.get(view)  # staging bumped its version
        version = entry.version + 1
        _, old_raw, _, new_raw = self.replacements.read_both(view)
        old = {self.entry.schema.key_of(row): row for row in map(decode_row, old_raw.values())}
        new = {follower.plan.schema.key_of(row): row for row in map(decode_row, new_raw.values())}
        changes = ChangeBatch.from_changes(follower.plan.schema, diff_rows(old, new, follower.plan.schema))
        mutation = Mutation(APPLY_MUTATION, view, {"replacement_id": follower.id, "sql": follower.sql,
                                                   "previous_sql": self.entry.sql, "version": version})
        encoded = encode_batch(self.entry.key_columns, changes)
        committed = self.writer.commit_batches(epoch, self.mce, [encoded], mutation=mutation)
        # The key-order index (backfills of views built on this one read it) follows the diff.
        members: dict[str, list[bytes]] = {}
        for op, key, vnode, key_bytes in zip(encoded.ops, changes.keys, encoded.vnodes, encoded.keys, strict=True):
            members.setdefault(op, []).append(order_member(vnode, key, key_bytes))
        added, removed = members.get(Op.CREATE.value, []), members.get(Op.DELETE.value, [])
        if not self.replacements.apply(view, follower.id, epoch, committed.index, version, added, removed):
            follower.apply_requested = False
            log.info("%s: replacement %s not applied at epoch %d (withdrawn or discarded)", view, follower.id, epoch)
            return False
        self._last_committed = committed.index
        self.entry = applied_entry(entry, follower.sql, follower.plan.schema, follower.plan.sources, version)
        self.catalog.put(self.entry)
        self.plan, self.operator, self.replacement = follower.plan, follower.operator, None
        self.mce = self._after = epoch
        self.epochs_applied += 1
        log.info("%s: replacement %s applied at epoch %d (%d change(s)), version %d", view, follower.id, epoch,
                 len(changes), version)
        return True

    # --- running ----------------------------------------------------------------------------------

    def start(self, on_catch_up: Callable[[int, int], None] | None = None) -> StreamingQuery:
        """Apply the backlog (``on_catch_up(epoch read, last epoch of the backlog)`` after each
        micro-batch of it is read), then start the streaming query that follows the upstream(s)."""
        self.load_snapshot()
        self.store.set_lifecycle(self.entry.name, Lifecycle.BACKFILLING if self.backfill else Lifecycle.LIVE)
        self._checkpoint_dir = tempfile.mkdtemp(prefix=f"mvlog-{self.entry.name}-")
        self._worker = MicroBatchWorker(self.entry.name)  # stop() closed the previous one, if any
        after = self._catch_up_in_batches(on_catch_up)
        self._query = (self.stream(after).writeStream.foreachBatch(self.process_batch)
                       .option("checkpointLocation", self._checkpoint_dir)
                       .trigger(processingTime=self.trigger_interval)
                       .queryName(f"mvlog_{self.settings.topic_prefix}_{self.entry.name}".replace(".", "_"))
                       .start())
        self._watcher = threading.Thread(target=self._watch_replacement, name=f"replacement-{self.entry.name}",
                                         daemon=True)
        self._watcher.start()
        return self._query

    def _catch_up_in_batches(self, on_progress: Callable[[int, int], None] | None) -> int:
        """Read what the upstream committed before the start with batch jobs, micro-batch by micro-batch
        (the trigger's limits), each applied by the worker thread while the next is read; returns the last
        epoch read, after which the stream starts.

        A streaming query takes about a second to start (its checkpoint, the source's planning process):
        a consumer that starts behind, after a restart or a stop, would wait that long before its first
        epoch, and read its backlog through the stream's per-batch checkpointing. The micro-batches are
        the stream's, applied the same way, so the view commits the same epochs either way."""
        after = self._after
        ends = trigger_ends(self.settings, [self.upstreams[s] for s in self.entry.sources], after,
                            self.max_epochs_per_trigger, self.settings.max_records_per_trigger)
        for end in ends:
            table = self._read_range(self.entry.sources[0], after, end)
            self._worker.submit(partial(self.apply_batch, table))
            if on_progress is not None:
                on_progress(end, ends[-1])
            after = end
        return after

    def failure(self) -> BaseException | None:
        """The error of a micro-batch whose apply failed: the streaming query fails with it only when the
        next micro-batch comes, so supervisors check this too."""
        return self._worker.failure()

    def wait_for_epoch(self, epoch: int, timeout: float = 120.0) -> None:
        """Block until the view's MCE reaches ``epoch`` (raises the query's error if it failed)."""
        deadline = time.monotonic() + timeout
        while self.mce < epoch:
            if self._query is not None and self._query.exception() is not None:
                raise RuntimeError(f"{self.entry.name}: {self._query.exception()}")
            self._worker.check()  # a failed apply fails the query only when the next micro-batch comes
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.entry.name}: MCE {self.mce} did not reach {epoch} in {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=30)
            self._watcher = None
        if self._query is not None:
            self._query.stop()
            self._query = None
        try:
            self._worker.drain()  # the last micro-batch commits (or fails) before the writer closes
        except Exception as error:
            log.warning("%s: the last micro-batch failed: %s", self.entry.name, error)
        self._worker.close()
        if self._checkpoint_dir is not None:
            shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
        self.writer.close()
        self.catalog.close()  # a cut-over wrote the catalog topic with its producer

