"""The Faust log cache: hit share, replay rate, upstream isolation, worker memory and the rate it keeps up with.

Starts its own local stack (Apache Kafka + redis-server on free loopback ports) and one log-cache worker
(``mvlog cache-worker``, a child process) with a ``--cache-mib`` bound (default 64 MiB), then:

* **hit share**: a ``ViewConsumer`` of ``mv1 = SELECT * FROM t1 WHERE deleted = false`` follows ``t1``
  while ``t1`` commits an epoch every 200 ms for ``--follow-s`` seconds; the share of the partition-epochs
  its Spark tasks read from the cache rather than Kafka (the readers count both in Redis). Target >= 99%.
* **replay rate**: every epoch of ``t2`` (``--replay-changes`` changes committed beforehand) read from
  Kafka the way a lagging consumer replays evicted epochs (``read_partition_from_kafka`` of each
  partition: seek by the epoch index, decode, align to barriers, Arrow rows), against a raw
  confluent-kafka read of the same records (``assign()`` from offset 0 to the last barrier, no
  decoding); ``--repeat`` interleaved reads of each, the best of each counts. Target >= 0.5x.
* **isolation**: median time of ``Table.flush()`` (one epoch of 200 changes committed to Kafka and
  Redis) on ``t3``, whose downstream ``mv3`` is stopped and lags ever further, against ``t4`` without
  downstream; interleaved, same run. Target <= 1.1x.
* **memory**: the worker's peak RSS above its idle RSS while ``t5`` receives ``--fill-rows`` rows of
  ~250 bytes and nobody consumes them: first in epochs of ``--fill-epoch-rows`` rows (the cache fills
  and evicts), then as fast as the writer goes (epochs over ``cache_max_epoch_bytes``, skipped). The
  idle RSS is the worker's peak after the phases above (its data path is warm). Printed with the
  "one batch" the worker measured (``batch_bytes`` in its /stats/: the records in flight, one decoded
  consume batch, the IPC messages it held while aligning, its largest epoch) and the I4 check: peak
  growth <= cache bound + batch.

* **rate**: the highest upstream rate (changes/s, epochs of 1 s) at which three followers of one
  upstream read at least 99 % of their partition-epochs from the cache, against the table writer's own
  top publish rate measured in the same run. The phase has its own topic prefix and worker (the others'
  is stopped), with a ``--rate-cache-mib`` cache (default 384 MiB) and an epoch budget of a quarter of it
  (an epoch of 1 s at these rates is tens of MiB, over the default 8 MiB budget). First the writer's top
  rate: ``--rate-probe-rows`` upserts of 1000 rows flat out (the table's loop commits an epoch every 1 s)
  until ``close()`` committed the last epoch. Then steps at rising fractions of it (``--rate-steps``),
  ``--rate-s`` seconds each: the bench process upserts at the step's pace while three follower processes
  read each committed epoch as a view's Spark tasks do (``read_partition_range`` of each partition:
  the cache, else Kafka); a step passes if >= 99 % of the partition-epochs the followers read in it came
  from the cache; the ladder stops at the first that does not. Printed per step: the rate written, the
  hit share, the worker's CPU (share of one core) and its peak RSS during the step (sampled every 0.2 s).
  The followers are the data source's read path without Spark: three Spark view consumers on this
  machine could not follow these rates themselves, which would measure Spark, not the cache.

    python bench/cache.py [--cache-mib 64] [--follow-s 20] [--replay-changes 60000] [--repeat 3]
                           [--fill-rows 300000] [--rate-s 8] [--rate-cache-mib 384] [--only rate]

The last line holds the ratios, the rate ratio last (target >= 0.5x).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import redis
from _common import REPO_ROOT, fmt_rate, machine_info, temporary_stack
from _follower import position_key
from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(REPO_ROOT))

from mvlog.config import Settings
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.spark.spark_source import _Planner, read_partition_from_kafka
from mvlog.services.tables.writer import Table
from tests.integration.processes.cache_worker import CacheWorkerProcess

COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean", "pad": "string"}
PAD = "x" * 200


def rows(start: int, count: int, keys: int) -> list[dict[str, object]]:
    return [{"id": (start + i) % keys, "v1": start + i, "deleted": (start + i) % 7 == 0, "pad": PAD}
            for i in range(count)]


def wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def hit_share(settings: Settings, client: redis.Redis, follow_s: float) -> tuple[float, int]:
    """Share of mv1's partition-epochs read from the cache while it follows t1 (after catching up)."""
    from mvlog.services.pipeline.view_consumer import ViewConsumer
    from mvlog.services.spark.session import spark_session  # Spark: imported by the phases that use it

    table = Table.open(settings, "t1", client=client)
    consumer = ViewConsumer(settings, "mv1", client=client, spark=spark_session(settings),
                            trigger_interval="100 milliseconds")
    store = ViewStore(client, settings.topic_prefix)
    consumer.start()
    consumer.wait_for_epoch(store.mce("t1") or 0, timeout=120)
    registry = CacheRegistry(client, settings.topic_prefix)
    before = registry.reads("t1")
    written, end = 0, time.monotonic() + follow_s
    while time.monotonic() < end:
        table.upsert(rows(written, 20, 20_000))  # 400 changes/s: well within a worker's pace
        written += 20
        time.sleep(0.05)
    table.close()
    wait(lambda: (store.mce("mv1") or 0) >= (store.mce("t1") or 0), 120, "mv1 to catch up")
    consumer.stop()
    after = registry.reads("t1")
    cache, kafka = after[0] - before[0], after[1] - before[1]
    return cache / max(1, cache + kafka), cache + kafka


