"""Snapshot backfill: a new view starts from its upstream's snapshot instead of chunks or the whole log.

The view at the snapshot's epoch E is computed by Spark SQL over the snapshot's Parquet files
(:func:`~mvlog.views.seed.seed_sql`: the view itself, or for GROUP BY the group totals its operator
state needs) and written back as Parquet by the executors; nothing of it passes through the driver
yet. The driver then streams that result, ``snapshot_load_batch_rows`` rows (for a GROUP BY: groups
plus their min/max multiset entries) at a time, into the view's epoch E: each batch's changes go into
one Kafka transaction (the epoch's, with its barriers at the end) and its rows, operator state and
key-order members into staged Redis keys, which one script swaps in with the MCE once the transaction
committed. The driver thus holds one batch and a bounded producer queue, however large the snapshot
(I4), and the view's history starts at E with exactly ``Q(rows(upstream, E))``. The consumer then
reads the upstream's epochs after E from Kafka (the changelog must still hold them: checked first)
and goes live.

A crash before the Kafka commit redoes the load (the staged keys are cleared first); a crash after it
finds the epoch in Kafka but not in Redis and rolls Redis forward from the view's changelog, as after
any epoch that reached Kafka only.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, EncodedBatch, encode_batch
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.key_order import order_member
from mvlog.services.snapshot_compaction import check_changelog_after, read_snapshot
from mvlog.snapshot_plan import SnapshotError, SnapshotRecord
from mvlog.views import ChangeBatch, ViewPlan
from mvlog.views.seed import SeedDecoder, check_seedable, seed_sql

log = logging.getLogger(__name__)

#: Under ``<snapshot_root>/<prefix>``: the views at their snapshot epoch while they are being loaded.
LOADS_FOLDER = ".loads"

#: librdkafka's send queue while loading: the driver produces faster than a broker takes the records, so
#: the queue is what holds the load's records in memory; a bound this size (and not the writer's
#: default 256 MiB, sized for live epochs) keeps the driver flat (I4): produce waits while it is full.
LOAD_PRODUCER_QUEUE = {"queue.buffering.max.kbytes": 16384, "queue.buffering.max.messages": 50_000}


def snapshot_backfill_needed(store: ViewStore, entry: CatalogEntry) -> bool:
    """A view created with ``--backfill snapshot`` that has committed no epoch yet."""
    return entry.options.get("backfill") == "snapshot" and store.mce(entry.name) is None


@dataclass(frozen=True)
class LoadedEpoch:
    """The view's first epoch, committed to Kafka and staged in Redis (:meth:`ViewStore.commit_load`)."""

    epoch: int
    index: dict[int, IndexEntry]
    rows: int  # the view's rows at the epoch


