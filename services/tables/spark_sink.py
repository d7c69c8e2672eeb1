"""The writing side of ``format("mvlog")``: a DataFrame into a root table, one epoch per (micro-)batch.

::

    df.write.format("mvlog").option("table", "t1").mode("append").save()      # upsert, one epoch
    df.write.format("mvlog").option("table", "t1").mode("overwrite").save()   # replace, one epoch
    df.writeStream.format("mvlog").option("table", "t1")
      .option("checkpointLocation", path).start()                            # one epoch per micro-batch

Design (rows move executors -> Redis -> driver, never through Spark's task results):

1. **Driver, planning** (:meth:`MvlogDataSource.writer`): the table's catalog entry is read and the
   DataFrame's columns are checked against it (an unknown column, a missing key column or a Spark type
   the column cannot hold is refused at once, naming the column). A fresh write id names the staging keys.
2. **Executors** (:meth:`_Staging.write`): each task validates its rows with the table's
   :class:`~mvlog.row_schema.RowSchema` (a refused row fails the task with its partition, row index,
   field and problem) and stages each Arrow record batch it receives, as Arrow IPC, under its own Redis
   key ``<prefix>:{<table>}:spark-stage:<write id>:<uuid>`` with a TTL (``stageTtlSeconds``, default
   one hour). A task holds one record batch (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows) at a
   time; its commit message (:class:`StagedPartition`) is only the list of its keys.
3. **Driver, commit**: the table is opened with :class:`~mvlog.services.tables.writer.Table` (which fences
   any other writer of the table and rolls Redis forward from Kafka), the staged batches are read one key
   at a time and queued with ``Table.upsert`` (the same validation as every write; a refused row names
   its Spark partition too), ``overwrite`` queues deletes of every committed key the data does not hold
   (``Table.delete_unwritten``), and everything is committed as **one epoch**: one Kafka transaction,
   then Redis rows + MCE. An error before that commit commits nothing. The staged keys are deleted
   after the commit, and by ``abort`` when a task failed (a key whose task died without a message
   expires with its TTL).
4. **Streams, exactly once**: the epoch's barriers carry a ``spark_batch`` mutation (writer, batch id;
   :mod:`mvlog.spark_batch_record`) in the same transaction. Before committing micro-batch ``b`` the
   driver finds the last batch of this writer that the table committed (:func:`committed_batch`: the
   barriers of the changelog's partition 0 from a hint kept in Redis, counting only epochs the epoch
   index holds, so an epoch abandoned by a crash between Kafka and Redis does not count); ``b`` at or
   below it is a replay after a crash and is skipped. The writer is named by the ``writerId`` option, else
   by the query's ``checkpointLocation`` and the query id its ``metadata`` file holds (stable across
   restarts of the query, unlike its run id; a new checkpoint at the same path is a new writer).

Memory: executors hold one record batch; the driver's commit holds the batch's rows, folded by key (the
pending writes of one ``Table`` epoch), plus one staged record batch. A batch larger than the driver's
memory must be split into several writes (several epochs).

It commits through the table writer of :mod:`mvlog.services.tables.writer` (the one writer of a root
table's epochs), so it is a service. The data source Spark sessions register, reads and these writes, is
:class:`mvlog.services.spark.data_source.MvlogDataSource`; it imports this module only where a write is planned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import redis
from confluent_kafka import TopicPartition
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import next_records, reader_consumer
from mvlog.connectors.kafka.changelog_writer import ConsumedInput
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import ColumnType, FieldError, RowSchema
from mvlog.schemas.codec import HEADER_TYPE, TYPE_BARRIER, decode_barrier
from mvlog.services.tables.writer import RowValidationError, Table
from mvlog.spark_batch_record import SparkBatch, spark_batch_mutation, spark_batch_of

__all__ = ["SparkWriteError", "StagedPartition", "WriteTarget", "batch_writer", "committed_batch",
           "stream_writer"]

log = logging.getLogger(__name__)

DEFAULT_STAGE_TTL_S = 3600
_SHOWN_ERRORS = 10
_SPARK_TYPES: dict[ColumnType, tuple[type[DataType], ...]] = {
    ColumnType.INT: (ByteType, ShortType, IntegerType, LongType),
    ColumnType.FLOAT: (FloatType, DoubleType, ByteType, ShortType, IntegerType, LongType),
    ColumnType.STRING: (StringType,),
    ColumnType.BOOLEAN: (BooleanType,),
    ColumnType.BYTES: (BinaryType,),
}


class SparkWriteError(ValueError):
    """A DataFrame that cannot be written into the table, with what and where."""


@dataclass(frozen=True)
class StagedPartition(WriterCommitMessage):
    """A task's commit message: the Redis keys of the record batches it staged, in order."""

    partition: int
    keys: tuple[str, ...]
    rows: int