def replay_rate(settings: Settings, client: redis.Redis, changes: int, repeat: int) -> tuple[float, float, int]:
    """Best records/s of ``repeat`` interleaved reads of every epoch of t2: mvlog's Kafka path, then raw."""
    table = Table.open(settings, "t2", client=client, auto_commit=False)
    for start in range(0, changes, 5000):
        table.upsert(rows(start, 5000, changes))
        table.flush()
    table.close()
    planner = _Planner(settings, CatalogStore(settings, client).get("t2"))
    last = planner.latest_epoch()
    parts = planner.plan(0, last)
    records = sum(e.records + 1 for p in range(settings.partitions) for e in planner.index.between("t2", p, 0, last))
    ends = {part.partition: part.barriers[-1][1] for part in parts}
    mvlog_s, raw_s = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        read = sum(batch.num_rows for part in parts for batch in read_partition_from_kafka(part))
        mvlog_s.append(time.perf_counter() - started)
        assert read >= changes
        raw_s.append(raw_read(settings, ends))
    return records / min(mvlog_s), records / min(raw_s), records


def raw_read(settings: Settings, ends: dict[int, int]) -> float:
    """Seconds for a new plain read_committed consumer to read t2's partitions up to their last barriers."""
    consumer = Consumer({**settings.kafka_client_config(), "group.id": "bench-raw", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(settings.changelog_topic("t2"), p, 0) for p in ends])
    started, done = time.perf_counter(), set[int]()
    while len(done) < len(ends):
        for message in consumer.consume(2000, timeout=0.05):
            partition, offset = message.partition(), message.offset()
            if partition is not None and offset is not None and offset >= ends[partition]:
                done.add(partition)
    seconds = time.perf_counter() - started
    consumer.close()
    return seconds


def flush_latency(settings: Settings, client: redis.Redis, epochs: int) -> tuple[float, float]:
    stalled = Table.open(settings, "t3", client=client, auto_commit=False)
    alone = Table.open(settings, "t4", client=client, auto_commit=False)
    times: dict[str, list[float]] = {"t3": [], "t4": []}
    for i in range(epochs):
        for table in (stalled, alone) if i % 2 else (alone, stalled):
            table.upsert(rows(i * 200, 200, 10_000))
            started = time.perf_counter()
            table.flush()
            times[table.entry.name].append(time.perf_counter() - started)
    stalled.close()
    alone.close()
    return statistics.median(times["t3"]), statistics.median(times["t4"])


def memory(settings: Settings, client: redis.Redis, worker: CacheWorkerProcess, fill_rows: int,
           epoch_rows: int | None) -> float:
    """The worker's peak RSS (MiB) once it has aligned ``fill_rows`` rows of t5, committed in epochs of
    ``epoch_rows`` (None: whatever the writer's barrier interval gathers while it writes flat out)."""
    table = Table.open(settings, "t5", client=client, auto_commit=epoch_rows is None)
    for start in range(0, fill_rows, 2000):
        table.upsert(rows(start, 2000, fill_rows))
        if epoch_rows is not None and (start + 2000) % epoch_rows == 0:
            table.flush()
    table.close()
    last = ViewStore(client, settings.topic_prefix).mce("t5")
    wait(lambda: worker.upstream("t5")["tail"] == last, 900, "the worker to align every epoch of t5")
    peak_mib: float = worker.stats()["peak_rss_kib"] / 1024
    return peak_mib


