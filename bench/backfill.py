"""Chunked and snapshot backfill of a view on a large live upstream: throughput, memory and isolation.

A local stack (Apache Kafka + redis-server on free loopback ports, in a temporary folder) and one Spark
session (``local[2]``). Root table ``t1(id PK, k, v1, deleted)`` is loaded with ``--rows`` rows (default
1,000,000) before any clock starts. Then:

* **baseline**: a raw Spark read of the same rows, ``spark.read.format("mvlog")`` over t1's changelog
  (executors read Kafka) counted into Spark, rows/s. This reads and decodes the rows and nothing
  more: the floor of what any backfill costs here.
* **upstream alone**: a separate writer process commits an epoch every barrier interval
  (``--barrier-ms``) with changes at the first rate: epochs/s over ``--window`` seconds.
* **backfill**, once per rate of ``--rates`` (changes/s; default 1000 and 5000): the writer process
  writes inserts, updates and deletes across the whole key range at that rate while a fresh view
  ``SELECT * FROM t1`` created with ``backfill=chunked`` is backfilled by a ``ViewConsumer`` in this
  process, timed from ``start()`` until its lifecycle is ``live``. Printed: rows/s (rows emitted by the
  backfill / seconds) and its ratio to the raw read, the upstream's epochs/s during the backfill and its
  ratio to the upstream alone (target >= 0.9), and the peak RSS of every process (this driver, Spark's
  JVM and Python workers, the writer, Redis, the Kafka broker) sampled every 0.2 s during that backfill.

Bounded memory (I4) shows as peaks that do not grow with the rate or the backfill's length: a chunk
holds at most ``backfill_max_batch_rows`` rows and the stream is never buffered.

**Snapshot backfill** (``--methods`` includes ``snapshot``): a Parquet snapshot of t1 is built (timed),
then a raw Spark read of the same rows, ``spark.read.parquet`` of the snapshot's files into the ``noop``
sink (every column read and decoded, nothing written), rows/s. Then, while the writer process changes
t1 at the first rate, each of ``SELECT * FROM t1`` and ``SELECT k, count(*), sum(v1), min(v1), max(v1),
avg(v1) FROM t1 GROUP BY k`` is created with ``backfill=snapshot`` and loaded by a ``ViewConsumer``:
timed from ``start()`` until the view is live at the snapshot's epoch (Spark SQL computes the view at
E over the snapshot, the driver writes it in batches of ``snapshot_load_batch_rows``), then until it
has replayed the upstream's epochs since. Printed: snapshot rows / load seconds and its ratio to both
raw reads, and the peak RSS of every process during the load, with the driver's RSS before it.

Run from the repository root::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/backfill.py [--rows 1000000] [--rates 1000,5000] \
        [--methods chunked,snapshot]

The last line holds the ratios.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, fmt_rate, machine_info, temporary_stack

from mvlog.config import Settings
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.infra.local_stack import LocalStack
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.snapshot_compaction import build_snapshot
from mvlog.services.spark.session import spark_session
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

TABLE = "t1"
COLUMNS = {"id": "int", "k": "int", "v1": "int", "deleted": "boolean"}


def row(rng: random.Random, key: int) -> dict[str, object]:
    return {"id": key, "k": key % 1000, "v1": rng.randrange(-1000, 1000), "deleted": rng.random() < 0.1}


def writer_main(settings_json: str, rows: int, rate: int) -> None:
    """The upstream's writer process: ``rate`` changes/s across the key range until SIGTERM."""
    settings = Settings.model_validate_json(settings_json)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(rate)
    with Table.open(settings, TABLE) as table:
        tick = 0.05
        per_tick = max(1, int(rate * tick))
        print("ready", flush=True)
        next_at = time.monotonic()
        while not stop.is_set():
            deletes = per_tick // 5
            table.upsert([row(rng, rng.randrange(rows)) for _ in range(per_tick - deletes)])
            table.delete([rng.randrange(rows) for _ in range(deletes)])
            next_at += tick
            stop.wait(max(0.0, next_at - time.monotonic()))


