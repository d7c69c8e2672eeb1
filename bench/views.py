"""Downstream views: mvlog's Spark consumers (ViewConsumer) against the minimal hand-written PySpark job.

Two views of one root table ``t1(id PK, k, v1, deleted)``:

* **filter** ``SELECT id, v1 FROM t1 WHERE deleted = false``
* **group** ``SELECT k, count(*) AS n, sum(v1) AS s FROM t1 GROUP BY k``
* **join** (``--join``) ``SELECT t1.id, t1.v1, t2.w FROM t1 JOIN t2 ON t1.k = t2.k WHERE t1.deleted = false``
  over a second table ``t2(k PK, w)``, one row per group, written before t1 and then updated (5 % of its
  rows) after every fifth epoch of t1, each update fanning out to the t1 rows of its group; its writer is
  closed (sealed) before the clocks, so the join follows t1 to its last epoch. Its baseline joins the
  after images of both changelogs with a DataFrame ``join``; its rate counts t1's changes only.
* **joingroup** (``--join`` too) ``SELECT t2.w % 10 AS b, count(*) AS n, sum(t1.v1) AS s FROM t1 JOIN t2 ON
  t1.k = t2.k WHERE t1.deleted = false GROUP BY t2.w % 10``: a GROUP BY over the join, whose groups are not
  join keys (in tasks: the join per join key, then its joined rows shuffled to their groups' partitions).
  Its baseline: the same join, then ``groupBy``.
* **global**, **window**, **topn** (``--more``, catch-up only): ``SELECT count(*) AS n, sum(v1) AS s FROM t1
  WHERE deleted = false`` (one row: in tasks, one task computes it); ``SELECT window.start, count(*) AS n,
  sum(v1) AS s FROM t1 GROUP BY window(id, '1000 milliseconds', '500 milliseconds')`` (``id`` as the time:
  each row in two hopping windows, in tasks sent to both windows' partitions); ``SELECT id, k, v1 FROM
  (SELECT id, k, v1, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v1 DESC) AS rn FROM t1) t WHERE rn <= 3``
  (in tasks: a join's two shuffles, by ranking group then by view key). Baselines: ``agg``; both window
  starts of each row (``explode``) then ``groupBy``; ``row_number()`` over a ``Window`` then a filter.

Everything runs in one process, on a local stack (Apache Kafka + redis-server) that this script starts on
free loopback ports in a temporary folder and stops at the end, with one Spark session (``local[2]`` by
default) shared by both sides.

Workload: ``--changes`` changes (inserts, updates, deletes; each change of an epoch on a distinct id out
of ``--keys``) written by ``Table`` as epochs of ``--epoch-size`` changes, all committed *before* any
clock starts.

* **catch-up** (throughput). mvlog: a fresh ``ViewConsumer`` per view (constructed before the clock),
  timed from ``start()`` until the view's MCE in Redis is the table's last epoch: ``start()`` reads the
  backlog it finds with batch reads of ``format("mvlog")``, one micro-batch of the trigger's limits at a
  time (the streaming query, which then follows the log, would take about a second to start), the
  executors read the changelog, and the driver applies every epoch on the consumer's worker thread (Kafka
  transaction of the view's changes + barriers, then Redis rows + operator state + MCE) while the next
  micro-batch is read. Baseline: what
  a user would write without mvlog, a plain Python data source (``pyspark.sql.datasource``, defined
  below) whose tasks read one partition of the same changelog topic each with confluent-kafka
  (``assign()``, default read_committed), skip barrier records by their ``mvlog.type`` header, decode
  the change events with fastavro and yield their ``after`` images; then the same filter/project or
  aggregation with DataFrame ops, executed into Spark's ``noop`` sink. It knows each partition's last
  offset up front (the table's last barrier, from the epoch index, outside the clock: Kafka's high
  watermark lies past transaction markers no consumer receives). It keeps no state, writes nothing and
  does not net updates or deletes, so it is a floor of what view maintenance costs, not an equivalent.
  Timed from ``load()`` to the end of the action. A warm-up of both sides over the first epoch runs
  before. ``--repeat`` rounds (default 2), interleaved (baseline, mvlog, per view), each mvlog round on a
  fresh view; the best run of each side counts.
* **live** (latency). Both consumers run at once (default trigger interval 200 ms) while the table
  commits an epoch of ``--live-batch`` changes every ``--live-interval-ms``; for each of
  ``--live-epochs`` epochs: time from the table's ``flush()`` returning to the view's MCE in Redis
  reaching that epoch (a thread polls Redis every millisecond). Percentiles are nearest-rank, so with
  50 epochs p99 is the slowest one. The medians of Spark's micro-batch phases are printed with them.

Each view's rows in Redis are checked against the workload's final state after catch-up and live.
With ``--tasks`` and a ``--master local-cluster[...]`` (executors in their own JVMs), every catch-up also
samples the CPU seconds of the driver (its Python process, its JVM, the Python workers that JVM starts),
the executors, the broker and redis-server from ``/proc`` (``_cpu.py``) and prints the driver's CPU
seconds per million changes and its share of the run's CPU (issue 19: at most 5 %, flat when the epoch
size grows 10x; run it at two ``--epoch-size``), with the driver JVM's CPU per thread and what each role
burns idle for 5 s, and each process's peak RSS during the catch-up (``_memory.py``).
``--live-epochs 0`` skips the live phase; ``--live-in-tasks`` (with ``--tasks``) runs it with the
operators in Spark's tasks. ``--redis-cluster`` runs every Redis store (tables, views, control plane) on
a three-master Redis Cluster started beside the stack (``MVLOG_REDIS_CLUSTER``, ``infra/redis_cluster.py``)
instead of the stack's redis-server.
``--profile FILE`` runs the first catch-up of each view under cProfile (its micro-batch reads, and
foreachBatch calls in the driver's Py4J callback thread, and its micro-batch applies, in the consumer's
worker thread) and prints the top functions.

Run with the venv's Python from the repository root::

    PYSPARK_PYTHON=/tmp/venv/bin/python /tmp/venv/bin/python bench/views.py [--changes 200000] \
        [--epoch-size 10000] [--keys 50000] [--groups 1000] [--partitions 4] [--repeat 2] \
        [--live-epochs 50] [--live-batch 100] [--live-interval-ms 200] [--master local[2]] [--profile FILE]

The defaults take about 2.5 minutes on 2 cores. The last line holds the ratios mvlog / baseline of
catch-up changes per second, one per view (target >= 0.5x).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import logging
import os
import pstats
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as sf
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from mvlog.config import Settings
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.redis_client import connect
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.infra.redis_cluster import LocalRedisCluster
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.spark.session import spark_session
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, fmt_rate, machine_info, peak_rss_mib, temporary_stack
from _cpu import DRIVER_ROLES, ROLES, CpuProbe
from _memory import PeakRss, reset_peaks

sys.path.insert(0, str(REPO_ROOT))

from tests.integration.processes.cache_worker import CacheWorkerProcess

TABLE = "t1"
IDLE_S = 5.0  # --tasks on a local-cluster: the processes' CPU measured idle this long before the catch-ups
COLUMNS = {"id": "int", "k": "int", "v1": "int", "deleted": "boolean"}
VIEWS = {
    "filter": "SELECT id, v1 FROM t1 WHERE deleted = false",
    "group": "SELECT k, count(*) AS n, sum(v1) AS s FROM t1 GROUP BY k",
}
DIMENSION = "t2"  # --join
DIMENSION_COLUMNS = {"k": "int", "w": "int"}
JOIN_SQL = "SELECT t1.id, t1.v1, t2.w FROM t1 JOIN t2 ON t1.k = t2.k WHERE t1.deleted = false"
JOIN_GROUP_SQL = ("SELECT t2.w % 10 AS b, count(*) AS n, sum(t1.v1) AS s FROM t1 JOIN t2 ON t1.k = t2.k "
                  "WHERE t1.deleted = false GROUP BY t2.w % 10")
JOINS = ("join", "joingroup")  # the views over t1 and t2
MORE = {  # --more
    "global": "SELECT count(*) AS n, sum(v1) AS s FROM t1 WHERE deleted = false",
    "window": "SELECT window.start, count(*) AS n, sum(v1) AS s FROM t1 "
              "GROUP BY window(id, '1000 milliseconds', '500 milliseconds')",
    "topn": "SELECT id, k, v1 FROM (SELECT id, k, v1, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v1 DESC) AS rn "
            "FROM t1) t WHERE rn <= 3",
}
WINDOW_MS, SLIDE_MS, TOP = 1000, 500, 3


def view_name(view: str, rep: int = 0) -> str:
    """The view maintained in repetition ``rep`` (each repetition catches up a fresh view from epoch 0)."""
    return f"v_{view}" if rep == 0 else f"v_{view}_{rep + 1}"


# ------------------------------------------------------------------------------------------ workload


@dataclass
class Workload:
    """Changes over ids ``0..keys-1``; ``state`` is the table after every epoch generated so far."""

    keys: int
    groups: int
    rng: random.Random
    state: dict[int, dict[str, Any]] = field(default_factory=dict)
    dimension: dict[int, int] = field(default_factory=dict)  # --join: t2, k -> w
    counts: dict[str, int] = field(default_factory=lambda: {"insert": 0, "update": 0, "delete": 0})

    def epoch(self, size: int) -> tuple[list[dict[str, Any]], list[int]]:
        """One epoch: ``size`` changes on distinct ids (upserts, deletes)."""
        upserts: list[dict[str, Any]] = []
        deletes: list[int] = []
        for i in self.rng.sample(range(self.keys), size):
            old = self.state.get(i)
            if old is None:
                row = {"id": i, "k": self.rng.randrange(self.groups), "v1": self.rng.randrange(1000),
                       "deleted": self.rng.random() < 0.1}
                self.counts["insert"] += 1
            elif self.rng.random() < 0.15:
                deletes.append(i)
                del self.state[i]
                self.counts["delete"] += 1
                continue
            else:  # an update always changes v1, sometimes the group or the soft-delete flag
                row = dict(old, v1=(old["v1"] + 1 + self.rng.randrange(999)) % 1000)
                if self.rng.random() < 0.2:
                    row["k"] = self.rng.randrange(self.groups)
                if self.rng.random() < 0.1:
                    row["deleted"] = not old["deleted"]
                self.counts["update"] += 1
            upserts.append(row)
            self.state[i] = row
        return upserts, deletes

    def dimension_epoch(self, share: float) -> list[dict[str, Any]]:
        """t2's rows: all of them the first time, then ``share`` of them with a new ``w``."""
        keys = range(self.groups) if not self.dimension else self.rng.sample(range(self.groups),
                                                                            max(1, int(self.groups * share)))
        rows = [{"k": k, "w": self.rng.randrange(1000)} for k in keys]
        self.dimension.update((row["k"], row["w"]) for row in rows)
        return rows

    def expected(self, view: str) -> dict[Any, tuple[Any, ...]]:
        if view == "join":
            return {r["id"]: (r["v1"], self.dimension[r["k"]]) for r in self.state.values()
                    if not r["deleted"] and r["k"] in self.dimension}
        if view == "joingroup":
            buckets: dict[int, list[int]] = {}
            for r in self.state.values():
                if not r["deleted"] and r["k"] in self.dimension:
                    agg = buckets.setdefault(self.dimension[r["k"]] % 10, [0, 0])
                    agg[0] += 1
                    agg[1] += r["v1"]
            return {b: (n, s) for b, (n, s) in buckets.items()}
        if view == "filter":
            return {r["id"]: (r["v1"],) for r in self.state.values() if not r["deleted"]}
        if view == "global":
            live = [r["v1"] for r in self.state.values() if not r["deleted"]]
            return {(): (len(live), sum(live) if live else None)}
        if view == "window":
            windows: dict[int, list[int]] = {}
            for r in self.state.values():
                last = r["id"] - r["id"] % SLIDE_MS
                for start in range(last, last - WINDOW_MS, -SLIDE_MS):
                    agg = windows.setdefault(start, [0, 0])
                    agg[0] += 1
                    agg[1] += r["v1"]
            return {start: (n, s) for start, (n, s) in windows.items()}
        if view == "topn":
            ranked: dict[int, list[dict[str, Any]]] = {}
            for r in self.state.values():
                ranked.setdefault(r["k"], []).append(r)
            return {r["id"]: (r["k"], r["v1"]) for rows in ranked.values()
                    for r in sorted(rows, key=lambda r: (-r["v1"], r["id"]))[:TOP]}
        groups: dict[Any, list[int]] = {}
        for r in self.state.values():
            agg = groups.setdefault(r["k"], [0, 0])
            agg[0] += 1
            agg[1] += r["v1"]
        return {k: (n, s) for k, (n, s) in groups.items()}