# The rate phase's key space, written in order: larger than an epoch's changes at any rate measured here,
# so the writer never folds two upserts of a key into one change (rates count the changelog's change
# events, from the epoch index); inserts first, then updates (before and after images).
RATE_KEYS = 400_000


def changes_between(settings: Settings, client: redis.Redis, name: str, after: int, upto: int) -> int:
    """Change events in the changelog of ``name`` in the committed epochs ``(after, upto]`` (epoch index)."""
    planner = _Planner(settings, CatalogStore(settings, client).get(name))
    return sum(records for _, records in planner.epoch_records(after, upto))
HIT_TARGET = 0.99


def top_publish_rate(settings: Settings, client: redis.Redis, name: str, rows_n: int) -> float:
    """Change events/s of the table writer flat out: upserts of 1000 rows, an epoch every barrier interval,
    from the first upsert until ``close()`` committed the last epoch."""
    store = ViewStore(client, settings.topic_prefix)
    before = store.mce(name) or 0
    table = Table.open(settings, name, client=client)
    started = time.perf_counter()
    for start in range(0, rows_n, 1000):
        table.upsert(rows(start, 1000, RATE_KEYS))
    table.close()
    seconds = time.perf_counter() - started
    return changes_between(settings, client, name, before, store.mce(name) or 0) / seconds


def rate_step(settings: Settings, client: redis.Redis, worker: CacheWorkerProcess, upstream: str, rate: float,
              seconds: float, first_row: int) -> dict[str, float]:
    """Write ``upstream`` at ``rate`` changes/s for ``seconds`` while the followers read it; their hit
    share in the step, the rate written, the worker's CPU share and peak RSS."""
    registry = CacheRegistry(client, settings.topic_prefix)
    store = ViewStore(client, settings.topic_prefix)
    before = registry.reads(upstream)
    replies_before = worker.upstream(upstream)
    process = psutil.Process(worker.pid)
    cpu_before = sum(process.cpu_times()[:2])
    mce_before = store.mce(upstream) or 0
    table = Table.open(settings, upstream, client=client)
    started = time.monotonic()
    written, peak_rss, next_sample = 0, 0, 0.0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(rate * elapsed) - written
        if due > 0:
            count = min(due, 5000)
            table.upsert(rows(first_row + written, count, RATE_KEYS))
            written += count
        else:
            time.sleep(0.005)
        if elapsed >= next_sample:
            peak_rss = max(peak_rss, process.memory_info().rss)
            next_sample = elapsed + 0.2
    table.close()
    wall = time.monotonic() - started
    last = store.mce(upstream) or 0
    wait(lambda: all(int(client.get(position_key(settings, i)) or 0) >= last for i in range(3)), 120, "the followers")
    cpu = sum(process.cpu_times()[:2]) - cpu_before
    after = registry.reads(upstream)
    cache, kafka = after[0] - before[0], after[1] - before[1]
    replies = worker.upstream(upstream)
    changes = changes_between(settings, client, upstream, mce_before, last)
    return {"rate": changes / wall, "share": cache / max(1, cache + kafka), "reads": cache + kafka,
            "cpu": cpu / (time.monotonic() - started), "rss_mib": peak_rss / 2**20, "written": written,
            **{k: replies[k] - replies_before[k] for k in ("not_yet_replies", "evicted_replies")},
            "errors": len(replies["errors"])}


