"""Snapshot backfill: a new view starts from its upstream's snapshot instead of chunks or the whole log.

The upstream's latest snapshot at epoch E is read with Spark (Parquet, one folder per vnode) and fed to
the view's incremental operator as one epoch of inserts: its output is the view at E, committed as the
view's epoch E (changelog and barriers in one transaction, rows, operator state and MCE in Redis), so
the view's history starts at E with exactly ``Q(rows(upstream, E))``. The consumer then reads the
upstream's epochs after E from Kafka (the changelog must still hold them: checked first) and goes live.

One epoch holds the whole snapshot: the driver holds the snapshot's rows while it computes that epoch
(the Spark reading is distributed, the operator is not). A crash before the commit redoes the load; a
crash after it finds the view's MCE and carries on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import SparkSession

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.snapshot_store import SnapshotStore
from mvlog.connectors.view_store import Lifecycle, ViewStore
from mvlog.services.snapshot_compaction import check_changelog_after, read_snapshot
from mvlog.snapshot_plan import SnapshotError, SnapshotRecord

log = logging.getLogger(__name__)


def snapshot_backfill_needed(store: ViewStore, entry: CatalogEntry) -> bool:
    """A view created with ``--backfill snapshot`` that has committed no epoch yet."""
    return entry.options.get("backfill") == "snapshot" and store.mce(entry.name) is None


class SnapshotBackfill:
    """Loads the upstream snapshot a new view starts from."""

    def __init__(self, settings: Settings, store: ViewStore, snapshots: SnapshotStore, entry: CatalogEntry,
                 upstream: CatalogEntry) -> None:
        if len(entry.sources) != 1:
            raise SnapshotError(f"{entry.name}: snapshot backfill reads one upstream, not {len(entry.sources)}")
        self.settings, self.store, self.entry, self.upstream = settings, store, entry, upstream
        record = snapshots.latest(upstream.name)
        if record is None:
            raise SnapshotError(f"{entry.name}: its upstream {upstream.name} has no snapshot "
                                f"(mvlog snapshot {upstream.name})")
        self.record: SnapshotRecord = record
        self._started_ms = int(time.time() * 1000)

    @property
    def epoch(self) -> int:
        return self.record.epoch

    def read(self, spark: SparkSession) -> pa.Table:
        """The snapshot's rows (the upstream's columns), after checking the log still goes on from E."""
        check_changelog_after(self.settings, self.store, self.upstream, self.record.epoch)
        self.store.set_lifecycle(self.entry.name, Lifecycle.BACKFILLING)
        self.publish(0)
        columns = [f"`{c}`" for c in self.upstream.schema.names]
        table = read_snapshot(spark, self.upstream, self.record.path).select(*columns).toArrow()
        log.info("%s: read %d rows of %s's snapshot at epoch %d", self.entry.name, len(table),
                 self.upstream.name, self.record.epoch)
        return table

    def publish(self, rows_done: int, done: bool = False) -> None:
        """``backfill_progress`` as the chunked backfill publishes it (status, dashboard, progress bars)."""
        now = int(time.time() * 1000)
        self.store.set_backfill_progress(self.entry.name, {
            "state": (Lifecycle.LIVE if done else Lifecycle.BACKFILLING).value, "method": "snapshot",
            "rows_done": rows_done, "rows_total": self.record.rows, "vnodes_done": 256 if done else 0,
            "vnodes_total": 256, "rate_rows_s": "", "eta_s": 0 if done else "", "batch_size": self.record.rows,
            "rate_limit": "", "snapshot_epoch": self.record.epoch, "mce": self.record.epoch if done else "",
            "started_ms": self._started_ms, "updated_ms": now})


def load_from_snapshot(backfill: SnapshotBackfill, spark: SparkSession,
                       commit: Callable[[int, pa.Table], None]) -> int:
    """Read the snapshot and hand its rows to ``commit(epoch, rows)`` (the consumer computes and commits
    epoch E); returns E."""
    rows = backfill.read(spark)
    commit(backfill.epoch, rows)
    backfill.publish(len(rows), done=True)
    return backfill.epoch