def write_epoch(table: Table, upserts: Sequence[dict[str, Any]], deletes: Sequence[int]) -> int:
    if upserts:
        table.upsert(upserts)
    if deletes:
        table.delete(deletes)
    return table.flush()


def check_view(store: ViewStore, view: str, name: str, workload: Workload) -> str:
    """Compare the view's rows in Redis with the workload's state; a short verdict (exits on mismatch)."""
    expected = workload.expected(view)
    actual: dict[Any, tuple[Any, ...]] = {}
    for _, raw in store.scan_rows(name, batch=5000):
        row = decode_row(raw)
        if view == "filter":
            actual[row["id"]] = (row["v1"],)
        elif view == "join":
            actual[row["id"]] = (row["v1"], row["w"])
        elif view == "joingroup":
            actual[row["b"]] = (row["n"], row["s"])
        elif view == "global":
            actual[()] = (row["n"], row["s"])
        elif view == "window":
            actual[row["start"]] = (row["n"], row["s"])
        elif view == "topn":
            actual[row["id"]] = (row["k"], row["v1"])
        else:
            actual[row["k"]] = (row["n"], row["s"])
    if actual != expected:
        wrong = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
        raise SystemExit(f"{view}: Redis holds {len(actual)} rows, expected {len(expected)}; "
                         f"{len(wrong)} differ, e.g. {[(k, actual.get(k), expected.get(k)) for k in wrong[:3]]}")
    return f"{len(actual):,} rows match"


