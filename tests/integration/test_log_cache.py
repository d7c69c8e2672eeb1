"""The Faust log cache against the real broker, Redis and Spark: serving, fan-out, replay of lagged
epochs, backpressure, bounded memory (I4) and a SIGKILLed worker (isolation, I3:
``test_log_cache_isolation.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.redis_client import connect as connect_redis
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.spark_source import _Planner, read_partition_from_kafka, read_partition_range
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import alter_view, create_view

from ..oracle import check_oracle
from .barrier_check import assert_barriers_once
from .cache_workload import COLUMNS, cache_worker, until, writing
from .independent_consumer import read_topic
from .processes.cache_worker import CacheWorkerProcess
from .test_redis_restart import DOWN_S, AofRedis

pytestmark = [pytest.mark.integration]

# I4 for a worker is checked above its idle RSS once its data path has warmed up (the first fetches,
# Faust's and aiokafka's buffers, Arrow, the allocators' arenas: a one-time cost, reported), against the
# "one batch" the worker measures itself (``batch_bytes`` in /stats/: one fetch, the records held while
# aligning, twice the largest epoch) plus allocator noise.
NOISE = 4 * 1024 * 1024
#: What the worker's peak RSS may gain over one slice of 30000 rows (~8 MB) once warm, in the slice that
#: gains least of three: a leak of a tenth of each row shows in every slice, while a step of bounded memory
#: (librdkafka's pre-fetch queue filling further when the worker falls behind on a loaded machine, up to
#: the batch it measured) shows in one.
SLICE_NO_GROWTH = 3 * 1024 * 1024


def _consumer(settings: Settings, spark: Any, view: str, client: redis.Redis) -> ViewConsumer:
    return ViewConsumer(settings, view, spark=spark, client=client, max_epochs_per_trigger=20,
                        trigger_interval="100 milliseconds")


def test_cache_serves_exactly_the_rows_kafka_gives(settings: Settings, redis_client: redis.Redis) -> None:
    """Every partition's range read through the cache equals the same range read from Kafka, and came
    from the worker's memory."""
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1", client=redis_client)
    with cache_worker(settings, "t1", partitions=settings.partitions) as worker:
        with writing(table):
            until(lambda: worker.upstream("t1")["epochs_cached"] >= 10, 30, "10 cached epochs")
        last = table.flush()
        until(lambda: (worker.upstream("t1")["tail"] or 0) >= last, 10, "the worker to align the last epoch")
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

    with cache_worker(settings, "t1", partitions=settings.partitions) as worker, writing(table):
        until(lambda: lag() >= 5, 30, "the lag to reach 5")
        until(lambda: worker.upstream("t1")["paused"], 10, "the worker to pause t1")
        stalled_at = store.mce("t1") or 0
        for _ in range(30):  # 1.5 s: ~15 barrier intervals with no new epoch
            assert lag() <= 5
            time.sleep(0.05)
        assert store.mce("t1") == stalled_at, "the writer opened an epoch past max_epoch_lag"
        consumer = _consumer(settings, spark, "mv1", redis_client)
        consumer.start()
        try:
            until(lambda: lag() < 5 and (store.mce("t1") or 0) > stalled_at, 60, "the writer to resume")
            resumed_at = store.mce("t1") or 0
            until(lambda: lag() <= 5 and (store.mce("t1") or 0) > resumed_at + 5, 60, "the writer to keep going")
        finally:
            consumer.stop()
    table.close()
    assert max(lags) <= 5, max(lags)



def _wait_for_mces(store: ViewStore, views: list[str], epoch: int, timeout: float = 120.0) -> None:
    until(lambda: all((store.mce(v) or 0) >= epoch for v in views), timeout, f"{views} to reach {epoch}")