@dataclass(frozen=True)
class WriteTarget:
    """What executors and the commit need, picklable (Spark ships the writer to its Python workers)."""

    settings_json: str
    table: str
    schema_json: dict[str, Any]
    write_id: str  # names this write's staging keys
    overwrite: bool
    stage_ttl_s: int

    @property
    def settings(self) -> Settings:
        return Settings.from_executor_json(self.settings_json)

    def stage_key(self, prefix: str) -> str:
        return view_key(prefix, self.table, f"spark-stage:{self.write_id}:{uuid.uuid4().hex}")


def check_columns(entry: CatalogEntry, schema: StructType) -> None:
    """Refuse a DataFrame whose columns the table cannot take, naming the column."""
    table = entry.schema
    known = {c.name: c for c in table.columns if not c.hidden}
    names = [f.name for f in schema.fields]
    if unknown := [n for n in names if n not in known]:
        raise SparkWriteError(f"table {entry.name} has no column(s) {', '.join(map(repr, unknown))} "
                              f"(its columns: {', '.join(known)})")
    if missing := [k for k in table.primary_key if k not in names]:
        raise SparkWriteError(f"table {entry.name}: the DataFrame lacks the primary key column(s) "
                              f"{', '.join(map(repr, missing))}")
    for spark_field in schema.fields:
        column = known[spark_field.name]
        if not isinstance(spark_field.dataType, _SPARK_TYPES[column.type]):
            raise SparkWriteError(f"table {entry.name}: column {column.name!r} is {column.type.value}, the "
                                  f"DataFrame's is {spark_field.dataType.simpleString()}")


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


class _Staging:
    """Executor side, shared by the batch and the stream writer."""

    target: WriteTarget

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPartition:
        target = self.target
        settings = target.settings
        schema = RowSchema.from_json(target.schema_json)
        partition = _partition_id()
        client = redis_client.task_client(settings)
        keys: list[str] = []
        rows = 0
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                errors: list[FieldError] = []
                for offset, row in enumerate(batch.to_pylist()):
                    errors.extend(schema.validate(row, rows + offset))
                    if len(errors) >= _SHOWN_ERRORS:
                        break
                if errors:
                    raise SparkWriteError(f"table {target.table}: Spark partition {partition}: row(s) refused "
                                          f"(row = index in the partition): " + "; ".join(map(str, errors)))
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as stream:
                    stream.write_batch(batch)
                key = target.stage_key(settings.topic_prefix)
                client.set(key, sink.getvalue().to_pybytes(), ex=target.stage_ttl_s)
                keys.append(key)
                rows += batch.num_rows
        except BaseException:
            if keys:
                client.delete(*keys)
            raise
        return StagedPartition(partition, tuple(keys), rows)


def _staged(messages: Sequence[WriterCommitMessage | None]) -> list[StagedPartition]:
    return [m for m in messages if isinstance(m, StagedPartition)]


def drop_staged(client: redis.Redis, messages: Sequence[WriterCommitMessage | None]) -> None:
    keys = [key for message in _staged(messages) for key in message.keys]
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])