# ------------------------------------------------------------------------ baseline: plain data source


class _KafkaPartition(InputPartition):
    def __init__(self, partition: int, last_offset: int) -> None:
        self.partition = partition
        self.last_offset = last_offset


class PlainChangelogSource(DataSource):
    """``spark.read.format("plain_changelog")``: the ``after`` images of a changelog topic's change events.

    What a user writes with the documented wire format and no mvlog code: confluent-kafka + fastavro.
    Options: ``bootstrap``, ``topic``, ``ends`` (``partition:last_offset,...``), ``schemafile`` (the
    change event's .avsc), ``columns`` (the row's columns, all BIGINT; default t1's).
    """

    @classmethod
    def name(cls) -> str:
        return "plain_changelog"

    def schema(self) -> str:
        columns = self.options.get("columns")
        if columns:
            return ", ".join(f"{name} BIGINT" for name in columns.split(","))
        return "id BIGINT, k BIGINT, v1 BIGINT, deleted BOOLEAN"

    def reader(self, schema: StructType) -> DataSourceReader:
        return PlainChangelogReader(dict(self.options))


class PlainChangelogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        ends = [item.split(":") for item in self.options["ends"].split(",")]
        return [_KafkaPartition(int(p), int(last)) for p, last in ends]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        import io
        import json

        from confluent_kafka import Consumer, TopicPartition
        from fastavro import parse_schema, schemaless_reader

        assert isinstance(partition, _KafkaPartition)
        with open(self.options["schemafile"]) as handle:
            schema = parse_schema(json.load(handle))
        consumer = Consumer({"bootstrap.servers": self.options["bootstrap"], "group.id": "bench-plain",
                             "enable.auto.commit": False, "fetch.max.bytes": 16 * 1024 * 1024})
        names = (self.options.get("columns") or "id,k,v1,deleted").split(",")
        consumer.assign([TopicPartition(self.options["topic"], partition.partition, 0)])
        try:
            offset = -1
            while offset < partition.last_offset:
                # consume() waits for its whole timeout unless the batch fills: keep the timeout short.
                for message in consumer.consume(num_messages=2000, timeout=0.1):
                    if message.error() is not None:
                        raise RuntimeError(str(message.error()))
                    offset = message.offset() or 0
                    if ("mvlog.type", b"change") not in (message.headers() or ()):
                        continue  # a barrier
                    event: Any = schemaless_reader(io.BytesIO(message.value() or b""), schema, None)
                    after = event["after"]
                    if after is not None:
                        yield tuple(after[name] for name in names)
        finally:
            consumer.close()


