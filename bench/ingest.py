"""Ingesting a topic into a source table: mvlog's ingester against a plain consume + decode loop.

Both sides read the same records (upsert-json: key ``{"id": n}``, value a ~110-byte JSON order line,
distinct keys: a first load) from topics written beforehand, on a local stack (Apache Kafka +
redis-server) that this script starts on free loopback ports in a temporary folder and stops at the end.

* **baseline** - what a user would write to just read the topic: a confluent-kafka ``Consumer``
  assigned to every partition from the start, ``consume(5000)`` batches, ``json.loads`` of each key and
  value. No table, no transactions, no Redis. Timed from the first ``consume`` to the last record.
* **mvlog** - ``SourceIngester.run`` (what ``mvlog run-source`` runs): decode and type every message,
  one epoch every barrier interval (default 1 s) with the consumed offsets committed in the epoch's
  Kafka transaction, then the rows and the MCE in Redis. Timed from ``run`` until the epoch holding the
  last record is committed to Kafka and Redis.

First both sides ingest ``--warmup`` records once, untimed: a broker just started compiles (JIT) its
transactional produce path during the first epochs, which cost the first timed mvlog run 0.5-1.5 s of the
broker's CPU (its C1/C2 compiler threads) that a broker in service has long paid. Each side then runs
``--repeat`` times, interleaved, each on a new topic (and a new table); the fastest of
each side counts. Then the **epoch latency** at a steady rate: a producer writes ``--rate`` records/s
for ``--steady-s`` seconds while an ingester runs; for each record, the time from its timestamp (set
by the producer) to the commit of the epoch that holds it; p50 and p99.

Run with the venv's Python from the repository root::

    .venv/bin/python bench/ingest.py [--records 200000] [--partitions 4] [--repeat 2] [--warmup 20000]
                                     [--rate 5000] [--steady-s 10] [--profile FILE]

The last line is the ratio mvlog / baseline of records per second (the target is at least 0.7x).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pstats
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from mvlog.config import Settings
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.services.sources.declare import create_source_table
from mvlog.services.sources.ingester import SourceIngester

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Throughput, machine_info, peak_rss_mib, sample_row, temporary_stack

COLUMNS = {"id": "int", "cust": "string", "sku": "string", "qty": "int", "price": "float", "paid": "boolean"}


def produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> int:
    """Write the records (keyed, so each key has one partition); returns the bytes written."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    wire = 0
    for key, value in records:
        wire += len(key) + len(value)
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120) != 0:
        raise SystemExit(f"{topic}: records left undelivered")
    return wire


def encoded(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(json.dumps({"id": i}).encode(), json.dumps(sample_row(i)).encode()) for i in range(start, start + count)]


def run_baseline(bootstrap: str, topic: str, partitions: int, count: int, wire: int) -> Throughput:
    """The plain loop: consume batches and json.loads every key and value."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}.plain", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    checksum = 0
    start = time.perf_counter()
    while seen < count:
        for message in consumer.consume(5000, 1.0):
            if message.error() is not None:
                raise SystemExit(f"baseline: {message.error()}")
            key, row = json.loads(message.key() or b"null"), json.loads(message.value() or b"null")
            checksum += key["id"] + row["qty"]
            seen += 1
    seconds = time.perf_counter() - start
    consumer.close()
    return Throughput("baseline", seen, seconds, wire)


class TimedIngester(SourceIngester):
    """Notes when each epoch committed and how far it had read (for the timings)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.commits: list[tuple[float, int, dict[int, int]]] = []  # (wall time, messages so far, positions)

    def epoch_committed(self, epoch: int, positions: Mapping[int, int], messages: int) -> None:
        self.commits.append((time.time(), messages, dict(positions)))


def run_mvlog(settings: Settings, client: redis.Redis, table: str, topic: str, count: int, wire: int,
              profile: cProfile.Profile | None) -> Throughput:
    create_source_table(settings, table, COLUMNS, ["id"], topic, "upsert-json", client=client)
    ingester = TimedIngester(settings, table, client)
    with ingester:
        start_wall, start = time.time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        progress = ingester.run(until_caught_up=True)
        if profile is not None:
            profile.disable()
        ended = time.perf_counter() - start
    done = next(t for t, messages, _ in ingester.commits if messages >= count)
    rows = client.hlen(f"{settings.topic_prefix}:{{{table}}}:rows")
    if progress.messages != count or rows != count:
        raise SystemExit(f"mvlog: {progress.messages} messages read, {rows} rows in Redis, expected {count}")
    detail = (f"\n            {progress.epochs} epoch(s) (barrier interval {settings.barrier_interval_ms} ms); "
              f"run() returned {ended:.2f} s after it started (it waits one more interval to see the end)")
    return Throughput("mvlog", count, done - start_wall, wire, detail)