def rate_phase(base: Settings, client: redis.Redis, args: argparse.Namespace) -> tuple[float, float]:
    """The rate phase (see the module's docstring); returns (highest passing rate, writer's top rate)."""
    cache_bytes = args.rate_cache_mib * 2**20
    settings = base.model_copy(update={"topic_prefix": "rate", "barrier_interval_ms": 1000,
                                       "cache_max_bytes": cache_bytes, "cache_max_epoch_bytes": cache_bytes // 4})
    for name in ("u1", "probe"):
        table = Table.create(settings, name, COLUMNS, ["id"], client=client, auto_commit=False)
        table.flush()
        table.close()
    worker = CacheWorkerProcess(settings, "u1")
    followers: list[subprocess.Popen[bytes]] = []
    best, top, first_row = 0.0, 0.0, 0
    try:
        worker.wait_ready("u1", settings.partitions, timeout=120)
        followers = [subprocess.Popen([sys.executable, str(Path(__file__).parent / "_follower.py"),
                                       settings.model_dump_json(), "u1", str(i)], cwd=REPO_ROOT) for i in range(3)]
        wait(lambda: all(client.get(position_key(settings, i)) is not None for i in range(3)), 120,
             "the followers to start")
        # The writer's own top rate, with the worker and the followers up (idle: they follow u1).
        top = top_publish_rate(settings, client, "probe", args.rate_probe_rows)
        print(f"rate: the table writer's top publish rate {fmt_rate(top)} changes/s ({args.rate_probe_rows} "
              f"upserts of ~250-byte rows, new keys, epochs of 1 s; change events counted in the epoch index)",
              flush=True)
        for fraction in args.rate_steps:
            step = rate_step(settings, client, worker, "u1", fraction * top, args.rate_s, first_row)
            first_row += int(step["written"])
            passed = step["share"] >= HIT_TARGET
            print(f"  at {fmt_rate(step['rate'])} changes/s ({fraction:.2f} x top, {args.rate_s:.0f} s): "
                  f"{step['share']:.2%} of {step['reads']:.0f} partition-epochs read by 3 followers from the "
                  f"cache; worker CPU {step['cpu']:.0%} of a core, RSS peak {step['rss_mib']:.0f} MiB"
                  f" (worker replies: {step['not_yet_replies']:.0f} not yet, {step['evicted_replies']:.0f} evicted; "
                  f"{step['errors']:.0f} errors so far){'' if passed else '; below 99 %: the ladder stops'}",
                  flush=True)
            if not passed:
                break
            best = max(best, step["rate"])
        stats = worker.stats()
        print(f"  worker: peak RSS {stats['peak_rss_kib'] / 1024:.0f} MiB over the phase ({args.rate_cache_mib} MiB "
              f"cache bound, one batch measured {stats['batch_bytes'] / 2**20:.1f} MiB), "
              f"{stats['evicted_epochs']} epochs evicted or skipped", flush=True)
    finally:
        for follower in followers:
            follower.terminate()
            follower.wait(10)
        worker.stop()
    return best, top


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--follow-s", type=float, default=20)
    parser.add_argument("--replay-changes", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved replay reads of each side; the best "
                        "counts (default 3)")
    parser.add_argument("--fill-rows", type=int, default=300_000)
    parser.add_argument("--fill-epoch-rows", type=int, default=6000)
    parser.add_argument("--latency-epochs", type=int, default=40)
    parser.add_argument("--rate-s", type=float, default=8, help="seconds per step of the rate phase")
    parser.add_argument("--rate-cache-mib", type=int, default=384)
    parser.add_argument("--rate-probe-rows", type=int, default=300_000)
    parser.add_argument("--rate-steps", type=lambda text: [float(f) for f in text.split(",")],
                        default=[0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], help="fractions of the top rate, rising")
    parser.add_argument("--only", choices=["rate"], help="run this phase alone")
    args = parser.parse_args(argv)
    print(machine_info(), flush=True)
    with temporary_stack("mvlog-bench-cache-") as (stack, tmp):
        worker: CacheWorkerProcess | None = None
        try:
            settings = stack.settings(topic_prefix="bench", partitions=3, barrier_interval_ms=200,
                                      stack_dir=tmp / "mvlog", cache_max_bytes=args.cache_mib * 2**20)
            client = redis.Redis.from_url(settings.redis_url)
            ratios = ""
            if args.only is None:
                from mvlog.services.view_ddl import create_view

                for name in ("t1", "t2", "t3", "t4", "t5"):
                    table = Table.create(settings, name, COLUMNS, ["id"], client=client, auto_commit=False)
                    table.flush()  # a first (empty) epoch, so the worker has something to align
                    table.close()
                for view, upstream in (("mv1", "t1"), ("mv2", "t2"), ("mv3", "t3"), ("mv5", "t5")):
                    create_view(settings, view, f"SELECT * FROM {upstream} WHERE deleted = false", client=client)
                worker = CacheWorkerProcess(settings, "t1", "t2", "t3", "t5")
                worker.wait_ready("t1", settings.partitions, timeout=120)

                share, reads = hit_share(settings, client, args.follow_s)
                t1 = worker.upstream("t1")
                print(f"hit share: {share:.2%} of {reads} partition-epochs read by mv1's Spark tasks came from the "
                      f"cache (t1 committing every 200 ms for {args.follow_s:.0f} s; worker replies: "
                      f"{t1['not_yet_replies']} not yet, {t1['evicted_replies']} evicted)", flush=True)
                mvlog_rate, raw_rate, records = replay_rate(settings, client, args.replay_changes, args.repeat)
                print(f"replay: {records} records of t2 from Kafka: mvlog {fmt_rate(mvlog_rate)} records/s "
                      f"(seek, decode, align, Arrow rows), raw confluent-kafka {fmt_rate(raw_rate)} records/s "
                      f"(no decoding), best of {args.repeat} interleaved reads each: {mvlog_rate / raw_rate:.2f}x",
                      flush=True)
                stalled_s, alone_s = flush_latency(settings, client, args.latency_epochs)
                lag = ViewStore(client, settings.topic_prefix).index.count_after("t3", None)
                print(f"isolation: median epoch commit (flush of 200 changes) {stalled_s * 1000:.1f} ms on t3 "
                      f"(mv3 stopped, {lag} epochs behind) vs {alone_s * 1000:.1f} ms on t4 (no downstream): "
                      f"{stalled_s / alone_s:.2f}x", flush=True)
                idle_stats = worker.stats()
                idle = idle_stats["peak_rss_kib"] / 1024
                # Epochs the cache keeps first (it fills and evicts), then the writer flat out (epochs too
                # large to cache: the worker counts their changes without holding them). Peak RSS only grows,
                # so the second figure covers both.
                for epoch_rows in (args.fill_epoch_rows, None):
                    peak = memory(settings, client, worker, args.fill_rows, epoch_rows)
                    stats = worker.stats()
                    shape = f"epochs of {epoch_rows} rows" if epoch_rows else "the writer flat out"
                    batch = stats["batch_bytes"] / 2**20
                    t5 = stats["upstreams"]["t5"]
                    print(f"memory ({shape}): worker idle RSS {idle:.0f} MiB, peak {peak:.0f} MiB "
                          f"(+{peak - idle:.0f} MiB) with a {args.cache_mib} MiB cache bound; cache "
                          f"{stats['cache_bytes'] / 2**20:.1f} MiB (Arrow allocated "
                          f"{stats['arrow_allocated_bytes'] / 2**20:.1f} MiB, {stats['arrow_memory_pool']}), "
                          f"{stats['evicted_epochs']} epochs evicted or skipped so far, {args.fill_rows} rows of t5 "
                          f"unconsumed", flush=True)
                    fits = peak - idle <= args.cache_mib + batch
                    print(f"  one batch {batch:.1f} MiB (measured by the worker) = records in flight "
                          f"{stats['fetch_bytes'] / 2**20:.1f} per upstream + decoded consume batch (4 x its Arrow "
                          f"bytes) + IPC messages held while aligning (peak, all upstreams; t5 "
                          f"{t5['peak_held_bytes'] / 2**20:.1f}) + largest epoch "
                          f"{stats['largest_epoch_bytes'] / 2**20:.1f} (put next to a full cache); I4: peak growth "
                          f"{peak - idle:.1f} <= cache bound {args.cache_mib} + batch {batch:.1f} = "
                          f"{args.cache_mib + batch:.1f} MiB: {'yes' if fits else 'NO'}", flush=True)
                ratios = (f"hit share {share:.3f} (>= 0.99), replay {mvlog_rate / raw_rate:.2f}x (>= 0.5), "
                          f"commit latency with a stalled downstream {stalled_s / alone_s:.2f}x (<= 1.1), ")
                worker.stop()  # the rate phase has its own worker
                worker = None
            best, top = rate_phase(settings, client, args)
            print(f"rate: {fmt_rate(best)} changes/s followed from the cache (>= 99 % of partition-epochs), "
                  f"the writer's top {fmt_rate(top)} changes/s", flush=True)
            print(f"ratios: {ratios}cache-followed rate / writer's top rate {best / top:.2f}x (>= 0.5)")
        finally:
            if worker is not None:
                worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
