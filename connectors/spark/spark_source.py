"""The PySpark data source ``format("mvlog")``: a view's changelog as a DataFrame of signed rows.

Batch reads take an epoch range; streaming reads use epochs as offsets, so a micro-batch always holds
whole committed epochs. The driver only plans: it looks up, in the epoch index, where each planned
epoch's barrier sits in every partition. Each Spark task then reads one partition's part of the
range itself: from the Faust log cache when a worker holds those epochs (found through Redis, fetched
over HTTP as Arrow IPC), else from Kafka (``assign()``, no consumer group) from the barrier before the
range to the range's last barrier.

Writing into a table (``df.write`` / ``df.writeStream`` with option ``table``) is
:mod:`mvlog.services.tables.spark_sink` (they commit through the table's writer, a service); the subclass of
:class:`MvlogDataSource` that adds them, :class:`mvlog.services.spark.data_source.MvlogDataSource`, is the one
Spark sessions register.

Options (modelled on Spark's Kafka source):

================== ======================================================================
``view``           the view or table to read (required)
``startingEpoch``  ``earliest`` (default), ``latest``, or an epoch: the range starts *after* it
``endingEpoch``    batch only: ``latest`` (default) or an epoch (inclusive)
``maxEpochsPerTrigger`` streaming only: at most this many epochs per micro-batch
``maxRecordsPerTrigger`` streaming only: at most this many change events per micro-batch (summed over
                   the partitions from the epoch index), but always at least one whole epoch
``alignWith``      streaming only: the other upstreams of a join (comma-separated). Micro-batches then
                   range over the union of all their epochs and this view's, up to the epoch none of
                   them can still commit at or below (:func:`mvlog.connectors.redis.table_writers.plan_through`:
                   the least latest epoch of those whose writers run, past a stopped table's last epoch once
                   it is sealed); each micro-batch ends with one barrier row of partition -1 at its last
                   epoch (:func:`~mvlog.connectors.spark.change_rows.end_marker`), which may be none of this
                   view's epochs: the epoch to read the other upstreams up to
``smallReadRecords`` a read (a batch, or a micro-batch) of at most this many change events is one
                   Spark task over all its partitions, not a task per partition (default: the setting
                   ``small_read_records``, 10000; ``0``: always a task per partition)
``bootstrapServers`` / ``redisUrl`` / ``redisCluster`` / ``topicPrefix``: override the mvlog settings
                   (``redisCluster``: ``true`` when ``redisUrl`` is a Redis Cluster's; all four of a
                   process's settings: :func:`~mvlog.connectors.spark.source_options.connection_options`)
================== ======================================================================

Columns: ``_epoch``, ``_change_type`` (``insert``, ``delete``, ``update_preimage``,
``update_postimage``, as in Delta's change data feed, and ``barrier``: one row per partition and epoch,
so empty epochs are visible too), ``_weight`` (+1 / -1, 0 for barriers), ``_partition``, ``_offset``,
``_key`` (the Avro key bytes), then the view's columns (null on barrier rows).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings, load_settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReadError, next_records, reader_consumer
from mvlog.connectors.kafka.changelog_records import ChangeRecord, PoisonRecord, decode_change_run, decode_record
from mvlog.connectors.kafka.dead_letter import DeadLetterQueue
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.table_writers import TableWriters, plan_through
from mvlog.connectors.spark.change_rows import SignedRowBuilder, arrow_schema, end_marker
from mvlog.connectors.spark.log_cache_client import read_with_cache
from mvlog.connectors.spark.source_options import int_option, settings_overrides
from mvlog.gc_pause import gc_paused
from mvlog.join_bound import union_epochs
from mvlog.row_schema import Row, RowSchema
from mvlog.trigger_limit import last_admitted

# arrow_schema: re-exported from change_rows
__all__ = ["EpochRangeError", "MvlogDataSource", "PartitionRange", "ReadRanges", "arrow_schema", "plan_ranges",
           "read_partition_from_kafka", "read_partition_group", "read_partition_range", "read_partitions_from_kafka",
           "spark_schema_ddl", "trigger_ends"]

_META_DDL = "_epoch BIGINT, _change_type STRING, _weight INT, _partition INT, _offset BIGINT, _key BINARY"


STALL_TIMEOUT_S = 120.0  # a task reading a committed range that makes no progress this long fails


class EpochRangeError(ValueError):
    """An epoch range the changelog cannot serve (beyond what is committed or retained)."""


def spark_schema_ddl(schema: RowSchema) -> str:
    columns = ", ".join(f"`{c.name}` {c.type.spark_sql}" for c in schema.columns)
    return f"{_META_DDL}, {columns}" if columns else _META_DDL


@dataclass(frozen=True)
class PartitionRange(InputPartition):
    """One Kafka partition's part of an epoch range: what a Spark task reads."""

    settings_json: str
    view: str
    key_columns: tuple[str, ...]
    schema_json: dict[str, Any]
    partition: int
    after_epoch: int  # exclusive
    start_offset: int  # first offset after the barrier of ``after_epoch``
    barriers: tuple[tuple[int, int], ...]  # (epoch, barrier offset) of every planned epoch, ascending