class Writer:
    def __init__(self, settings: Settings, rows: int, rate: int) -> None:
        self.child = subprocess.Popen([sys.executable, __file__, "--writer", settings.model_dump_json(), str(rows),
                                       str(rate)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        assert self.child.stdout is not None
        if self.child.stdout.readline().strip() != "ready":
            raise SystemExit("the writer process did not start")

    def stop(self) -> None:
        self.child.send_signal(signal.SIGTERM)
        self.child.wait(60)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    if "kafka.Kafka" in text:  # the local stack's broker, a JVM too
        return "kafka"
    if "java" in args[0].decode(errors="replace"):
        return "spark-jvm"
    if "pyspark" in text or ("worker" in text and "python" in text):
        return "spark-python-worker"
    if "--writer" in text:
        return "upstream-writer"
    if "redis-server" in text:
        return "redis"
    return Path(args[0].decode(errors="replace")).name


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """Peak resident memory per process kind (summed over processes of a kind) while it runs."""

    def __init__(self, extra_pids: Sequence[int]) -> None:
        self.extra = list(extra_pids)
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            sums: dict[str, int] = {}
            # The stack's processes are this one's children too: each pid counts once.
            for pid in dict.fromkeys([os.getpid(), *_descendants(os.getpid()), *self.extra]):
                name = "driver (this process)" if pid == os.getpid() else _name(pid)
                sums[name] = sums.get(name, 0) + _rss_kib(pid)
            for name, kib in sums.items():
                if not kib:
                    continue  # a process that ended between listing and reading
                self.peaks[name] = max(self.peaks.get(name, 0), kib)


def epochs_per_s(store: ViewStore, seconds: float) -> float:
    before = store.index.count_after(TABLE, None)
    time.sleep(seconds)
    return (store.index.count_after(TABLE, None) - before) / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the upstream (default 1000000)")
    parser.add_argument("--rates", default="1000,5000", help="upstream changes/s during backfills (default 1000,5000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--barrier-ms", type=int, default=200, help="the upstream's barrier interval (default 200)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds to measure the upstream alone")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--methods", default="chunked,snapshot", help="backfills to run (default chunked,snapshot)")
    parser.add_argument("--load-batch", type=int, default=20_000,
                        help="snapshot backfill: rows the driver writes at a time (default 20000)")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    methods = args.methods.split(",")
    if not set(methods) <= {"chunked", "snapshot"}:
        parser.error(f"unknown method in --methods {args.methods}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.WARNING)
    print(machine_info(), flush=True)
    with temporary_stack("mvlog-bench-") as (stack, tmp):
        return run(args, rates, methods, stack, tmp)


def run(args: argparse.Namespace, rates: list[int], methods: list[str], stack: LocalStack, tmp: Path) -> int:
    settings = stack.settings(topic_prefix="bench", partitions=args.partitions, spark_master=args.master,
                              barrier_interval_ms=args.barrier_ms, snapshot_dir=tmp / "snapshots",
                              snapshot_load_batch_rows=args.load_batch)
    client = redis.Redis.from_url(settings.redis_url)
    store = ViewStore(client, settings.topic_prefix)
    rng = random.Random(1)
    start = time.perf_counter()
    with Table.create(settings, TABLE, COLUMNS, ["id"], client=client, auto_commit=False) as table:
        for first in range(0, args.rows, 50_000):
            table.upsert([row(rng, i) for i in range(first, min(args.rows, first + 50_000))])
            table.flush()
    print(f"loaded {args.rows:,} rows into {TABLE} in {time.perf_counter() - start:.1f} s", flush=True)
    stack_pids = [int(p.read_text()) for p in Path(stack.data_dir).glob("*.pid")]

    spark = spark_session(settings, app_name="mvlog-bench-backfill")
    start = time.perf_counter()
    raw = (spark.read.format("mvlog").option("view", TABLE).option("bootstrapServers", settings.bootstrap_servers)
           .option("redisUrl", settings.redis_url).option("topicPrefix", settings.topic_prefix).load()
           .where("_change_type != 'barrier'").count())
    raw_rate = raw / (time.perf_counter() - start)
    print(f"baseline: raw Spark read of {raw:,} rows: {fmt_rate(raw_rate)} rows/s", flush=True)

    writer = Writer(settings, args.rows, rates[0])
    alone = epochs_per_s(store, args.window)
    writer.stop()
    print(f"upstream alone at {rates[0]:,} changes/s: {alone:.2f} epochs/s", flush=True)

    ratios: list[str] = []
    if "chunked" in methods:
        ratios += chunked_runs(settings, client, spark, rates, args.rows, raw_rate, alone, stack_pids)
    if "snapshot" in methods:
        ratios += snapshot_runs(settings, client, spark, rates[0], args.rows, raw_rate, stack_pids)
    spark.stop()
    print("ratios: " + "; ".join(ratios))
    return 0


def chunked_runs(settings: Settings, client: redis.Redis, spark, rates: list[int], table_rows: int,
                 raw_rate: float, alone: float, stack_pids: list[int]) -> list[str]:
    store = ViewStore(client, settings.topic_prefix)
    ratios: list[str] = []
    for rate in rates:
        view = f"bf{rate}"
        create_view(settings, view, f"SELECT * FROM {TABLE}", client=client, backfill="chunked")
        writer = Writer(settings, table_rows, rate)
        consumer = ViewConsumer(settings, view, spark=spark, client=client)
        epochs_before = store.index.count_after(TABLE, None)
        with RssSampler([*stack_pids, writer.child.pid]) as sampler:
            start = time.perf_counter()
            consumer.start()
            while store.lifecycle(view) != Lifecycle.LIVE:
                time.sleep(0.1)
            seconds = time.perf_counter() - start
        during = (store.index.count_after(TABLE, None) - epochs_before) / seconds
        progress = store.backfill_progress(view)
        consumer.stop()
        writer.stop()
        rows = int(progress["rows_done"])
        print(f"backfill at {rate:,} changes/s: {rows:,} rows in {seconds:.1f} s = {fmt_rate(rows / seconds)} rows/s "
              f"({rows / seconds / raw_rate:.2f}x the raw read); final batch size {progress['batch_size']}; "
              f"upstream {during:.2f} epochs/s ({during / alone:.2f}x alone)", flush=True)
        for name, kib in sorted(sampler.peaks.items()):
            print(f"  peak RSS {name:<24} {kib / 1024:8.1f} MiB")
        ratios.append(f"chunked at {rate}/s: backfill {rows / seconds / raw_rate:.2f}x raw read, upstream epochs "
                      f"{during / alone:.2f}x")
    return ratios


SNAPSHOT_VIEWS = {"snap_all": f"SELECT * FROM {TABLE}",
                  "snap_groups": f"SELECT k, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi, "
                                 f"avg(v1) AS mean FROM {TABLE} GROUP BY k"}


def snapshot_runs(settings: Settings, client: redis.Redis, spark, rate: int, table_rows: int, mvlog_rate: float,
                  stack_pids: list[int]) -> list[str]:
    """Snapshot backfill of each of SNAPSHOT_VIEWS while the upstream takes ``rate`` changes/s, against a
    raw ``spark.read.parquet`` of the snapshot."""
    store = ViewStore(client, settings.topic_prefix)
    start = time.perf_counter()
    record = build_snapshot(settings, TABLE, spark, client=client).record
    print(f"snapshot of {TABLE} at epoch {record.epoch}: {record.rows:,} rows in {time.perf_counter() - start:.1f} s",
          flush=True)
    start = time.perf_counter()
    spark.read.parquet(record.path).write.format("noop").mode("overwrite").save()
    raw_rate = record.rows / (time.perf_counter() - start)
    print(f"baseline: raw spark.read.parquet of the snapshot's {record.rows:,} rows: {fmt_rate(raw_rate)} rows/s",
          flush=True)
    ratios: list[str] = []
    for view, sql in SNAPSHOT_VIEWS.items():
        create_view(settings, view, sql, client=client, backfill="snapshot")
        writer = Writer(settings, table_rows, rate)
        consumer = ViewConsumer(settings, view, spark=spark, client=client)
        before_kib = _rss_kib(os.getpid())
        with RssSampler([*stack_pids, writer.child.pid]) as sampler:
            start = time.perf_counter()
            consumer.start()  # computes and writes the view at the snapshot's epoch, then streams on
            loaded = time.perf_counter() - start
        view_rows = int(store.backfill_progress(view).get("view_rows") or 0)
        upstream_mce = store.mce(TABLE) or 0
        consumer.wait_for_epoch(upstream_mce, timeout=600)
        caught_up = time.perf_counter() - start
        consumer.stop()
        writer.stop()
        rate_rows = record.rows / loaded
        print(f"snapshot backfill {view} at {rate:,} changes/s: {record.rows:,} snapshot rows -> "
              f"{view_rows:,} view rows at epoch {record.epoch} in {loaded:.1f} s = "
              f"{fmt_rate(rate_rows)} rows/s ({rate_rows / raw_rate:.2f}x the raw parquet read, "
              f"{rate_rows / mvlog_rate:.2f}x the raw format(\"mvlog\") read); live at the upstream's MCE "
              f"after {caught_up:.1f} s", flush=True)
        print(f"  driver RSS before the load {before_kib / 1024:8.1f} MiB")
        for name, kib in sorted(sampler.peaks.items()):
            print(f"  peak RSS {name:<24} {kib / 1024:8.1f} MiB")
        ratios.append(f"snapshot {view}: {rate_rows / raw_rate:.2f}x raw parquet read, "
                      f"{rate_rows / mvlog_rate:.2f}x raw mvlog read")
    return ratios


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        writer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(main())