def baseline_frame(spark: SparkSession, view: str, options: dict[str, str],
                   dimension: dict[str, str] | None = None) -> Any:
    df = spark.read.format("plain_changelog").options(**options).load()
    if view in JOINS:
        assert dimension is not None
        t2 = spark.read.format("plain_changelog").options(**dimension, columns="k,w").load()
        joined = df.filter("deleted = false").join(t2, "k")
        if view == "join":
            return joined.select("id", "v1", "w")
        return (joined.groupBy((sf.col("w") % 10).alias("b"))
                .agg(sf.count(sf.lit(1)).alias("n"), sf.sum("v1").alias("s")))
    if view == "filter":
        return df.filter("deleted = false").select("id", "v1")
    if view == "global":
        return df.filter("deleted = false").agg(sf.count(sf.lit(1)).alias("n"), sf.sum("v1").alias("s"))
    if view == "window":
        last = sf.col("id") - sf.col("id") % SLIDE_MS
        starts = sf.array(*(last - k * SLIDE_MS for k in range(WINDOW_MS // SLIDE_MS)))
        return (df.select(sf.explode(starts).alias("start"), "v1").groupBy("start")
                .agg(sf.count(sf.lit(1)).alias("n"), sf.sum("v1").alias("s")))
    if view == "topn":
        rank = sf.row_number().over(Window.partitionBy("k").orderBy(sf.desc("v1"), "id"))
        return df.withColumn("rn", rank).filter(sf.col("rn") <= TOP).select("id", "k", "v1")
    return df.groupBy("k").agg(sf.count(sf.lit(1)).alias("n"), sf.sum("v1").alias("s"))


def run_baseline(spark: SparkSession, view: str, options: dict[str, str],
                 dimension: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    baseline_frame(spark, view, options, dimension).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------- mvlog consumer


@dataclass(frozen=True)
class CatchUp:
    """One catch-up: seconds from ``start()`` to MCE == the last epoch, epochs applied, seconds reading
    micro-batches (the batch reads of the catch-up, then foreachBatch), seconds applying them (the
    consumer's worker thread, meanwhile), and with a probe the CPU seconds of each role in that time."""

    seconds: float
    applied: int
    collecting: float
    applying: float
    cpu: dict[str, float] | None = None
    jvm_threads: dict[str, float] | None = None  # the driver JVM's CPU seconds per thread group
    rss: PeakRss | None = None  # with a probe: each process's peak RSS during the catch-up
    #: In tasks: partition writes with a writer the Python worker kept from an earlier task, and all of them.
    kept_writers: tuple[int, int] | None = None


_DRIVER_PEAK_MIB = [0.0]  # the driver process's peak before the catch-ups' resets of it (_memory.py)


def run_catch_up(settings: Settings, spark: SparkSession, name: str, last_epoch: int,
                 profiles: tuple[cProfile.Profile, cProfile.Profile] | None,
                 probe: CpuProbe | None = None) -> CatchUp:
    """One view's catch-up, timed (and its CPU sampled) from ``start()`` to its MCE at ``last_epoch``."""
    consumer = ViewConsumer(settings, name, spark=spark)
    if settings.operators_in_tasks and consumer.tasks is None:
        raise SystemExit(f"{name}: MVLOG_OPERATORS_IN_TASKS is on, but the view does not run in tasks")
    seconds_in = {"collect": 0.0, "apply": 0.0}
    idle = {what: threading.Event() for what in seconds_in}
    for event in idle.values():
        event.set()

    def timed(method: Any, what: str, profile: cProfile.Profile | None) -> Any:
        def call(*args: Any) -> Any:  # foreachBatch runs in a Py4J callback thread, the apply in a worker
            idle[what].clear()
            began = time.perf_counter()
            if profile is not None:
                profile.enable()
            try:
                return method(*args)
            finally:
                if profile is not None:
                    profile.disable()
                seconds_in[what] += time.perf_counter() - began
                idle[what].set()
        return call

    collect_profile, apply_profile = profiles if profiles is not None else (None, None)
    consumer.process_batch = timed(consumer.process_batch, "collect", collect_profile)  # type: ignore[method-assign]
    consumer.reader.read_range = timed(consumer.reader.read_range, "collect", collect_profile)  # type: ignore[method-assign]
    consumer.apply_batch = timed(consumer.apply_batch, "apply", apply_profile)  # type: ignore[method-assign]
    try:
        before = probe.sample() if probe is not None else None
        if probe is not None:  # the driver's whole-run peak first, then every process's peak starts over
            _DRIVER_PEAK_MIB[0] = max(_DRIVER_PEAK_MIB[0], peak_rss_mib())
            reset_peaks(pid for role in (*DRIVER_ROLES, "executors") for pid in probe.members().roles[role])
        start = time.perf_counter()
        consumer.start()
        consumer.wait_for_epoch(last_epoch, timeout=1800)
        seconds = time.perf_counter() - start
        after = probe.sample() if probe is not None else None
        idle["apply"].wait(30)  # the MCE moves inside the apply: let the wrapper account for its end
        cpu = threads = rss = None
        if probe is not None and after is not None and before is not None:
            cpu, threads = after - before, after.threads_since(before)
            rss = PeakRss.of(probe.members(), probe.driver, probe.driver_jvm)
        tasks = consumer.tasks
        kept = (tasks.kept_writers, tasks.partition_writes) if tasks is not None else None
        return CatchUp(seconds, consumer.epochs_applied, seconds_in["collect"], seconds_in["apply"], cpu, threads,
                       rss, kept)
    finally:
        consumer.stop()


@dataclass
class LiveResult:
    latencies: dict[str, list[float]]  # by view (a key of VIEWS)
    batches: dict[str, list[Any]]  # each query's recent micro-batch progress (StreamingQueryProgress)
    epochs: int
    changes: int
    interval_s: float
    from_cache: int  # partition-epochs the consumers read from the log cache during the live phase
    from_kafka: int  # ... and from Kafka
    #: With the operators in tasks, per view: partition writes with a producer kept from an earlier task,
    #: and all of them (micro-batches the driver's way write none).
    kept_writers: dict[str, tuple[int, int]] = field(default_factory=dict)


def run_live(settings: Settings, spark: SparkSession, table: Table, workload: Workload, epochs: int,
             batch: int, interval_s: float, cache_worker: bool, names: dict[str, str]) -> LiveResult:
    """Both consumers (of the views ``names`` gives for VIEWS' keys) running; the table commits an epoch
    every ``interval_s``; flush -> MCE latency. With ``cache_worker``, a log-cache worker (``mvlog
    cache-worker``, a child process) follows the table, and the partition-epochs the consumers read from it
    and from Kafka during the live phase are counted."""
    views = [names[v] for v in VIEWS]
    consumers = [ViewConsumer(settings, name, spark=spark) for name in views]
    poll_client = connect(settings)
    store = ViewStore(poll_client, settings.topic_prefix)
    registry = CacheRegistry(poll_client, settings.topic_prefix)
    worker = CacheWorkerProcess(settings, TABLE) if cache_worker else None
    if worker is not None:
        worker.wait_ready(TABLE, settings.partitions, timeout=300)
    committed: list[tuple[int, float]] = []  # (epoch, time the table's flush returned)
    reached: dict[str, dict[int, float]] = {name: {} for name in views}
    done = threading.Event()
    lock = threading.Lock()

    def poll() -> None:
        while not done.is_set():
            mces = store.mce_many(views)
            now = time.perf_counter()
            with lock:
                for name in views:
                    mce = mces[name] or 0
                    for epoch, _ in committed:
                        if epoch <= mce:
                            reached[name].setdefault(epoch, now)
            time.sleep(0.001)

    queries = []
    try:
        for consumer in consumers:
            queries.append(consumer.start())
        # Warm-up epochs: both queries have run micro-batches before anything is recorded.
        for _ in range(5):
            epoch = write_epoch(table, *workload.epoch(batch))
            time.sleep(interval_s)
        for consumer in consumers:
            consumer.wait_for_epoch(epoch, timeout=300)
        reads_before = registry.reads(TABLE)
        poller = threading.Thread(target=poll, name="mce-poller", daemon=True)
        poller.start()
        next_tick = time.perf_counter()
        for _ in range(epochs):
            next_tick += interval_s
            epoch = write_epoch(table, *workload.epoch(batch))
            flushed = time.perf_counter()
            with lock:
                committed.append((epoch, flushed))
            time.sleep(max(0.0, next_tick - time.perf_counter()))
        for consumer in consumers:
            consumer.wait_for_epoch(epoch, timeout=300)
        time.sleep(0.05)  # the poller sees the last MCE
        done.set()
        poller.join()
        cached, kafka = (after - before for after, before in zip(registry.reads(TABLE), reads_before, strict=True))
        batches = {view: [p for p in query.recentProgress if p.numInputRows]
                   for view, query in zip(VIEWS, queries, strict=True)}
        kept = {view: (c.tasks.kept_writers, c.tasks.partition_writes)
                for view, c in zip(VIEWS, consumers, strict=True) if c.tasks is not None}
    finally:
        done.set()
        for consumer in consumers:
            consumer.stop()
        if worker is not None:
            worker.stop()
        poll_client.close()
    latencies = {view: [reached[names[view]][e] - t for e, t in committed] for view in VIEWS}
    return LiveResult(latencies, batches, epochs, epochs * batch, interval_s, cached, kafka, kept)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def print_live(args: argparse.Namespace, live: LiveResult) -> None:
    """The live phase's latencies, cache reads and micro-batch phases."""
    path = "operators in Spark's tasks" if args.live_in_tasks else "the driver path"
    print(f"  live: {live.epochs} epochs of {args.live_batch} changes every {args.live_interval_ms} ms, "
          f"both consumers running (trigger 200 ms, {path}); table flush() return -> view MCE in Redis:")
    for view in VIEWS:
        values = live.latencies[view]
        print(f"  {view:<6} latency p50 {percentile(values, 50) * 1000:6.0f} ms  p99 "
              f"{percentile(values, 99) * 1000:6.0f} ms  (min {min(values) * 1000:.0f}, mean "
              f"{statistics.fmean(values) * 1000:.0f}, max {max(values) * 1000:.0f} ms)")
    if args.cache_worker:
        read = live.from_cache + live.from_kafka
        share = f"{live.from_cache / read:.1%}" if read else "-"
        print(f"  live: partition-epochs the consumers read from the log cache (a worker following t1): "
              f"{live.from_cache}/{read} ({share}; the rest from Kafka)")
    phases = ("latestOffset", "queryPlanning", "addBatch", "triggerExecution")
    for view in VIEWS:
        batches = live.batches[view]
        medians = ", ".join(f"{phase} {statistics.median(b.durationMs.get(phase, 0) for b in batches):.0f}"
                            for phase in phases) if batches else "none"
        print(f"  {view:<6} live micro-batches: {len(batches)} in Spark's recent progress, median ms: {medians}")
        if view in live.kept_writers:
            kept, writes = live.kept_writers[view]
            print(f"  {view:<6} live partition writes in tasks with a producer kept from an earlier task: "
                  f"{kept}/{writes}")


def cpu_line(cpu: dict[str, float], changes: int, seconds: float) -> str:
    """The driver's CPU seconds per million changes and its share of the run's CPU, each role's seconds."""
    total = sum(cpu.values())
    driver = sum(cpu[role] for role in DRIVER_ROLES)
    roles = ", ".join(f"{role} {cpu[role]:.1f}" for role in ROLES)
    share = f"{driver / total:.1%}" if total else "-"
    return (f"driver {driver / changes * 1e6:6.1f} CPU s per 1M changes, {share} of the run's CPU "
            f"({roles} s; {total:.1f} CPU s in {seconds:.1f} s wall)")


# ----------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000, help="changes in the catch-up log (default 200000)")
    parser.add_argument("--epoch-size", type=int, default=10_000, help="changes per catch-up epoch (default 10000)")
    parser.add_argument("--keys", type=int, default=50_000, help="id range of t1 (default 50000)")
    parser.add_argument("--groups", type=int, default=1000, help="distinct values of k (default 1000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of every changelog (default 4)")
    parser.add_argument("--live-epochs", type=int, default=50, help="recorded live epochs (default 50)")
    parser.add_argument("--live-batch", type=int, default=100, help="changes per live epoch (default 100)")
    parser.add_argument("--live-interval-ms", type=int, default=200, help="live epoch interval (default 200)")
    parser.add_argument("--cache-worker", action=argparse.BooleanOptionalAction, default=True,
                        help="run a log-cache worker on t1 during the live phase and count the consumers' reads "
                             "from it (default: on)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="catch-up measurements per side and view, best one reported (default 2)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--tasks", action=argparse.BooleanOptionalAction, default=False,
                        help="also catch up each view with its operator in Spark's tasks "
                             "(MVLOG_OPERATORS_IN_TASKS, docs/scaling.md), same run")
    parser.add_argument("--driver-path", action=argparse.BooleanOptionalAction, default=True,
                        help="catch up each view the driver's way too (--no-driver-path, with --tasks: only in tasks, "
                             "so the driver process's peak RSS is the task path's alone)")
    parser.add_argument("--live-in-tasks", action=argparse.BooleanOptionalAction, default=False,
                        help="run the live phase's consumers with their operators in Spark's tasks (needs --tasks)")
    parser.add_argument("--redis-cluster", action=argparse.BooleanOptionalAction, default=False,
                        help="run every Redis store on a three-master Redis Cluster started beside the stack "
                             "(MVLOG_REDIS_CLUSTER) instead of the stack's redis-server")
    parser.add_argument("--join", action=argparse.BooleanOptionalAction, default=False,
                        help="also a two-view join over t1 and a table t2 of one row per group (catch-up only)")
    parser.add_argument("--more", action=argparse.BooleanOptionalAction, default=False,
                        help="also a global aggregate, a hopping window and a top-N over t1 (catch-up only)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", type=Path, default=None,
                        help="cProfile the driver's foreachBatch calls and applies during the first catch-up of each "
                             "view: stats to FILE.<view>, top functions printed")
    parser.add_argument("--profile-lines", type=int, default=25, help="functions printed per profile (default 25)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write each view's best catch-up seconds per side to this file (bench/scaling.py)")
    args = parser.parse_args(argv)
    if args.epoch_size > args.keys or args.live_batch > args.keys:
        parser.error("--epoch-size and --live-batch must not exceed --keys (changes of an epoch use distinct ids)")
    if not args.driver_path and (not args.tasks or args.live_epochs > 0):
        parser.error("--no-driver-path needs --tasks and --live-epochs 0")
    if args.live_in_tasks and not args.tasks:
        parser.error("--live-in-tasks needs --tasks (the views whose operators run in tasks are made by it)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    workload = Workload(args.keys, args.groups, random.Random(args.seed))
    epoch_sizes = [min(args.epoch_size, args.changes - done) for done in range(0, args.changes, args.epoch_size)]
    views = {**VIEWS, **({"join": JOIN_SQL, "joingroup": JOIN_GROUP_SQL} if args.join else {}),
             **(MORE if args.more else {})}  # live: VIEWS only
    profiles = {view: (cProfile.Profile(), cProfile.Profile()) for view in views} if args.profile else {}
    catch_up: dict[str, list[CatchUp]] = {view: [] for view in views}
    baseline: dict[str, list[float]] = {view: [] for view in views}
    in_tasks: dict[str, list[CatchUp]] = {view: [] for view in views}  # --tasks
    checks: dict[str, str] = {}
    idle_cpu: dict[str, float] | None = None
    with temporary_stack("mvlog-bench-") as (stack, folder), contextlib.ExitStack() as cleanup:
        spark: SparkSession | None = None
        try:
            settings = stack.settings(topic_prefix="bench", partitions=args.partitions, spark_master=args.master)
            if args.redis_cluster:
                cluster = LocalRedisCluster(folder / "redis-cluster").start()
                cleanup.callback(cluster.stop)
                settings = settings.model_copy(update={"redis_url": cluster.url, "redis_cluster": True})
                print(f"Redis Cluster: {len(cluster.ports)} masters, ports {cluster.ports}")
            client = connect(settings)
            store = ViewStore(client, settings.topic_prefix)
            table = Table.create(settings, TABLE, COLUMNS, ["id"], client=client, auto_commit=False)
            dimension = (Table.create(settings, DIMENSION, DIMENSION_COLUMNS, ["k"], client=client,
                                      auto_commit=False) if args.join else None)
            for rep in range(args.repeat):
                for view, sql in views.items():
                    if args.driver_path:
                        create_view(settings, view_name(view, rep), sql, client=client)
                    if args.tasks:
                        create_view(settings, view_name(f"{view}_tasks", rep), sql, client=client)

            start = time.perf_counter()
            epochs = []
            for i, size in enumerate(epoch_sizes):
                if dimension is not None and i % 5 == 0:  # all of t2 first, then 5 % of it every 5 epochs
                    dimension.upsert(workload.dimension_epoch(0.05))
                    dimension.flush()
                epochs.append(write_epoch(table, *workload.epoch(size)))
            write_seconds = time.perf_counter() - start
            if dimension is not None:
                dimension.close()  # stopped: the join is sealed past it and follows t1 to its last epoch
                dimension_changes = sum(e.records for p in range(args.partitions)
                                        for e in store.index.between(DIMENSION, p, 0, epochs[-1]))
            written = sum(e.records for p in range(args.partitions)
                          for e in store.index.between(TABLE, p, 0, epochs[-1]))
            if written != args.changes:
                raise SystemExit(f"the table wrote {written} changes, expected {args.changes}")
            mix = dict(workload.counts)
            last_offsets = {p: store.index.latest(TABLE, p) for p in range(args.partitions)}
            dimension_offsets = {p: store.index.latest(DIMENSION, p) for p in range(args.partitions)}
            first_offsets = {p: store.index.at(TABLE, p, epochs[0]) for p in range(args.partitions)}

            spark = spark_session(settings, app_name="mvlog-bench-views")
            spark.dataSource.register(PlainChangelogSource)
            probe = None
            if args.tasks and args.master.startswith("local-cluster") and not args.redis_cluster:  # own JVMs
                pids = {s.name: s.pid for s in stack.status(check_health=False)}
                jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
                probe = CpuProbe(os.getpid(), jvm, pids.get("kafka"), pids.get("redis"))
                before = probe.sample()
                time.sleep(IDLE_S)  # what the processes burn doing nothing (heartbeats, GC, the broker's timers)
                idle_cpu = probe.sample() - before
            schema_file = Path(sys.modules["mvlog.schemas"].__file__ or "").parent / "change_event.avsc"

            def plain_options(offsets: dict[int, Any]) -> dict[str, str]:
                ends = ",".join(f"{p}:{e.offset}" for p, e in offsets.items() if e is not None)
                return {"bootstrap": settings.bootstrap_servers, "topic": settings.changelog_topic(TABLE),
                        "ends": ends, "schemafile": str(schema_file)}

            # Warm-up (JVM, Python workers, both data sources) over the first epoch, untimed.
            run_baseline(spark, "group", plain_options(first_offsets))
            (spark.read.format("mvlog").option("view", TABLE).option("endingEpoch", str(epochs[0]))
             .load().write.format("noop").mode("overwrite").save())

            for rep in range(args.repeat):  # interleaved, so drift hits both sides alike
                for view in views:
                    dimension_options = (dict(plain_options(dimension_offsets),
                                              topic=settings.changelog_topic(DIMENSION)) if view in JOINS else None)
                    baseline[view].append(run_baseline(spark, view, plain_options(last_offsets), dimension_options))
                    if args.driver_path:
                        name = view_name(view, rep)
                        catch_up[view].append(run_catch_up(settings, spark, name, epochs[-1],
                                                           profiles.get(view) if rep == 0 else None, probe))
                        checks[view] = check_view(store, view, name, workload)
                    if args.tasks:
                        name = view_name(f"{view}_tasks", rep)
                        in_tasks[view].append(run_catch_up(settings.model_copy(update={"operators_in_tasks": True}),
                                                           spark, name, epochs[-1], None, probe))
                        checks[f"{view}_tasks"] = check_view(store, view, name, workload)

            live = None
            if args.live_epochs > 0:
                names = {view: view_name(f"{view}_tasks" if args.live_in_tasks else view) for view in VIEWS}
                live_settings = settings.model_copy(update={"operators_in_tasks": args.live_in_tasks})
                live = run_live(live_settings, spark, table, workload, args.live_epochs, args.live_batch,
                                args.live_interval_ms / 1000, args.cache_worker, names)
                for view in VIEWS:
                    check = f"{view}_tasks" if args.live_in_tasks else view
                    after_live = check_view(store, view, names[view], workload).split()[0]
                    checks[check] += f" after catch-up, {after_live} after live"
            table.close()
            client.close()
        finally:
            if spark is not None:
                spark.stop()

    n = args.changes
    print(f"views benchmark: {n:,} changes of t1 ({mix['insert']:,} inserts, {mix['update']:,} updates, "
          f"{mix['delete']:,} deletes; ids 0..{args.keys - 1}, {args.groups} groups) in {len(epochs)} epochs of "
          f"{args.epoch_size:,}, {args.partitions} partition(s), Spark {args.master}, "
          "Apache Kafka + redis-server on loopback")
    if args.join:
        print(f"  join: t2 of {args.groups} rows, {dimension_changes:,} changes of t2 in all (not counted in the "
              "join's rates)")
    print(f"  committed by Table before the clocks: {write_seconds:.1f} s ({fmt_rate(n / write_seconds)} changes/s)")
    print("  mvlog: ViewConsumer, start() until the view's MCE is the last epoch (backlog read in micro-batches "
          "by batch jobs, then the stream; Kafka txn + Redis per epoch)")
    print("  baseline: plain Python data source (confluent-kafka assign + fastavro, after images) + DataFrame "
          "filter/groupBy into the noop sink")
    print(machine_info())
    print(f"  catch-up, best of {args.repeat} per side" + (" (the first mvlog run of each view under cProfile)"
                                                          if profiles else "") + ":")
    best_baseline = {view: min(baseline[view]) for view in views}
    best_catch_up = {view: min(runs, key=lambda run: run.seconds) for view, runs in catch_up.items() if runs}
    for view in views:
        runs = ", ".join(f"{t:.2f}" for t in baseline[view])
        print(f"  {view:<6} baseline {fmt_rate(n / best_baseline[view]):>9} records/s ({n:,} change events in "
              f"{best_baseline[view]:.2f} s; runs {runs} s)")
        if view not in best_catch_up:
            continue
        best = best_catch_up[view]
        seconds, applied, collecting, applying = best.seconds, best.applied, best.collecting, best.applying
        runs = ", ".join(f"{run.seconds:.2f}" for run in catch_up[view])
        print(f"  {view:<6} mvlog    {fmt_rate(n / seconds):>9} changes/s ({n:,} changes, {applied} epochs "
              f"in {seconds:.2f} s; {collecting:.2f} s reading micro-batches, {applying:.2f} s "
              f"applying them in the consumer's worker thread; runs {runs} s)")
        print(f"  {view:<6} view check: {checks[view]}")
    for view, runs_in_tasks in in_tasks.items():
        if not runs_in_tasks:
            continue
        seconds = min(run.seconds for run in runs_in_tasks)
        runs = ", ".join(f"{run.seconds:.2f}" for run in runs_in_tasks)
        print(f"  {view:<6} in tasks (MVLOG_OPERATORS_IN_TASKS) {fmt_rate(n / seconds):>9} changes/s ({n:,} changes "
              f"in {seconds:.2f} s; runs {runs} s); view check: {checks[f'{view}_tasks']}")
        kept = [f"{run.kept_writers[0]}/{run.kept_writers[1]}" for run in runs_in_tasks if run.kept_writers]
        print(f"  {view:<6} in tasks: partition writes with a writer kept from an earlier task "
              f"(MVLOG_TASK_WRITERS_KEPT={settings.task_writers_kept}), per run: {', '.join(kept)}")
        versus_driver = (f", {best_catch_up[view].seconds / seconds:.2f}x the driver path"
                         if view in best_catch_up else "")
        print(f"  {view:<6} in tasks: {best_baseline[view] / seconds:.2f}x the baseline{versus_driver}")
    if any(run.cpu is not None for runs in in_tasks.values() for run in runs):
        print(f"  CPU during the catch-up (/proc, every run; driver = driver_py, the Python driver, + driver_jvm, its "
              f"JVM, which in {args.master} also hosts Spark's master and workers, and the Python workers it starts; "
              "executors = executor JVMs + their Python workers):")
        for view in views:
            for path, path_runs in (("driver path", catch_up[view]), ("in tasks", in_tasks[view])):
                for run in path_runs:
                    if run.cpu is not None:
                        print(f"  {view:<6} {path:<11} {cpu_line(run.cpu, n, run.seconds)}")
                    if run.jvm_threads:
                        top = sorted(run.jvm_threads.items(), key=lambda item: -item[1])[:8]
                        print(f"  {'':<18} driver JVM threads (CPU s): "
                              + ", ".join(f"{name} {seconds:.2f}" for name, seconds in top))
                    if run.rss is not None:
                        print(f"  {'':<18} {run.rss.line()}")
        if idle_cpu is not None:
            print(f"  idle for {IDLE_S:.0f} s before the catch-ups, CPU s per s: "
                  + ", ".join(f"{role} {idle_cpu[role] / IDLE_S:.3f}" for role in ROLES))
    if live is not None:
        print_live(args, live)
    print(f"  peak RSS of the driver process: {max(_DRIVER_PEAK_MIB[0], peak_rss_mib()):.0f} MiB")
    for view, (collect_profile, apply_profile) in profiles.items():
        path = args.profile.with_name(f"{args.profile.stem}.{view}{args.profile.suffix or '.prof'}")
        stats = pstats.Stats(collect_profile, stream=sys.stdout)
        stats.add(apply_profile)
        stats.dump_stats(str(path))
        print(f"  {view} catch-up: cProfile of the driver's foreachBatch calls and micro-batch applies "
              f"(written to {path}), top {args.profile_lines} by cumulative time:")
        stats.strip_dirs().sort_stats("cumulative").print_stats(args.profile_lines)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "master": args.master, "changes": n, "machine": machine_info(),
            "views": {view: {"baseline_s": best_baseline[view],
                             "driver_s": best_catch_up[view].seconds if view in best_catch_up else None,
                             "in_tasks_s": min((run.seconds for run in in_tasks[view]), default=None)}
                      for view in views}}, indent=2))
    if best_catch_up:
        ratios = ", ".join(f"{view} {best_baseline[view] / run.seconds:.2f}x" for view, run in best_catch_up.items())
        print(f"ratio mvlog/baseline (catch-up changes/s): {ratios} (target >= 0.5x)")
    if any(in_tasks.values()):
        ratios = ", ".join(f"{view} {best_baseline[view] / min(run.seconds for run in runs):.2f}x"
                           for view, runs in in_tasks.items() if runs)
        print(f"ratio mvlog in tasks/baseline (catch-up changes/s): {ratios} (target >= 0.8x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