@dataclass(frozen=True)
class PartitionGroup(InputPartition):
    """Several partitions' ranges read one after the other by one Spark task: a small read
    (``Settings.small_read_records``), where a task per partition costs more than the reading."""

    parts: tuple[PartitionRange, ...]


def read_partition_range(part: PartitionRange, batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
    """Executor side: one partition's committed epochs of the range, from the log cache when a worker
    holds them (:mod:`mvlog.connectors.spark.log_cache_client`), else from Kafka."""
    yield from read_with_cache(part, read_partition_from_kafka)


def read_partition_group(group: PartitionGroup, batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
    """Executor side: a small read's partitions, each planned epoch exactly once. What the log cache holds
    of each comes from there; what is left of them all is then read from Kafka by one consumer assigned to
    every such partition (:func:`read_partitions_from_kafka`). The batches come partition after partition
    from the cache, then mixed: every reader pairs and orders the rows by epoch, partition and offset."""
    left: list[PartitionRange] = []

    def later(part: PartitionRange) -> Iterator[pa.RecordBatch]:
        left.append(part)
        return iter(())

    for part in group.parts:
        yield from read_with_cache(part, later)
    yield from read_partitions_from_kafka(left, batch_rows)


def read_partitions_from_kafka(parts: Sequence[PartitionRange], batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
    """Executor side: ranges of several partitions of one changelog read from Kafka by one consumer assigned
    to them all, each decoded as :func:`read_partition_from_kafka` decodes one. A consumer per partition, one
    after the other, cost a client's set-up, its broker connections and a fetch round each: more than the
    reading, for the few records of a small read. A partition with a second range (the log cache served
    epochs between them) has it read on its own afterwards."""
    first: dict[int, PartitionRange] = {}
    rest: list[PartitionRange] = []
    for part in parts:
        if part.partition in first:
            rest.append(part)
        else:
            first[part.partition] = part
    if len(first) <= 1:
        for part in [*first.values(), *rest]:
            yield from read_partition_from_kafka(part, batch_rows)
        return
    consumer = reader_consumer(Settings.from_executor_json(parts[0].settings_json))
    reads = {partition: _KafkaPartitionRead(part, consumer) for partition, part in first.items()}
    try:
        consumer.assign([TopicPartition(read.topic, p, read.part.start_offset) for p, read in reads.items()])
        open_reads = dict(reads)
        while open_reads:
            with gc_paused():  # see mvlog.gc_pause: the messages die inside, before any collection
                messages: dict[int, list[Message]] = {p: [] for p in open_reads}
                for message in next_records(consumer):
                    mine = messages.get(message.partition())  # type: ignore[arg-type]
                    if mine is not None:
                        mine.append(message)
                    elif message.error() is not None and message.partition() not in reads:
                        raise ChangelogReadError(f"{parts[0].view}: {message.error()}")
                for partition, mine in messages.items():
                    open_reads[partition].take(mine)
            for partition, read in list(open_reads.items()):
                if read.done:  # its last barrier read: the consumer fetches it no more
                    consumer.incremental_unassign([TopicPartition(read.topic, partition)])
                    del open_reads[partition]
                if len(read.rows) >= batch_rows or (read.done and len(read.rows)):
                    yield from read.rows.flush_batches(batch_rows)
    finally:
        for read in reads.values():
            read.close()
        consumer.close()
    for part in rest:
        yield from read_partition_from_kafka(part, batch_rows)


def read_partition_from_kafka(part: PartitionRange, batch_rows: int = 8192) -> Generator[pa.RecordBatch, None, None]:
    """Executor side: one partition's committed epochs of the range read from Kafka, as record batches.

    Changes are buffered per (epoch, transaction) until their barrier: the barrier at the offset the
    epoch index names releases them; any other barrier (an aborted attempt a broker still delivered)
    drops them. So at most one epoch of one partition is buffered.
    """
    read = _KafkaPartitionRead(part)
    try:
        while True:
            with gc_paused():  # see mvlog.gc_pause: the messages die inside, before any collection
                read.take(next_records(read.consumer))
            if read.done:
                break
            if len(read.rows) >= batch_rows:
                yield from read.rows.flush_batches(batch_rows)
        if len(read.rows):
            yield from read.rows.flush_batches(batch_rows)
    finally:
        read.close()


class _KafkaPartitionRead:
    """The state of one partition's read: what :func:`read_partition_from_kafka` decodes batch by batch.
    ``consumer``: one shared with other partitions' reads (:func:`read_partitions_from_kafka`), which
    assigns it; None: its own, assigned here and closed with it."""

    def __init__(self, part: PartitionRange, consumer: Consumer | None = None) -> None:
        settings = Settings.from_executor_json(part.settings_json)
        self.part = part
        self.rows = SignedRowBuilder(RowSchema.from_json(part.schema_json), part.partition)
        self.planned = dict(part.barriers)  # epoch -> offset of its committed barrier
        self.last_offset = part.barriers[-1][1]
        self.topic = settings.changelog_topic(part.view)
        self.where = f"{self.topic} partition {part.partition}"
        self.pending: dict[tuple[int, str], list[tuple[int, bytes, Row | None, Row | None]]] = {}
        self.max_bytes = settings.max_record_bytes
        self.offset = part.start_offset - 1  # the last offset read
        self.poison = 0  # change events dead-lettered since the last barrier: that barrier may count them
        self.last_progress = time.monotonic()
        self._own_consumer = consumer is None
        self.consumer = consumer if consumer is not None else reader_consumer(settings)
        if consumer is None:
            self.consumer.assign([TopicPartition(self.topic, part.partition, part.start_offset)])
        self.dead_letters = DeadLetterQueue(settings, part.view)

    @property
    def done(self) -> bool:
        """Whether the range's last barrier was read (it is the last record of the range)."""
        return self.offset >= self.last_offset

    def take(self, messages: list[Message]) -> None:
        """Decode one consume batch; the epochs whose barrier it holds go to :attr:`rows`."""
        part, planned, pending = self.part, self.planned, self.pending
        if messages:
            self.last_progress = time.monotonic()
        elif time.monotonic() - self.last_progress > STALL_TIMEOUT_S:
            raise ChangelogReadError(f"{self.where}: no record for {STALL_TIMEOUT_S:.0f} s at offset {self.offset}, "
                                     f"expected up to the barrier at offset {self.last_offset}")
        i, count = 0, len(messages)
        while i < count and not self.done:
            # The usual records, a run of well-formed change events of one epoch, in one compiled call.
            epoch, txn, run, i = decode_change_run(part.view, part.key_columns, messages, i, self.max_bytes)
            if run:
                self.offset = run[-1][0]
                if epoch in planned and txn is not None:
                    pending.setdefault((epoch, txn), []).extend(run)
                continue
            message = messages[i]
            i += 1
            if message.error() is not None:
                raise ChangelogReadError(f"{self.where}: {message.error()}")
            offset = self.offset = message.offset() or 0
            key, value, headers = message.key(), message.value(), message.headers()
            record = decode_record(part.view, part.key_columns, self.topic, part.partition, offset, key, value,
                                   headers, self.max_bytes)
            if isinstance(record, PoisonRecord):  # to the dead-letter topic; the read goes on
                self.dead_letters.send(record, key, value, headers)
                self.poison += record.announced_change
                continue
            if isinstance(record, ChangeRecord):
                if record.epoch in planned:
                    pending.setdefault((record.epoch, record.txn), []).append(
                        (offset, key or b"", record.change.before, record.change.after))
                continue
            barrier = record.barrier
            short, self.poison = self.poison, 0
            changes = pending.pop((barrier.epoch, barrier.txn), [])
            for attempt in [a for a in pending if a[0] <= barrier.epoch]:
                del pending[attempt]  # aborted attempts whose barrier never came
            if planned.get(barrier.epoch) != offset:
                continue  # outside the range, or an aborted attempt's barrier
            if not len(changes) <= barrier.records <= len(changes) + short:
                raise ChangelogReadError(f"{self.where}: epoch {barrier.epoch} announces {barrier.records} "
                                         f"change(s), {len(changes)} were read ({short} dead-lettered)")
            self.rows.add_changes(barrier.epoch, changes)
            self.rows.add_barrier(barrier.epoch, offset)

    def close(self) -> None:
        if self._own_consumer:
            self.consumer.close()
        self.dead_letters.close()


@dataclass(frozen=True)
class AlignedEnd(InputPartition):
    """The last epoch of a micro-batch of a view read ``alignWith`` others: one barrier row (partition -1)."""

    schema_json: dict[str, Any]
    epoch: int


class _Planner:
    """Driver side: turns an epoch range into one :class:`PartitionRange` per Kafka partition."""

    def __init__(self, settings: Settings, entry: CatalogEntry) -> None:
        self.settings = settings
        self.entry = entry
        self._index: EpochIndex | None = None
        self._writers: TableWriters | None = None

    def _connect(self) -> None:
        """Made lazily: Spark pickles the reader, and a Redis client cannot be."""
        client = redis_client.connect(self.settings)
        self._index = EpochIndex(client, self.settings.topic_prefix)
        self._writers = TableWriters(client, self.settings.topic_prefix)

    @property
    def index(self) -> EpochIndex:
        if self._index is None:
            self._connect()
        assert self._index is not None
        return self._index

    @property
    def writers(self) -> TableWriters:
        if self._writers is None:
            self._connect()
        assert self._writers is not None
        return self._writers

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_index": None, "_writers": None}

    def committed_epochs(self, after: int, upto: int) -> list[int]:
        """Committed epochs in ``(after, upto]``, from partition 0's index (every partition has them all)."""
        return [e.epoch for e in self.index.between(self.entry.name, 0, after, upto)]

    def epoch_records(self, after: int, upto: int) -> list[tuple[int, int]]:
        """(epoch, change events in all partitions) of the committed epochs in ``(after, upto]``."""
        records: dict[int, int] = {}
        for partition in range(self.entry.partitions):
            for entry in self.index.between(self.entry.name, partition, after, upto):
                records[entry.epoch] = records.get(entry.epoch, 0) + entry.records
        return sorted(records.items())

    def latest_epoch(self) -> int:
        latest = self.index.latest(self.entry.name, 0)
        return latest.epoch if latest is not None else 0

    def refuse_past(self, upto: int, latest: int) -> None:
        """A range ending past the last committed epoch ``latest`` cannot be served."""
        if upto > latest:
            raise EpochRangeError(f"{self.entry.name}: endingEpoch {upto} is above the last committed epoch {latest}")

    def plan(self, after: int, upto: int) -> list[PartitionRange]:
        """One :class:`PartitionRange` per partition with epochs in ``(after, upto]``."""
        return [part for part, _ in self._ranges(after, upto)]

    def tasks(self, after: int, upto: int) -> list[PartitionRange] | list[PartitionGroup]:
        """What Spark's tasks read of ``(after, upto]``: :meth:`plan`'s ranges, one task each, or, for a read
        of at most ``small_read_records`` change events, one :class:`PartitionGroup` of them all."""
        ranges = self._ranges(after, upto)
        if len(ranges) > 1 and sum(records for _, records in ranges) <= self.settings.small_read_records:
            return [PartitionGroup(tuple(part for part, _ in ranges))]
        return [part for part, _ in ranges]

    def _ranges(self, after: int, upto: int) -> list[tuple[PartitionRange, int]]:
        """Each partition's range and its change events (from the epoch index)."""
        if upto <= after:
            return []
        parts: list[tuple[PartitionRange, int]] = []
        for partition in range(self.entry.partitions):
            entries = self.index.between(self.entry.name, partition, after, upto)
            if not entries:
                continue
            start = self.index.before(self.entry.name, partition, entries[0].epoch)
            parts.append((PartitionRange(
                settings_json=self.settings.to_executor_json(), view=self.entry.name,
                key_columns=self.entry.key_columns, schema_json=self.entry.schema.to_json(),
                partition=partition, after_epoch=start.epoch if start else 0,
                start_offset=start.offset + 1 if start else 0,
                barriers=tuple((e.epoch, e.offset) for e in entries)), sum(e.records for e in entries)))
        return parts


def trigger_ends(settings: Settings, entries: Sequence[CatalogEntry], after: int, max_epochs: int | None,
                 max_records: int | None) -> list[int]:
    """The last epoch of each micro-batch a stream of ``entries[0]`` started after ``after`` would read
    now, up to its latest committed epoch; with ``entries[1:]`` (as ``alignWith``), over the union of all
    their epochs up to the bound of :func:`~mvlog.connectors.redis.table_writers.plan_through`."""
    planners = [_Planner(settings, entry) for entry in entries]
    return _micro_batch_ends(planners[0], planners[1:], after, max_epochs, max_records)


def _micro_batch_ends(planner: _Planner, aligned: Sequence[_Planner], after: int, max_epochs: int | None,
                      max_records: int | None, first_only: bool = False) -> list[int]:
    planners = [planner, *aligned]
    latest = plan_through(planner.index, planner.writers, [p.entry for p in planners])
    if latest <= after:
        return []
    if max_records is not None:
        epochs = union_epochs([p.epoch_records(after, latest) for p in planners], after, latest)
    else:
        epochs = union_epochs([[(e, 0) for e in p.committed_epochs(after, latest)] for p in planners], after, latest)
    ends: list[int] = []
    while (end := last_admitted(epochs, max_epochs, max_records)) is not None:
        ends.append(end)
        if first_only:
            break
        epochs = [e for e in epochs if e[0] > end]
    return ends


def _positive_int(options: Any, name: str) -> int | None:
    value = options.get(name)
    return int_option(value, name, minimum=1) if value else None


def _parse_epoch(value: str | None, default: str, latest: int) -> int:
    text = (value or default).strip().lower()
    if text == "earliest":
        return 0
    if text == "latest":
        return latest
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"epoch option {value!r} must be 'earliest', 'latest' or an integer epoch") from None


class MvlogDataSource(DataSource):
    """``spark.read.format("mvlog").option("view", "mv1").load()`` (``option("table", ...)`` too); the
    writers are added by :class:`mvlog.services.spark.data_source.MvlogDataSource`."""

    #: The settings of the session that registered this class (see :meth:`for_settings`), as JSON; None:
    #: the ``MVLOG_*`` environment and settings file of the process that runs the data source.
    session_settings_json: str | None = None

    @classmethod
    def name(cls) -> str:
        return "mvlog"

    @classmethod
    def for_settings(cls, settings: Settings) -> type[MvlogDataSource]:
        """This data source bound to ``settings``: what a session registers.

        Spark runs the data source in reused Python workers whose environment is the JVM's at its start,
        so settings read from the environment there can be an earlier session's. The subclass is pickled
        by value with the class (it is not importable by name), so the settings travel with it.
        """
        return type(cls.__name__, (cls,), {"session_settings_json": settings.to_executor_json(),
                                           "__doc__": cls.__doc__})

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        name = self.options.get("view") or self.options.get("table")
        if not name:
            raise ValueError("the mvlog data source needs the option 'view' (reads) or 'table' (reads and writes)")
        overrides = settings_overrides(self.options)
        if self.session_settings_json is not None:
            self.settings = Settings.from_executor_json(self.session_settings_json).model_copy(update=overrides)
        else:
            self.settings = load_settings(**overrides)
        client = redis_client.connect(self.settings)
        self.entry = CatalogStore(self.settings, client).get(name)

    def schema(self) -> str:
        return spark_schema_ddl(self.entry.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self.settings, self.entry, self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 (Spark API)
        return _StreamReader(self.settings, self.entry, self.options)


class _BatchReader(DataSourceReader):
    def __init__(self, settings: Settings, entry: CatalogEntry, options: Any) -> None:
        planner = _Planner(settings, entry)
        latest = planner.latest_epoch()
        self.after = _parse_epoch(options.get("startingEpoch"), "earliest", latest)
        self.upto = _parse_epoch(options.get("endingEpoch"), "latest", latest)
        planner.refuse_past(self.upto, latest)
        self._parts = planner.tasks(self.after, self.upto)

    def partitions(self) -> Sequence[InputPartition]:
        return self._parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_planned(partition)


def _read_planned(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor side: what :meth:`_Planner.tasks` planned (Spark plans one empty partition, read as
    nothing, for an empty range)."""
    if isinstance(partition, PartitionRange):
        yield from read_partition_range(partition)
    elif isinstance(partition, PartitionGroup):
        yield from read_partition_group(partition)


def plan_ranges(settings: Settings, entry: CatalogEntry, after: int, upto: int) -> list[PartitionRange]:
    """Driver side, in the caller's process: one :class:`PartitionRange` per partition of ``entry`` with
    epochs in ``(after, upto]``, as a batch read plans them (:class:`ReadRanges` reads them)."""
    planner = _Planner(settings, entry)
    planner.refuse_past(upto, planner.latest_epoch())
    return planner.plan(after, upto)


@dataclass(frozen=True)
class ReadRanges:
    """``mapInArrow``'s function over ``spark.range(n, numPartitions=n)``: task ``i`` reads ``ranges[i]``.

    The same rows as a ``format("mvlog")`` batch read of the ranges, without its planning: Spark plans a
    Python data source's read in Python workers the driver's JVM starts for each read (the data source
    looked up, made, its reader planned), which a view whose operators run in tasks did for every
    micro-batch: 0.8-1.5 of the driver's 2.5-3.7 CPU s per million changes (bench/views.py --tasks)."""

    ranges: tuple[PartitionRange, ...]

    def run(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for i in batch.column(0).to_pylist():
                yield from read_partition_range(self.ranges[i])


class _StreamReader(DataSourceStreamReader):
    def __init__(self, settings: Settings, entry: CatalogEntry, options: Any) -> None:
        self._planner = _Planner(settings, entry)
        self._start = _parse_epoch(options.get("startingEpoch"), "latest", self._planner.latest_epoch())
        self._max_epochs = _positive_int(options, "maxEpochsPerTrigger")
        self._max_records = _positive_int(options, "maxRecordsPerTrigger")
        client = redis_client.connect(settings)
        catalog = CatalogStore(settings, client)
        self._aligned = [_Planner(settings, catalog.get(v.strip()))
                         for v in (options.get("alignWith") or "").split(",") if v.strip()]
        self.query_id = uuid.uuid4().hex[:8]

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 (Spark API)
        return {"epoch": self._start}

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:  # noqa: N802
        after = (start or {"epoch": self._start})["epoch"]
        # End on one of this view's epochs, within the trigger's limits.
        ends = _micro_batch_ends(self._planner, self._aligned, after, self._max_epochs, self._max_records,
                                 first_only=True)
        return {"epoch": ends[0] if ends else after}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        parts: list[InputPartition] = list(self._planner.tasks(start["epoch"], end["epoch"]))
        if self._aligned and end["epoch"] > start["epoch"]:  # the epoch to read the other upstreams up to
            parts.append(AlignedEnd(self._planner.entry.schema.to_json(), end["epoch"]))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, AlignedEnd):
            yield from end_marker(RowSchema.from_json(partition.schema_json), partition.epoch).to_batches()
        else:
            yield from _read_planned(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Progress lives in the view's MCE (Redis), not here: nothing to do."""
