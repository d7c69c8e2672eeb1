"""Snapshot compaction: a Spark job that writes a view's rows at an epoch as Parquet.

snapshot(E2) = snapshot(E1) + changelog(E1, E2]: the last snapshot's rows (as +1 rows at E1) and the
changelog's signed rows after it (read by executors with ``format("mvlog")``) are netted per key in Spark
SQL (:func:`~mvlog.snapshot_plan.net_sql`), then written one folder per vnode (``_vnode=N``), each sorted
by primary key, under ``<snapshot_root>/<prefix>/<view>/epoch=<E2>``. Nothing passes through the driver.
Without an earlier snapshot (or with ``from_scratch``) the whole changelog is read, which needs it
retained from its first epoch.

The folder is written under a temporary name and renamed once complete; only then is it recorded in
Redis (:class:`~mvlog.connectors.redis.snapshot_store.SnapshotStore`), and snapshots beyond the newest
``snapshot_keep`` are forgotten, then deleted. Every run checks that the changelog's Kafka retention
covers the snapshot interval and returns (and logs) a warning when it does not.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import redis
from confluent_kafka import KafkaException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as sf

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.checkpoints import latest_checkpoint
from mvlog.connectors.kafka.retention import low_watermarks, starts_the_log, topic_config
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.snapshot_store import MANIFEST, SnapshotStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.source_options import changelog_read
from mvlog.snapshot_plan import (
    RetentionCheck,
    SnapshotError,
    SnapshotRecord,
    first_needed_offset,
    net_sql,
    retention_ms_of,
    snapshot_age_ms,
    snapshots_to_drop,
    uncovered_partitions,
)
from mvlog.views.evaluate import arrow_type

log = logging.getLogger(__name__)

VNODE_COLUMN = "_vnode"
KEY_COLUMN = "_key"


@dataclass(frozen=True)
class SnapshotResult:
    record: SnapshotRecord
    dropped: list[SnapshotRecord] = field(default_factory=list)
    warning: str | None = None
    built: bool = True  # False: a snapshot at that epoch existed already


def snapshot_path(settings: Settings, view: str, epoch: int) -> Path:
    return (settings.snapshot_root / settings.topic_prefix / view / f"epoch={epoch}").resolve()


def retention_check(settings: Settings, view: str, last: SnapshotRecord | None, epoch: int) -> RetentionCheck:
    """The view's changelog retention against the configured interval and the time since ``last``."""
    topic = settings.changelog_topic(view)
    since = snapshot_age_ms(last.epoch, epoch) if last is not None else None
    try:
        config = topic_config(settings, topic)
    except KafkaException as error:  # e.g. no DescribeConfigs permission: say so, do not fail the snapshot
        return RetentionCheck(topic, None, settings.snapshot_interval_ms, since, unknown=f"{error}")
    return RetentionCheck(topic, retention_ms_of(config), settings.snapshot_interval_ms, since)


def check_changelog_after(settings: Settings, store: ViewStore, entry: CatalogEntry, epoch: int) -> None:
    """Raise SnapshotError unless Kafka still holds every record of ``entry``'s changelog after ``epoch``."""
    needed = {p: first_needed_offset(store.index.at(entry.name, p, epoch),
                                     store.index.first_at_or_after(entry.name, p, epoch + 1))
              for p in range(entry.partitions)}
    lows = low_watermarks(settings, settings.changelog_topic(entry.name), entry.partitions)
    if missing := uncovered_partitions(lows, needed):
        raise SnapshotError(f"{entry.name}: the changelog no longer holds every epoch after {epoch} "
                            f"(partitions {missing} were trimmed by retention or that epoch is not indexed); "
                            f"Kafka retention must cover the time between two snapshots")


def snapshot_schema_ddl(entry: CatalogEntry) -> str:
    """The columns of a snapshot's files: the view's, then ``_key`` (the folder names give ``_vnode``)."""
    columns = ", ".join(f"`{c.name}` {c.type.spark_sql}" for c in entry.schema.columns)
    return f"{columns}, `{KEY_COLUMN}` BINARY" if columns else f"`{KEY_COLUMN}` BINARY"


def read_snapshot(spark: SparkSession, entry: CatalogEntry, path: str) -> DataFrame:
    """A snapshot's rows (an empty snapshot has no files: the schema is given, not inferred)."""
    return spark.read.schema(snapshot_schema_ddl(entry)).parquet(path)


def snapshot_arrow_schema(entry: CatalogEntry) -> pa.Schema:
    return pa.schema([*((c.name, arrow_type(c.type)) for c in entry.schema.columns), (KEY_COLUMN, pa.binary())])


def vnode_file_writer(folder: str, schema: pa.Schema, batch_rows: int = 8192
                      ) -> Callable[[Iterable[Row]], Iterator[tuple[int, int]]]:
    """A task's writer: its rows arrive sorted by (vnode, key); it streams them into
    ``folder/_vnode=N/part-<task>.parquet`` (one file per vnode it holds, at most ``batch_rows`` rows in
    memory) and yields (vnode, rows) per file. Executors write; the driver only collects the counts."""
    names = schema.names

    def write(rows: Iterable[Row]) -> Iterator[tuple[int, int]]:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        context = TaskContext.get()
        task = f"{context.partitionId() if context else 0:05d}-{uuid.uuid4().hex[:8]}"
        writer: pq.ParquetWriter | None = None
        current, count = -1, 0
        pending: list[Row] = []

        def flush() -> None:
            if pending and writer is not None:
                writer.write_table(pa.table({n: [r[n] for r in pending] for n in names}, schema=schema))
                pending.clear()

        for row in rows:
            vnode = row[VNODE_COLUMN]
            if vnode != current:
                flush()
                if writer is not None:
                    writer.close()
                    yield current, count
                directory = Path(folder) / f"{VNODE_COLUMN}={vnode}"
                directory.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(str(directory / f"part-{task}.parquet"), schema)
                current, count = vnode, 0
            pending.append(row)
            count += 1
            if len(pending) >= batch_rows:
                flush()
        flush()
        if writer is not None:
            writer.close()
            yield current, count

    return write