def _load(table: Table, client: redis.Redis, staged: Sequence[StagedPartition]) -> int:
    """Queue every staged row into ``table`` (one record batch in memory at a time)."""
    rows = 0
    for message in staged:
        done = 0
        for key in message.keys:
            raw = cast(bytes | None, client.get(key))
            if raw is None:
                raise SparkWriteError(f"table {table.entry.name}: the rows Spark partition {message.partition} "
                                      f"staged ({key}) are gone from Redis (expired, or Redis lost them); "
                                      "nothing was committed: run the write again")
            for batch in pa.ipc.open_stream(raw):
                try:
                    table.upsert(batch.to_pylist())
                except RowValidationError as error:
                    raise SparkWriteError(f"table {table.entry.name}: Spark partition {message.partition}, rows "
                                          f"from {done}: {error}") from error
                done += batch.num_rows
        rows += done
    return rows


def commit_write(target: WriteTarget, messages: Sequence[WriterCommitMessage | None],
                 batch: SparkBatch) -> int | None:
    """Driver side: the staged rows of every task as one epoch of the table (None when ``batch`` is a
    replay of a micro-batch the table already committed). The staged keys are deleted in every case."""
    settings = target.settings
    client = redis_client.connect(settings)
    staged = _staged(messages)
    try:
        table = Table.open(settings, target.table, client, auto_commit=False)  # fences, rolls forward
        try:
            if batch.batch >= 0 and (done := committed_batch(settings, table.store, target.table, batch.writer)) \
                    is not None and batch.batch <= done:
                log.info("%s: Spark batch %d of %s was committed already (up to %d): skipped", target.table,
                         batch.batch, batch.writer, done)
                return None
            try:
                _load(table, client, staged)
                if target.overwrite:
                    table.delete_unwritten()
                committed = table.commit_epoch(ConsumedInput([], None, spark_batch_mutation(target.table, batch)))
            except BaseException:
                table.discard()  # close() would commit what is queued
                raise
            _remember(client, settings, target.table, batch, committed.epoch)
            return committed.epoch
        finally:
            table.close()
    finally:
        drop_staged(client, messages)
        client.close()


def _hint_key(settings: Settings, table: str) -> str:
    return view_key(settings.topic_prefix, table, "spark-batches")


def _remember(client: redis.Redis, settings: Settings, table: str, batch: SparkBatch, epoch: int) -> None:
    """A hint of where to start looking for the writer's last batch (Kafka stays the truth)."""
    if batch.batch >= 0:
        client.hset(_hint_key(settings, table), batch.writer, f"{batch.batch}:{epoch}")