def steady_latency(settings: Settings, client: redis.Redis, partitions: int, rate: int, seconds: float
                   ) -> tuple[float, float, int, int]:
    """p50 and p99 (s) of record timestamp -> commit of its epoch, at ``rate`` records/s; records, epochs."""
    topic = "bench.steady"
    ensure_topic(settings, topic, partitions)
    create_source_table(settings, "steady", COLUMNS, ["id"], topic, "upsert-json", client=client)
    stamps: dict[tuple[int, int], int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            stamps[(msg.partition(), msg.offset())] = msg.timestamp()[1]

    stop = threading.Event()
    ingester = TimedIngester(settings, "steady", client)
    with ingester:
        runner = threading.Thread(target=ingester.run, args=(stop,), daemon=True)
        runner.start()
        producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5})
        batch = max(1, rate // 100)  # 100 bursts per second
        sent, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            for key, value in encoded(batch, sent):
                producer.produce(topic, value, key, on_delivery=delivered)
            sent += batch
            producer.poll(0)
            time.sleep(max(0.0, started + sent / rate - time.monotonic()))
        producer.flush(60)
        deadline = time.monotonic() + 60
        while (not ingester.commits or ingester.commits[-1][1] < sent) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        runner.join(60)
    latencies = []
    commits = ingester.commits
    for (partition, offset), stamp in stamps.items():
        committed = next((t for t, _, positions in commits if positions.get(partition, 0) > offset), None)
        if committed is None:
            raise SystemExit(f"steady: record {partition}@{offset} never committed")
        latencies.append(committed - stamp / 1000)
    latencies.sort()
    return (latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            len(latencies), len(commits))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run (default 200000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topics (default 4)")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved runs of each side (default 2)")
    parser.add_argument("--warmup", type=int, default=20_000,
                        help="records each side ingests once, untimed, before the runs (default 20000; 0: none)")
    parser.add_argument("--rate", type=int, default=5000, help="records/s of the latency phase (default 5000)")
    parser.add_argument("--steady-s", type=float, default=10.0, help="length of the latency phase (default 10)")
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the mvlog runs here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    profile = cProfile.Profile() if args.profile else None
    with temporary_stack("mvlog-bench-") as (stack, _):
        settings = stack.settings(topic_prefix="bench", partitions=args.partitions)
        client = redis.Redis.from_url(settings.redis_url)
        records = encoded(args.records)
        if args.warmup > 0:  # untimed: the broker's JIT warms up on both paths (see the module doc)
            warm = encoded(args.warmup)
            for topic in ("bench.warmup-plain", "bench.warmup-source"):
                ensure_topic(settings, topic, args.partitions)
                produce(stack.bootstrap_servers, topic, warm)
            run_baseline(stack.bootstrap_servers, "bench.warmup-plain", args.partitions, len(warm), 0)
            run_mvlog(settings, client, "warmup", "bench.warmup-source", len(warm), 0, None)
        baselines, runs = [], []
        for run in range(1, args.repeat + 1):
            plain_topic, table_topic = f"bench.plain-{run}", f"bench.source-{run}"
            for topic in (plain_topic, table_topic):
                ensure_topic(settings, topic, args.partitions)
            wire = produce(stack.bootstrap_servers, plain_topic, records)
            produce(stack.bootstrap_servers, table_topic, records)
            baselines.append(run_baseline(stack.bootstrap_servers, plain_topic, args.partitions, len(records),
                                          wire))
            runs.append(run_mvlog(settings, client, f"orders-{run}", table_topic, len(records), wire, profile))
        load = os.getloadavg()
        p50, p99, steady_records, steady_epochs = steady_latency(settings, client, args.partitions, args.rate,
                                                                 args.steady_s)
        client.close()

    print(f"ingest benchmark: {args.records:,} records (upsert-json, ~{wire // args.records} bytes key + value), "
          f"{args.partitions} partition(s), Apache Kafka + redis-server on loopback")
    print("  mvlog: SourceIngester.run (mvlog run-source): decode + type, 1 epoch per barrier interval, offsets in "
          "the epoch's transaction, rows + MCE in Redis; baseline: confluent-kafka consume(5000) + json.loads")
    print(machine_info())
    warmed = f"; {args.warmup:,} records ingested by each side untimed first (broker JIT warm-up)" \
        if args.warmup else ""
    print(f"  load average (1, 5, 15 min) at the end of the runs: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}{warmed}")
    baseline = min(baselines, key=lambda r: r.seconds)
    ours = min(runs, key=lambda r: r.seconds)
    if args.repeat > 1:
        print(f"  best of {args.repeat} interleaved runs; all runs (s): baseline "
              f"{' '.join(f'{r.seconds:.2f}' for r in baselines)}, mvlog {' '.join(f'{r.seconds:.2f}' for r in runs)}")
    print(baseline.line())
    print(ours.line())
    print(f"  epoch latency at {args.rate:,} records/s for {args.steady_s:g} s (record timestamp -> its epoch "
          f"committed): p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms ({steady_records:,} records, "
          f"{steady_epochs} epochs, barrier interval {settings.barrier_interval_ms} ms)")
    print(f"  peak RSS of the process: {peak_rss_mib():.0f} MiB")
    if profile is not None:
        profile.dump_stats(args.profile)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    print(f"ratio mvlog/baseline (records/s): {ours.rate / baseline.rate:.2f}x (target >= 0.7x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