def test_fan_out_three_views_share_one_fetch_stream(settings: Settings, redis_client: redis.Redis,
                                                    spark: Any, report: Callable[[str], None]) -> None:
    """Three views on one upstream: the worker fetches each upstream record once (not three times),
    serves the views' reads from memory, and every view equals its oracle at every epoch."""
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    views = {"mv1": "SELECT * FROM t1 WHERE deleted = false", "mv2": "SELECT sum(v1) AS s FROM t1",
             "mv3": "SELECT deleted, count(v1) AS c FROM t1 GROUP BY deleted"}
    for name, sql in views.items():
        create_view(settings, name, sql, client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    with cache_worker(settings, "t1", partitions=settings.partitions) as worker:
        consumers = [_consumer(settings, spark, v, redis_client) for v in views]
        for consumer in consumers:
            consumer.start()
        try:
            with writing(table):
                time.sleep(4)  # the workload runs while the consumers follow
            table.close()  # no more (empty) epochs: the topic's record count is final
            last = store.mce("t1") or 0
            _wait_for_mces(store, list(views), last)
        finally:
            for consumer in consumers:
                consumer.stop()
        logs = read_topic(settings.bootstrap_servers, settings.changelog_topic("t1"), settings.partitions, idle=1.5)
        in_topic = sum(len(log.order) for log in logs.values())
        until(lambda: worker.upstream("t1")["records_fetched"] >= in_topic, 60, "the worker to fetch every record")
        stats = worker.upstream("t1")
    assert stats["records_fetched"] == in_topic, "one fetch stream: each record fetched once"
    from_cache, from_kafka = CacheRegistry(redis_client, settings.topic_prefix).reads("t1")
    share = from_cache / (from_cache + from_kafka)
    report(f"fan-out: {in_topic} records in t1, {stats['records_fetched']} fetched by the worker for "
          f"{len(views)} views; {share:.1%} of {from_cache + from_kafka} partition-epochs read from the cache")
    assert share >= 0.9
    assert check_oracle(settings, redis_client, ["t1", *views]) > 0


def test_sigkilled_worker_consumers_fall_back_and_the_restarted_worker_refills(
        settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    consumer = _consumer(settings, spark, "mv1", redis_client)
    first = CacheWorkerProcess(settings, "t1")
    second: CacheWorkerProcess | None = None
    try:
        first.wait_ready("t1", settings.partitions)
        consumer.start()
        with writing(table):
            until(lambda: first.upstream("t1")["served_epochs"] > 0, 60, "reads from the cache")
            first.kill()
            killed_at = store.mce("t1") or 0
            # With the worker dead (its Redis claims still name it for a few seconds) mv1 keeps up.
            _wait_for_mces(store, ["mv1"], killed_at + 1, timeout=60)
            second = CacheWorkerProcess(settings, "t1")
            second.wait_ready("t1", settings.partitions)
            until(lambda: second is not None and second.upstream("t1")["served_epochs"] > 0, 60,
                   "the restarted worker to serve")
        table.close()
        last = store.mce("t1") or 0
        _wait_for_mces(store, ["mv1"], last)
    finally:
        consumer.stop()
        first.stop()
        if second is not None:
            second.stop()
    assert check_oracle(settings, redis_client, ["t1", "mv1"]) > 0
    assert_barriers_once(settings, redis_client, "mv1", last)



def test_worker_rides_out_a_redis_restart(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    """redis-server SIGKILLed and restarted from its AOF under a busy table: the cache worker waits for it
    (one line when Redis goes, one when it is back), never exits, keeps its claims on the partitions and
    goes on aligning the table's new epochs (issue 21, item 2, for the cache worker)."""
    aof = AofRedis(tmp_path / "redis")
    aof.start()
    settings = make_settings(redis_url=aof.url)
    client = connect_redis(settings)
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=client)
    store = ViewStore(client, settings.topic_prefix)
    worker = CacheWorkerProcess(settings, "t1")
    try:
        worker.wait_ready("t1", settings.partitions)
        with writing(table):
            until(lambda: (store.mce("t1") or 0) >= 3, 60, "the table's first epochs")
            aof.kill()
            aof.restart_after(DOWN_S).join()
            after = (store.mce("t1") or 0) + 3
            until(lambda: (store.mce("t1") or 0) >= after, 60, "the table's epochs after the restart")
            until(lambda: (worker.upstream("t1")["tail"] or 0) >= after, 60,
                   f"the worker to align epoch {after} of t1")
        worker.wait_ready("t1", settings.partitions)  # still claims every partition in Redis
        assert worker.process.poll() is None
    finally:
        table.close()
        worker.stop()
        aof.stop()
    output = worker.log_path.read_text()
    assert f"Redis at 127.0.0.1:{aof.port} unreachable" in output and "back after" in output, output
    assert "Traceback" not in output, output

def test_lagged_consumer_replays_from_kafka_then_rejoins_the_cache(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any) -> None:
    """A consumer stopped until the cache evicted its next epochs replays them from Kafka, then reads
    the cache again: the oracle holds at every epoch and each barrier is in mv1's changelog once."""
    settings = make_settings(cache_max_epochs=5)
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    with cache_worker(settings, "t1", partitions=settings.partitions) as worker, writing(table):
        consumer = _consumer(settings, spark, "mv1", redis_client)
        consumer.start()
        until(lambda: worker.upstream("t1")["served_epochs"] > 0, 60, "reads from the cache")
        consumer.stop()
        stopped_at = store.mce("mv1") or 0
        until(lambda: (worker.upstream("t1")["floor"] or 0) > stopped_at, 30, "the cache to evict mv1's next epochs")
        before = worker.upstream("t1")
        consumer = _consumer(settings, spark, "mv1", redis_client)
        consumer.start()
        try:
            until(lambda: worker.upstream("t1")["evicted_replies"] > before["evicted_replies"], 60, "a replay")
            until(lambda: worker.upstream("t1")["served_epochs"] > before["served_epochs"], 60, "rejoining the cache")
        finally:
            consumer.stop()
    table.close()
    last = store.mce("t1") or 0
    consumer = _consumer(settings, spark, "mv1", redis_client)
    assert consumer.catch_up() == last  # the last epochs, from Kafka (no worker now)
    consumer.stop()
    assert check_oracle(settings, redis_client, ["t1", "mv1"]) > 0
    assert_barriers_once(settings, redis_client, "mv1", last)


def test_worker_memory_stays_within_the_cache_bound_plus_one_batch(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, report: Callable[[str], None]) -> None:
    """I4 at a small scale: a 2 MiB cache, the upstream writing as fast as it can, no consumer. Once the
    worker is warm (10000 rows went through, more than the bound), its peak RSS (``VmHWM``, its own)
    grows by at most the bound plus the batch it measured (and :data:`NOISE`) above its idle RSS while
    30000 rows go through, and still while three times as many follow; of those three slices of 30000
    rows, one at least adds no more than :data:`SLICE_NO_GROWTH`: its memory does not grow with the data.
    The cache itself never exceeds the bound."""
    bound = 2 * 1024 * 1024
    settings = make_settings(barrier_interval_ms=100, cache_max_bytes=bound)
    table = Table.create(settings, "t1", {**COLUMNS, "pad": "string"}, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1", client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    pad = "x" * 200
    written = 0

    def write(rows: int) -> dict[str, Any]:
        """``rows`` more rows (~1000 per epoch); the worker's stats once it has aligned all of them."""
        nonlocal written
        target = written + rows
        while written < target:
            table.upsert([{"id": written + j, "v1": j, "deleted": False, "pad": pad} for j in range(500)])
            written += 500
            time.sleep(0.05)
        last = table.flush()  # the table keeps committing (empty) epochs after it
        until(lambda: (worker.upstream("t1")["tail"] or 0) >= last, 120, "the worker to align every epoch")
        stats: dict[str, Any] = worker.stats()
        return stats

    with cache_worker(settings, "t1", partitions=settings.partitions) as worker:
        start_kib = worker.stats()["peak_rss_kib"]
        write(10_000)  # the warm-up: more than the bound, so the cache has filled and evicted
        time.sleep(0.5)
        idle = worker.stats()
        first = write(30_000)  # ~8 MB of rows, four times the bound
        slices = [write(30_000) for _ in range(3)]
    table.close()
    then = slices[-1]
    warm_up = (idle["peak_rss_kib"] - start_kib) * 1024
    growth = (first["peak_rss_kib"] - idle["rss_kib"]) * 1024
    total = (then["peak_rss_kib"] - idle["rss_kib"]) * 1024
    gains = [(b["peak_rss_kib"] - a["peak_rss_kib"]) * 1024 for a, b in pairwise([first, *slices])]
    batch = first["batch_bytes"]
    summary = (f"I4: idle RSS {idle['rss_kib'] / 1024:.0f} MiB after a warm-up of {warm_up / 2**20:.1f} MiB; "
               f"peak growth {growth / 2**20:.1f} MiB after 30000 rows (bound {bound / 2**20:.0f} MiB + batch "
               f"{batch / 2**20:.1f} MiB measured by the worker: fetch, "
               f"{first['upstreams']['t1']['peak_held_bytes'] / 2**20:.1f} MiB held while aligning, 2 x largest "
               f"epoch {first['largest_epoch_bytes'] / 2**20:.2f} MiB), then "
               f"{' + '.join(f'{g / 2**20:.1f}' for g in gains)} MiB more over 3 x 30000 more "
               f"({then['evicted_epochs']} epochs evicted; "
               f"{store.index.count_after('t1', None)} epochs)")
    report(summary)
    assert then["evicted_epochs"] > 0, "the bound was reached"
    assert first["cache_bytes"] <= bound and then["cache_bytes"] <= bound
    assert growth <= bound + batch + NOISE, summary
    assert total <= bound + batch + NOISE, summary
    assert min(gains) <= SLICE_NO_GROWTH, f"the worker's memory grows with the data it caches: {summary}"


def test_two_workers_share_the_partitions_through_faust_group_assignment(
        settings: Settings, redis_client: redis.Redis) -> None:
    """Two workers of one app split the upstream's partitions between them (Faust's assignor), each claims
    its own in Redis, and a reader of every partition finds a worker that serves it."""
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    create_view(settings, "mv1", "SELECT * FROM t1", client=redis_client)
    workers = [CacheWorkerProcess(settings, "t1"), CacheWorkerProcess(settings, "t1")]
    registry = CacheRegistry(redis_client, settings.topic_prefix)
    try:
        with writing(table):
            def split() -> bool:
                """The workers hold disjoint partitions, all of them between them, each claimed in Redis by
                its holder."""
                try:
                    held = {w.url: set(w.upstream("t1")["partitions"]) for w in workers}
                except OSError:  # a web server not up yet
                    return False
                first, second = held.values()
                every = range(settings.partitions)
                return (bool(first) and bool(second) and not first & second and first | second == set(every)
                        and all(p in held.get(registry.worker_for("t1", p) or "", ()) for p in every))

            until(split, 90, "the two workers to split the partitions and claim them")
            until(lambda: all(w.upstream("t1")["tail"] is not None for w in workers), 30, "both to align")
        last = table.flush()
        until(lambda: all((w.upstream("t1")["tail"] or 0) >= last for w in workers), 30, "the last epoch")
        # Faust's group may rebalance again under load (a missed heartbeat) while the table writes; the
        # reads below are of a settled split (a worker that lost its partitions would serve nothing).
        until(split, 90, "the split to settle")
        planner = _Planner(settings, CatalogStore(settings, redis_client).get("t1"))
        floor = max(w.upstream("t1")["floor"] for w in workers)
        for part in planner.plan(floor, last):
            cached = pa.Table.from_batches(list(read_partition_range(part))).to_pylist()
            kafka = pa.Table.from_batches(list(read_partition_from_kafka(part))).to_pylist()
            def per_epoch(rows: list[dict[str, Any]]) -> dict[int, int]:
                counts: dict[int, int] = {}
                for row in rows:
                    counts[row["_epoch"]] = counts.get(row["_epoch"], 0) + 1
                return counts

            assert per_epoch(cached) == per_epoch(kafka), f"partition {part.partition}: rows per epoch differ"
            differ = [(c, k) for c, k in zip(cached, kafka, strict=False) if c != k][:2]
            assert (len(cached), differ) == (len(kafka), []), f"partition {part.partition}"
        assert all(w.upstream("t1")["served_epochs"] > 0 for w in workers)
    finally:
        for worker in workers:
            worker.stop()
    table.close()