class SnapshotBackfill:
    """Loads the upstream snapshot a new view starts from."""

    def __init__(self, settings: Settings, store: ViewStore, snapshots: SnapshotStore, entry: CatalogEntry,
                 upstream: CatalogEntry, plan: ViewPlan) -> None:
        if len(entry.sources) != 1:
            raise SnapshotError(f"{entry.name}: snapshot backfill reads one upstream, not {len(entry.sources)}")
        check_seedable(plan)
        self.settings, self.store, self.entry, self.upstream, self.plan = settings, store, entry, upstream, plan
        record = snapshots.latest(upstream.name)
        if record is None:
            raise SnapshotError(f"{entry.name}: its upstream {upstream.name} has no snapshot "
                                f"(mvlog snapshot {upstream.name})")
        self.record: SnapshotRecord = record
        self._started_ms = int(time.time() * 1000)
        self.rows_done = 0

    @property
    def epoch(self) -> int:
        return self.record.epoch

    @property
    def loads(self) -> Path:
        return self.settings.snapshot_root / self.settings.topic_prefix / LOADS_FOLDER

    @contextmanager
    def seed_frame(self, spark: SparkSession) -> Iterator[DataFrame]:
        """The view's seed at E (:func:`~mvlog.views.seed.seed_sql`) over the snapshot, as a Spark query,
        after checking the upstream's log still goes on from E; usable inside the block."""
        check_changelog_after(self.settings, self.store, self.upstream, self.record.epoch)
        self.store.set_lifecycle(self.entry.name, Lifecycle.BACKFILLING)
        self.publish(0)
        table = f"mvlog_seed_{uuid.uuid4().hex}"
        columns = [f"`{c}`" for c in self.upstream.schema.names]
        read_snapshot(spark, self.upstream, self.record.path).select(*columns).createOrReplaceTempView(table)
        try:
            yield spark.sql(seed_sql(self.plan, table))
        finally:
            spark.catalog.dropTempView(table)

    def clear_interrupted(self) -> None:
        """What a load on the driver's way left when it was interrupted before its commit: its computed
        folder and the rows it staged in Redis (a load in tasks restarts from the partitions' staging)."""
        for stale in self.loads.glob(f"{self.entry.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self.store.clear_load(self.entry.name)

    def compute(self, spark: SparkSession) -> Path:
        """The view's seed at E written as Parquet by the executors; returns the folder."""
        self.clear_interrupted()
        folder = self.loads / f"{self.entry.name}-{uuid.uuid4().hex[:12]}"
        with self.seed_frame(spark) as seed:
            seed.write.parquet(str(folder))
        return folder

    def batches(self, folder: Path, decoder: SeedDecoder) -> Iterator[pa.RecordBatch]:
        """The computed view, file after file, in batches of at most ``snapshot_load_batch_rows`` rows
        plus min/max multiset entries."""
        budget = self.settings.snapshot_load_batch_rows
        for file in sorted(folder.rglob("*.parquet")):
            for batch in pq.ParquetFile(file).iter_batches(batch_size=budget):
                yield from decoder.split(batch, budget)

    def load(self, spark: SparkSession, writer: ChangelogWriter) -> LoadedEpoch:
        """Compute the view at E and write it as the view's epoch E: Kafka committed, Redis staged."""
        view, key_columns = self.entry.name, self.entry.key_columns
        folder = self.compute(spark)
        try:
            total = sum(pq.ParquetFile(f).metadata.num_rows for f in folder.rglob("*.parquet"))
            decoder = SeedDecoder(self.plan)
            staged = 0

            def changes() -> Iterator[EncodedBatch]:
                nonlocal staged
                for batch in self.batches(folder, decoder):
                    part = decoder.decode(batch)
                    schema = self.plan.schema
                    reads = ChangeBatch.from_changes(schema, [Change(Op.READ, schema.key_of(row), None, row)
                                                              for row in part.rows])
                    encoded = encode_batch(key_columns, reads)
                    members = [order_member(vnode, key, key_bytes)
                               for vnode, key, key_bytes in zip(encoded.vnodes, reads.keys, encoded.keys, strict=True)]
                    self.store.stage_load(view, encoded.row_puts, part.state, members)
                    staged += len(encoded.row_puts)
                    self.publish(self.record.rows * staged // total if total else 0)
                    yield encoded

            committed = writer.commit_batches(self.record.epoch, 0, changes())
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        log.info("%s: %d rows at epoch %d from %s's snapshot (%d rows)", view, staged, self.record.epoch,
                 self.upstream.name, self.record.rows)
        return LoadedEpoch(self.record.epoch, committed.index, staged)

    def publish(self, rows_done: int, done: bool = False, view_rows: int | None = None) -> None:
        """``backfill_progress`` as the chunked backfill publishes it (status, dashboard, progress bars):
        rows of the snapshot done, in proportion of the computed view written (``view_rows``: the
        view's rows at E, once written)."""
        now = int(time.time() * 1000)
        self.rows_done = rows_done
        seconds = max(0.001, (now - self._started_ms) / 1000)
        rate = rows_done / seconds
        eta = 0 if done else (round((self.record.rows - rows_done) / rate) if rows_done else "")
        self.store.set_backfill_progress(self.entry.name, {
            "state": (Lifecycle.LIVE if done else Lifecycle.BACKFILLING).value, "method": "snapshot",
            "rows_done": rows_done, "rows_total": self.record.rows, "vnodes_done": 256 if done else 0,
            "vnodes_total": 256, "rate_rows_s": round(rate, 1) if rows_done else "", "eta_s": eta,
            "batch_size": self.settings.snapshot_load_batch_rows, "rate_limit": "",
            "snapshot_epoch": self.record.epoch, "mce": self.record.epoch if done else "",
            "started_ms": self._started_ms, "updated_ms": now,
            **({"view_rows": view_rows} if view_rows is not None else {})})
