"""Streaming reads of ``format("mvlog")`` bound each micro-batch in epochs and change events; a consumer
reads the backlog it starts with in the same micro-batches, with batch reads."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from pyspark.sql.functions import expr

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.spark_source import EpochRangeError, trigger_ends
from mvlog.services.pipeline.reading import UpstreamReader
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle


def _micro_batches(spark: Any, settings: Settings, view: str, options: dict[str, str],
                   expect_epochs: int) -> list[list[tuple[int, int]]]:
    """(epoch, change events) of each non-empty micro-batch, until ``expect_epochs`` epochs were read."""
    batches: list[list[tuple[int, int]]] = []
    seen = threading.Event()

    def collect(frame: Any, _batch_id: int) -> None:
        counted = frame.groupBy("_epoch").agg(
            expr("count_if(_change_type NOT IN ('barrier', 'update_preimage')) AS changes")).collect()
        changes = {row["_epoch"]: row["changes"] for row in counted}
        if changes:
            batches.append(sorted(changes.items()))
        if sum(len(b) for b in batches) >= expect_epochs:
            seen.set()

    reader = spark.readStream.format("mvlog").option("view", view).option("startingEpoch", "earliest")
    reader = reader.option("bootstrapServers", settings.bootstrap_servers).option("redisUrl", settings.redis_url)
    reader = reader.option("topicPrefix", settings.topic_prefix).options(**options)
    query = reader.load().writeStream.foreachBatch(collect).trigger(processingTime="100 milliseconds").start()
    try:
        deadline = time.monotonic() + 120
        while not seen.wait(0.2):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"only {batches} read in 120 s"
    finally:
        query.stop()
    return batches


def test_max_records_per_trigger_bounds_micro_batches_but_never_splits_an_epoch(
        settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    sizes = [30, 30, 30, 200, 10, 10]
    epochs = []
    for i, size in enumerate(sizes):
        table.upsert({"id": i * 1000 + j, "v": j} for j in range(size))
        epochs.append(table.flush())
    table.close()

    batches = _micro_batches(spark, settings, "t1", {"maxRecordsPerTrigger": "70"}, len(sizes))

    assert [e for batch in batches for e, _ in batch] == epochs  # every epoch once, in order
    assert [[n for _, n in batch] for batch in batches] == [[30, 30], [30], [200], [10, 10]]


def test_max_epochs_and_records_per_trigger_together(settings: Settings, redis_client: redis.Redis,
                                                     spark: Any) -> None:
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    for i in range(5):
        table.upsert({"id": i * 1000 + j, "v": j} for j in range(10))
        table.flush()
    table.close()

    batches = _micro_batches(spark, settings, "t1", {"maxRecordsPerTrigger": "1000", "maxEpochsPerTrigger": "2"}, 5)

    assert [len(batch) for batch in batches] == [2, 2, 1]


def test_trigger_ends_are_the_streams_micro_batches(settings: Settings, redis_client: redis.Redis,
                                                    spark: Any) -> None:
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    epochs = []
    for i, size in enumerate([30, 30, 30, 200, 10, 10]):
        table.upsert({"id": i * 1000 + j, "v": j} for j in range(size))
        epochs.append(table.flush())
    table.close()
    entry = CatalogStore(settings, redis_client).get("t1")

    batches = _micro_batches(spark, settings, "t1", {"maxRecordsPerTrigger": "70"}, len(epochs))

    assert trigger_ends(settings, [entry], 0, None, 70) == [batch[-1][0] for batch in batches]
    assert trigger_ends(settings, [entry], epochs[1], 2, None) == [epochs[3], epochs[5]]
    assert trigger_ends(settings, [entry], epochs[-1], None, 70) == []


def test_a_consumer_reads_the_backlog_it_starts_with_before_its_stream(
        settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    """start() applies the epochs committed before it with batch reads, micro-batch by micro-batch; the
    stream starts after them, and the view holds every epoch, whichever way it came."""
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    backlog = []
    for i in range(6):
        table.upsert({"id": i * 1000 + j, "v": j} for j in range(40))
        backlog.append(table.flush())
    create_view(settings, "mv1", "SELECT id, v FROM t1 WHERE v >= 20", client=redis_client)
    consumer = ViewConsumer(settings.model_copy(update={"max_records_per_trigger": 100}), "mv1", spark=spark,
                            client=redis_client)
    streamed: list[int] = []
    process_batch = consumer.process_batch

    def record(frame: Any, batch_id: int) -> None:
        streamed.extend(row["_epoch"] for row in frame.select("_epoch").distinct().collect())
        process_batch(frame, batch_id)

    consumer.process_batch = record  # type: ignore[method-assign,assignment]
    try:
        consumer.start()
        table.upsert({"id": 9000 + j, "v": j} for j in range(40))
        live = table.flush()
        consumer.wait_for_epoch(live, timeout=120)
    finally:
        consumer.stop()
    assert consumer.epochs_applied == len(backlog) + 1
    assert streamed == [live]  # the backlog came through the batch reads, the live epoch through the stream
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.row_count("mv1") == 7 * 20
    # Once stop() returned, the consumer commits nothing, whoever calls it: Spark can still be running a
    # foreachBatch call after query.stop() returned (SPARK-39218). A later upstream epoch stays above the MCE.
    table.upsert([{"id": 9999, "v": 99}])
    later = table.flush()
    table.close()
    consumer.apply_batch(consumer.reader.read_range("t1", live, later))
    assert consumer.catch_up() == live
    assert (store.mce("mv1"), consumer.epochs_applied, store.row_count("mv1")) == (live, len(backlog) + 1, 7 * 20)


def test_a_small_read_is_one_task_over_its_partitions(settings: Settings, redis_client: redis.Redis,
                                                      spark: Any) -> None:
    """A read of few change events runs as one Spark task (``smallReadRecords``); a larger one, a task
    per partition; the rows are the same either way."""
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    for i in range(3):
        table.upsert({"id": i * 1000 + j, "v": j} for j in range(50))
        table.flush()
    table.close()

    def read(small: int) -> tuple[int, list[tuple[Any, ...]]]:
        frame = (spark.read.format("mvlog").option("view", "t1").option("topicPrefix", settings.topic_prefix)
                 .option("bootstrapServers", settings.bootstrap_servers).option("redisUrl", settings.redis_url)
                 .option("smallReadRecords", str(small)).load())
        return frame.rdd.getNumPartitions(), sorted(tuple(r) for r in frame.collect())

    tasks_small, rows_small = read(150)
    tasks_split, rows_split = read(149)

    assert settings.partitions > 1
    assert tasks_small == 1
    assert tasks_split == settings.partitions
    assert rows_small == rows_split
    assert sum(1 for r in rows_small if r[1] == "insert") == 150


def test_a_read_for_tasks_is_planned_in_the_driver_and_read_by_its_tasks(settings: Settings, redis_client: redis.Redis,
                                                                       spark: Any) -> None:
    """The task path's reads (``UpstreamReader(task_per_partition=True).frame``) are planned in the driver's
    process and read by the tasks of a ``spark.range``: a Spark partition per upstream partition, the rows
    of the data source's read of the same range, an epoch past the last one refused as the data source
    refuses it, an empty range read as nothing."""
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    epochs = []
    for i in range(3):
        table.upsert({"id": i * 1000 + j, "v": j} for j in range(50))
        table.delete([(i - 1) * 1000] if i else [])
        epochs.append(table.flush())
    table.close()
    entry = CatalogStore(settings, redis_client).get("t1")
    reader = UpstreamReader(settings, spark, {"t1": entry}, ViewStore(redis_client, settings.topic_prefix).index,
                            50, task_per_partition=True)
    frame = reader.frame("t1", epochs[0], epochs[2])
    source = (spark.read.format("mvlog").option("view", "t1").option("topicPrefix", settings.topic_prefix)
              .option("bootstrapServers", settings.bootstrap_servers).option("redisUrl", settings.redis_url)
              .option("startingEpoch", str(epochs[0])).option("endingEpoch", str(epochs[2])).load())

    assert frame.rdd.getNumPartitions() == settings.partitions > 1
    rows = sorted(tuple(r) for r in frame.collect())
    assert rows == sorted(tuple(r) for r in source.collect())
    assert sum(1 for r in rows if r[1] == "insert") == 100 and sum(1 for r in rows if r[1] == "delete") == 2
    assert reader.frame("t1", epochs[2], epochs[2]).count() == 0
    with pytest.raises(EpochRangeError):
        reader.frame("t1", epochs[0], epochs[2] + 1)


def test_small_epochs_of_a_view_in_tasks_go_the_drivers_way_once_it_resumed(settings: Settings,
                                                                           redis_client: redis.Redis,
                                                                           spark: Any) -> None:
    """``tasks_min_records``: with the operators in tasks, epochs pending upstream with fewer change events
    than that go the driver's way (latency), but only once the consumer completed an apply in tasks (a
    crash may have left an epoch some partitions committed, which only the task path finishes); larger
    ones go the tasks'. A filter and a GROUP BY (whose operator state each path leaves for the other),
    rows moving between groups and deleted; the oracle holds at every epoch, whichever way each went."""
    settings = settings.model_copy(update={"operators_in_tasks": True, "tasks_min_records": 100})
    table = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    views = {"mv": "SELECT id, v FROM t1 WHERE v >= 0",
             "mg": "SELECT v, count(*) AS n, sum(id) AS s FROM t1 GROUP BY v"}
    for name, sql in views.items():
        create_view(settings, name, sql, client=redis_client)

    def epoch(rows: int, first: int, salt: int, deleted: tuple[int, ...] = ()) -> int:
        table.upsert({"id": first + i, "v": (3 * i + salt) % 5 - 1} for i in range(rows))
        table.delete(list(deleted))
        return table.flush()

    def written_in_tasks(consumers: list[ViewConsumer], last: int) -> list[int]:
        """Partition epochs each consumer's tasks wrote to catch up to ``last``."""
        written = []
        for consumer in consumers:
            assert consumer.tasks is not None
            before = consumer.tasks.epochs_written
            assert consumer.catch_up() == last
            written.append(consumer.tasks.epochs_written - before)
        return written

    all_in_tasks, none = [settings.partitions] * len(views), [0] * len(views)
    small = epoch(10, 0, 0)
    consumers = [ViewConsumer(settings, name, spark=spark) for name in views]
    try:  # not resumed yet: even a small epoch goes the tasks' way
        assert written_in_tasks(consumers, small) == all_in_tasks
        # Resumed, small: the driver's way (ids 5..9 move to other groups, 0 and 1 are deleted).
        assert written_in_tasks(consumers, epoch(10, 5, 1, deleted=(0, 1))) == none
        assert written_in_tasks(consumers, epoch(150, 3, 2)) == all_in_tasks  # large: the tasks' way
        assert written_in_tasks(consumers, epoch(10, 100, 3, deleted=(3,))) == none
    finally:
        for consumer in consumers:
            consumer.stop()
    consumers = [ViewConsumer(settings, name, spark=spark) for name in views]  # new consumers resume in tasks
    try:
        assert written_in_tasks(consumers, epoch(10, 7, 4)) == all_in_tasks
    finally:
        for consumer in consumers:
            consumer.stop()
    table.close()
    assert check_oracle(settings, redis_client, ["t1", *views]) >= 10