def committed_batch(settings: Settings, store: ViewStore, table: str, writer: str,
                    timeout_s: float = 60.0) -> int | None:
    """The last micro-batch id of ``writer`` that ``table`` committed, from its changelog.

    Reads partition 0's barriers (each epoch's barrier there carries the ``spark_batch`` mutation) from
    the hint's epoch (else from the log's start) to its end, and counts an epoch only when the epoch
    index holds that very barrier: only committed epochs are indexed, so one a crash abandoned (its
    Kafka transaction committed, Redis never applied it, the next writer did not name it) does not count.
    The caller must have fenced the table's other writers and rolled Redis forward (``Table.open``)."""
    best: int | None = None
    start = 0
    raw = cast(bytes | None, store.redis.hget(_hint_key(settings, table), writer))
    if raw is not None:
        hinted_batch, hinted_epoch = (int(part) for part in raw.decode().split(":"))
        entry = store.index.at(table, 0, hinted_epoch)
        if entry is not None:
            best, start = hinted_batch, entry.offset
    topic = settings.changelog_topic(table)
    consumer = reader_consumer(settings)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 15.0, False)
        start = max(start, low)
        if high <= start:
            return best
        consumer.assign([TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in next_records(consumer, 0.2):
                offset, value = message.offset(), message.value()
                if message.error() is not None or offset is None:
                    continue
                if value is not None and (HEADER_TYPE, TYPE_BARRIER) in (message.headers() or []):
                    barrier = decode_barrier(value)
                    found = spark_batch_of(barrier.mutation)
                    if found is not None and found.writer == writer and \
                            (entry := store.index.at(table, 0, barrier.epoch)) is not None and entry.offset == offset:
                        best = found.batch if best is None else max(best, found.batch)
                if offset + 1 >= high:
                    return best
            if consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
                return best
        raise SparkWriteError(f"table {table}: its changelog {topic}[0] was not read to its end ({high}) within "
                              f"{timeout_s:.0f} s: cannot tell which Spark batches it committed")
    finally:
        consumer.close()


class _BatchWriter(_Staging, DataSourceArrowWriter):
    def __init__(self, target: WriteTarget) -> None:
        self.target = target

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_write(self.target, messages, SparkBatch(self.target.write_id, -1,
                                                       "overwrite" if self.target.overwrite else "append"))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with contextlib.closing(redis_client.connect(self.target.settings)) as client:
            drop_staged(client, messages)


class _StreamWriter(_Staging, DataSourceStreamArrowWriter):
    def __init__(self, target: WriteTarget, writer: str) -> None:
        self.target = target
        self.writer = writer

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        commit_write(self.target, messages, SparkBatch(self.writer, batchId,
                                                       "overwrite" if self.target.overwrite else "append"))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        with contextlib.closing(redis_client.connect(self.target.settings)) as client:
            drop_staged(client, messages)


def _target(settings: Settings, entry: CatalogEntry, schema: StructType, overwrite: bool,
            options: Any) -> WriteTarget:
    if entry.kind != "table":
        raise SparkWriteError(f"{entry.name} is a {entry.kind}: Spark writes only into tables")
    check_columns(entry, schema)
    ttl = options.get("stageTtlSeconds")
    try:
        stage_ttl_s = int(ttl) if ttl else DEFAULT_STAGE_TTL_S
    except ValueError:
        stage_ttl_s = 0
    if stage_ttl_s < 1:
        raise SparkWriteError(f"option stageTtlSeconds must be a positive integer, not {ttl!r}")
    return WriteTarget(settings.to_executor_json(), entry.name, entry.schema.to_json(), uuid.uuid4().hex,
                       overwrite, stage_ttl_s)


def batch_writer(settings: Settings, entry: CatalogEntry, schema: StructType, overwrite: bool,
                 options: Any) -> DataSourceArrowWriter:
    return _BatchWriter(_target(settings, entry, schema, overwrite, options))


def _query_id(checkpoint: str) -> str | None:
    """The streaming query's id from its checkpoint's ``metadata`` file (``{"id": ...}``, written when
    the query is first started, kept across restarts), when the checkpoint is on a local file system."""
    path = Path(checkpoint.removeprefix("file:")) / "metadata"
    try:
        line = path.read_text().splitlines()[0]
        return str(json.loads(line)["id"])
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None


def stream_writer(settings: Settings, entry: CatalogEntry, schema: StructType, overwrite: bool,
                  options: Any) -> DataSourceStreamArrowWriter:
    """The writer's name is ``writerId``, else ``checkpointLocation`` plus the query's id found there:
    a checkpoint deleted and started afresh at the same path numbers its batches from 0 again, and
    must not be taken for a replay of the old query's batches."""
    writer = options.get("writerId")
    checkpoint = options.get("checkpointLocation") or options.get("checkpointlocation")
    if not writer and checkpoint:
        query = _query_id(str(checkpoint))
        writer = f"{checkpoint}#{query}" if query else checkpoint
    if not writer:
        raise SparkWriteError(f"table {entry.name}: a streaming write needs the option writerId or "
                              "checkpointLocation: it names the writer whose batches are committed once")
    return _StreamWriter(_target(settings, entry, schema, overwrite, options), str(writer))