def snapshot_frame(spark: SparkSession, settings: Settings, entry: CatalogEntry, base: SnapshotRecord | None,
                   epoch: int) -> DataFrame:
    """rows(view, epoch) as a DataFrame (the view's columns, ``_key``, ``_vnode``): ``base`` + the
    changelog's epochs in (base.epoch, epoch] netted per key; without ``base``, the whole changelog."""
    columns = [sf.col(f"`{c}`") for c in entry.schema.names]
    after = base.epoch if base is not None else None
    changes = (changelog_read(spark, settings, entry.name, after, epoch)
               .where(sf.col("_change_type") != "barrier")
               .select(*columns, KEY_COLUMN, "_epoch", "_offset", "_weight"))
    if base is not None:
        rows = read_snapshot(spark, entry, base.path).select(
            *columns, KEY_COLUMN, sf.lit(base.epoch).cast("bigint").alias("_epoch"),
            sf.lit(-1).cast("bigint").alias("_offset"), sf.lit(1).cast("int").alias("_weight"))
        changes = rows.unionByName(changes)
    name = f"mvlog_snapshot_{uuid.uuid4().hex}"
    changes.createOrReplaceTempView(name)
    netted = spark.sql(net_sql(name))
    vnode = sf.pmod(sf.crc32(KEY_COLUMN), sf.lit(256)).cast("int")  # mvlog.vnode.vnode_of in SQL
    return netted.select(*columns, KEY_COLUMN, vnode.alias(VNODE_COLUMN))


def build_snapshot(settings: Settings, view: str, spark: SparkSession, *, client: redis.Redis | None = None,
                   epoch: int | None = None, from_scratch: bool = False, keep: int | None = None,
                   on_stage: Callable[[str], None] | None = None) -> SnapshotResult:
    """Write and record a snapshot of ``view`` (a table or a view) at ``epoch`` (default: its newest
    checkpoint epoch, the MCE itself unless barriers are checkpoints only every Nth epoch)."""
    stage = on_stage or (lambda _: None)
    client = client or redis_client.connect(settings)
    catalog = CatalogStore(settings, client)
    entry = catalog.get(view)
    store = ViewStore(client, settings.topic_prefix)
    snapshots = SnapshotStore.of(settings, client)
    mce = store.mce(view)
    if mce is None:
        raise SnapshotError(f"{view} has no committed epoch yet: nothing to snapshot")
    if epoch is None:  # the newest checkpoint (the MCE itself with the default checkpoint frequency)
        epoch = latest_checkpoint(settings, store.index, view, mce)
        if epoch is None:
            raise SnapshotError(f"{view} has no committed checkpoint epoch yet: nothing to snapshot")
    if epoch > mce or store.index.at(view, 0, epoch) is None:
        raise SnapshotError(f"{view}: epoch {epoch} is not a committed epoch (its MCE is {mce})")
    last = snapshots.latest(view, at_or_before=epoch)
    stage("checking retention")
    check = retention_check(settings, view, last, epoch)
    warning = check.warning()
    if warning is not None:
        log.warning("%s", warning)
    if last is not None and last.epoch == epoch and not from_scratch:
        return SnapshotResult(last, warning=warning, built=False)
    base = None if from_scratch else last
    if base is not None:
        check_changelog_after(settings, store, entry, base.epoch)
    elif not starts_the_log(settings, store.index, view):
        raise SnapshotError(f"{view}: no earlier snapshot and its changelog is no longer retained from its "
                            "first epoch: a snapshot cannot be built from scratch")
    stage(f"netting epochs {base.epoch if base else 'start'}..{epoch}")
    frame = snapshot_frame(spark, settings, entry, base, epoch)
    final = snapshot_path(settings, view, epoch)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    stage("writing Parquet")
    temporary.mkdir()
    sorted_rows = frame.repartition(VNODE_COLUMN).sortWithinPartitions(VNODE_COLUMN, *entry.key_columns)
    written = sorted_rows.rdd.mapPartitions(vnode_file_writer(str(temporary), snapshot_arrow_schema(entry))).collect()
    rows = sum(count for _, count in written)
    record = SnapshotRecord(view, epoch, str(final), rows, base.epoch if base else 0, int(time.time() * 1000))
    (temporary / MANIFEST).write_text(record.to_json())
    if final.exists():
        snapshots.forget(view, epoch)
        shutil.rmtree(final)  # a snapshot rebuilt from scratch at an epoch that had one
    temporary.rename(final)
    snapshots.record(record)
    stage("pruning old snapshots")
    dropped = snapshots_to_drop(snapshots.all(view), keep or settings.snapshot_keep)
    for old in dropped:
        snapshots.forget(view, old.epoch)
        shutil.rmtree(old.path, ignore_errors=True)
    log.info("%s: snapshot at epoch %d (%d rows) in %s, built from %s", view, epoch, rows, final,
             f"the snapshot at {base.epoch}" if base else "the changelog's start")
    return SnapshotResult(record, dropped, warning)
