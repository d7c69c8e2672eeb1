"""The Faust log cache against the real broker, Redis and Spark: serving, fan-out, replay of lagged
epochs, backpressure, isolation (I3), bounded memory (I4) and a SIGKILLed worker."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.spark_source import _Planner, read_partition_from_kafka, read_partition_range
from mvlog.connectors.view_store import ViewStore
from mvlog.services.table_writer import Table
from mvlog.services.view_consumer import ViewConsumer
from mvlog.services.view_ddl import alter_view, create_view

from .independent_consumer import read_topic
from .processes.cache_worker import CacheWorkerProcess

pytestmark = [pytest.mark.integration]

COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean"}


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


@contextmanager
def _writing(table: Table, seed: int = 0, rows: int = 20, pause: float = 0.03) -> Iterator[threading.Event]:
    """A background workload of upserts and deletes on ``table`` until the block ends."""
    stop = threading.Event()
    rng = random.Random(seed)

    def run() -> None:
        while not stop.is_set():
            table.upsert([{"id": rng.randrange(300), "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.3}
                          for _ in range(rows)])
            table.delete([rng.randrange(300)])
            stop.wait(pause)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join()


@contextmanager
def _worker(settings: Settings, *upstreams: str, partitions: int) -> Iterator[CacheWorkerProcess]:
    worker = CacheWorkerProcess(settings, *upstreams)
    try:
        worker.wait_ready(upstreams[0], partitions)
        yield worker
    finally:
        worker.stop()


def _barriers_once(settings: Settings, client: redis.Redis, view: str, last: int) -> None:
    """Each committed epoch's barrier is in each partition of ``view``'s changelog exactly once."""
    store = ViewStore(client, settings.topic_prefix)
    entry = CatalogStore(settings, client).get(view)
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic(view), entry.partitions, idle=1.5)
    for partition in range(entry.partitions):
        indexed = store.index.between(view, partition, 0, last)
        assert indexed
        for item in indexed:
            attempts = logs[partition].barriers.get(item.epoch, [])
            assert [offset for offset, _ in attempts] == [item.offset], (view, partition, item.epoch, attempts)


def _consumer(settings: Settings, spark: Any, view: str, client: redis.Redis) -> ViewConsumer:
    return ViewConsumer(settings, view, spark=spark, client=client, max_epochs_per_trigger=20,
                        trigger_interval="100 milliseconds")


def test_cache_serves_exactly_the_rows_kafka_gives(settings: Settings, redis_client: redis.Redis) -> None:
    """Every partition's range read through the cache equals the same range read from Kafka, and came
    from the worker's memory."""
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1", client=redis_client)
    with _worker(settings, "t1", partitions=settings.partitions) as worker:
        with _writing(table):
            _until(lambda: worker.upstream("t1")["epochs_cached"] >= 10, 30, "10 cached epochs")
        last = table.flush()
        _until(lambda: (worker.upstream("t1")["tail"] or 0) >= last, 10, "the worker to align the last epoch")
        planner = _Planner(settings, CatalogStore(settings, redis_client).get("t1"))
        floor = worker.upstream("t1")["floor"]
        parts = planner.plan(floor, last)
        assert len(parts) == settings.partitions
        for part in parts:
            cached = pa.Table.from_batches(list(read_partition_range(part)))
            kafka = pa.Table.from_batches(list(read_partition_from_kafka(part)))
            assert cached.num_rows > len(part.barriers)
            assert cached.equals(kafka), f"partition {part.partition}"
        epochs = len(planner.committed_epochs(floor, last))
        assert worker.upstream("t1")["served_epochs"] == epochs * settings.partitions
    table.close()


def test_backpressure_holds_the_lag_and_the_writer_resumes(make_settings: Callable[..., Settings],
                                                           redis_client: redis.Redis, spark: Any) -> None:
    """max_epoch_lag=5 and a stalled consumer: the lag never exceeds 5, the worker pauses the upstream,
    and the writer resumes by itself once the consumer catches up."""
    settings = make_settings(barrier_interval_ms=100)
    Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client).close()
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    alter_view(settings, "mv1", client=redis_client, max_epoch_lag=5)
    table = Table.open(settings, "t1", client=redis_client)  # its writer knows the setting from the start
    store = ViewStore(redis_client, settings.topic_prefix)
    lags: list[int] = []

    def lag() -> int:
        value = store.index.count_after("t1", store.mce("mv1"))
        lags.append(value)
        return value

    with _worker(settings, "t1", partitions=settings.partitions) as worker, _writing(table):
        _until(lambda: lag() >= 5, 30, "the lag to reach 5")
        _until(lambda: worker.upstream("t1")["paused"], 10, "the worker to pause t1")
        stalled_at = store.mce("t1")
        for _ in range(30):  # 1.5 s: ~15 barrier intervals with no new epoch
            assert lag() <= 5
            time.sleep(0.05)
        assert store.mce("t1") == stalled_at, "the writer opened an epoch past max_epoch_lag"
        consumer = _consumer(settings, spark, "mv1", redis_client)
        consumer.start()
        try:
            _until(lambda: (store.mce("t1") or 0) > stalled_at and (lag() or True), 60, "the writer to resume")
            _until(lambda: (store.mce("mv1") or 0) > stalled_at, 60, "the consumer to catch up")
            _until(lambda: not worker.upstream("t1")["paused"] or lag() >= 5, 10, "the worker to resume")
        finally:
            consumer.stop()
    table.close()
    assert max(lags) <= 5, max(lags)

