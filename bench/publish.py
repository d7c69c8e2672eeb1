"""Publishing rows: mvlog's table writer against the minimal hand-written Kafka producer loop.

Both sides publish the same ~60-byte rows (distinct primary keys: a first load) to the same broker, in
the same run, on a local stack (Apache Kafka + redis-server) that this script starts on free loopback
ports in a temporary folder and stops at the end.

* **baseline** - what a user would write without mvlog: encode each row with fastavro (a record schema
  of the row), ``Producer.produce`` it with confluent-kafka (default settings, key = the id), no
  transactions, no Redis, ``flush()`` at the end. Timed from the first row to the end of ``flush()``.
* **mvlog** - ``Table.upsert`` of ``--batch`` rows at a time. With ``--mode loop`` (the default, what a
  user does) the table's background loop commits an epoch every barrier interval (default 1 s) and
  ``close()`` commits the rest; with ``--mode flush`` every batch is committed as its own epoch by
  ``flush()``. An epoch is one Kafka transaction (change events + a barrier per partition) and then one
  atomic Redis update (rows + max committed epoch). Timed from the first ``upsert`` until the last epoch
  is committed to Kafka and to Redis (``close()`` returned).

Run with the venv's Python from the repository root::

    /tmp/venv/bin/python bench/publish.py [--rows 200000] [--batch 1000] [--partitions 4] [--mode loop]
                                          [--repeat 3]

Each side runs ``--repeat`` times, interleaved, each time on a new topic (and a new table); the fastest
run of each side counts, which keeps other load on the machine out of the comparison as far as it can.

The last line is the ratio mvlog / baseline of records per second (the target is at least 0.7x).
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import KafkaError, Producer
from fastavro import parse_schema, schemaless_writer

from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.schemas.codec import encode_change, encode_key
from mvlog.services.tables.writer import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Throughput, machine_info, peak_rss_mib, sample_row, temporary_stack

COLUMNS = {"id": "int", "cust": "string", "sku": "string", "qty": "int", "price": "float", "paid": "boolean"}
ROW_SCHEMA = parse_schema({
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [{"name": "id", "type": "long"}, {"name": "cust", "type": "string"},
               {"name": "sku", "type": "string"}, {"name": "qty", "type": "long"},
               {"name": "price", "type": "double"}, {"name": "paid", "type": "boolean"}],
})


def run_baseline(bootstrap: str, topic: str, rows: Sequence[dict[str, Any]]) -> Throughput:
    """The hand-written loop: fastavro + confluent-kafka, no transactions, flush at the end."""
    errors: list[KafkaError] = []

    def on_error(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    # Only failed deliveries call back, so checking them costs the loop nothing.
    producer = Producer({"bootstrap.servers": bootstrap, "delivery.report.only.error": True,
                         "on_delivery": on_error})
    producer.list_topics(topic, timeout=30)  # connected and the topic's metadata known before the clock
    wire = 0
    start = time.perf_counter()
    for row in rows:
        buffer = io.BytesIO()
        schemaless_writer(buffer, ROW_SCHEMA, row)
        value = buffer.getvalue()
        key = str(row["id"]).encode()
        wire += len(key) + len(value)
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:  # local queue full: wait for deliveries
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(120)
    seconds = time.perf_counter() - start
    if remaining or errors:
        raise SystemExit(f"baseline: {remaining} record(s) undelivered, {len(errors)} error(s): {errors[:3]}")
    return Throughput("baseline", len(rows), seconds, wire)


def run_mvlog(settings: Settings, table_name: str, rows: Sequence[dict[str, Any]], batch: int, mode: str) -> Throughput:
    client = redis.Redis.from_url(settings.redis_url)
    table = Table.create(settings, table_name, COLUMNS, ["id"], client=client, auto_commit=mode == "loop")
    start = time.perf_counter()
    for offset in range(0, len(rows), batch):
        table.upsert(rows[offset:offset + batch])
        if mode == "flush":
            table.flush()
    upserted = time.perf_counter()
    table.close()  # loop mode: stops the loop and commits what is pending (Kafka, then Redis)
    seconds = time.perf_counter() - start

    store = table.store
    count, mce = store.row_count(table_name), store.mce(table_name)
    epochs = client.zcard(store.index.key(table_name, 0))
    client.close()
    if count != len(rows) or mce is None:
        raise SystemExit(f"mvlog: Redis holds {count} rows at MCE {mce}, expected {len(rows)}")
    # Bytes on the wire, recomputed after the clock: each record is the encoded key + a change event.
    wire = 0
    for row in rows:
        key = encode_key(("id",), (row["id"],))
        wire += len(key) + len(encode_change(table_name, mce, 0, Change(Op.CREATE, (row["id"],), None, row), 0))
    detail = (f"\n            {epochs} epoch(s); upsert calls took {upserted - start:.2f} s, "
              f"{'close' if mode == 'loop' else 'the last flush'} then waited {seconds - (upserted - start):.2f} s")
    return Throughput("mvlog", len(rows), seconds, wire, detail)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows to publish (default 200000)")
    parser.add_argument("--batch", type=int, default=1000, help="rows per Table.upsert call (default 1000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of both topics (default 4)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each side, interleaved, each on new topics; the best counts (default 3)")
    parser.add_argument("--mode", choices=("loop", "flush"), default="loop",
                        help="loop: the table's background epochs, default 1 s barrier interval (default); "
                             "flush: Table.flush() after every batch, one epoch per batch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    rows = [sample_row(i) for i in range(args.rows)]
    with temporary_stack("mvlog-bench-") as (stack, _):
        settings = stack.settings(topic_prefix="bench", partitions=args.partitions)
        baselines, runs = [], []
        for run in range(1, args.repeat + 1):
            baseline_topic = f"bench.baseline-{run}"
            ensure_topic(settings, baseline_topic, args.partitions)
            baselines.append(run_baseline(stack.bootstrap_servers, baseline_topic, rows))
            if run == 1:
                rss_baseline = peak_rss_mib()
            runs.append(run_mvlog(settings, f"orders-{run}", rows, args.batch, args.mode))

    how = ("background epoch loop, barrier interval "
           f"{settings.barrier_interval_ms} ms, close() at the end" if args.mode == "loop"
           else "flush() after every batch (one epoch per batch)")
    print(f"publish benchmark: {args.rows:,} rows (~60 bytes), batches of {args.batch:,}, "
          f"{args.partitions} partition(s), Apache Kafka + redis-server on loopback")
    print(f"  mvlog: Table.upsert + {how}; baseline: fastavro + confluent-kafka produce, no transactions, flush")
    print(machine_info())
    baseline = min(baselines, key=lambda r: r.seconds)
    ours = min(runs, key=lambda r: r.seconds)
    if args.repeat > 1:
        print(f"  best of {args.repeat} interleaved runs; all runs (s): baseline "
              f"{' '.join(f'{r.seconds:.2f}' for r in baselines)}, mvlog {' '.join(f'{r.seconds:.2f}' for r in runs)}")
    print(baseline.line())
    print(ours.line())
    print(f"  peak RSS of the process: {rss_baseline:.0f} MiB after the first baseline run, "
          f"{peak_rss_mib():.0f} MiB at the end")
    print(f"ratio mvlog/baseline (records/s): {ours.rate / baseline.rate:.2f}x (target >= 0.7x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
