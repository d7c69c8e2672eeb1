"""Runs a Nexmark query in mvlog as a user would, and measures it (catch-up rate, steady latency).

The pieces a deployment runs: one ``mvlog run-source TABLE`` **process** per source table the query reads
(each an exactly-once ingester of its topic, :mod:`mvlog.services.sources`) and the view's Spark
consumer (:class:`~mvlog.services.pipeline.view_consumer.ViewConsumer`, in this process, on a shared Spark session).
Every run gets a topic prefix of its own (its own catalog, changelogs and consumer groups on the shared
broker and Redis), so nothing of an earlier run is reused.

* **catch-up**: the topics already hold the events. The clock starts when the ingester processes are
  spawned (their start-up counts) and the consumer starts, and stops when the view's MCE in Redis first
  reaches the last epoch of its source tables (read once the ingesters, run ``--until-caught-up``, exit):
  the effect of the last event committed, for a join too (:func:`reachable_epoch`: the ingesters stopped,
  so the join plans past every table's last epoch).
* **steady**: the ingesters and the consumer run on empty topics of the run's own (once each ingester
  says it consumes and the view's streaming query ran its first micro-batch); a producer writes events
  at a fixed rate; each event's latency is from its produce call to the first time the view's MCE covers
  the source-table epoch that consumed its offset (each table epoch records the source offsets it consumed
  on its barriers, :mod:`mvlog.source_offsets`; the MCE is polled every few ms).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.table_writers import TableWriters, plan_through
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.view_ddl import create_view
from mvlog.source_offsets import offsets_of
from mvlog.source_spec import source_group

from .generator import GeneratorConfig
from .model import NexmarkTopics
from .mvlog_tables import Planned, create_tables
from .peer import SteadyPhase, percentile

#: How often the MCE watcher asks Redis: 10 ms resolves a 1 s barrier interval to 1 %; at 2 ms the watcher
#: took 43 % of the bench process's CPU, which the engine under test shares (the peers are watched by a consumer).
_POLL_S = 0.01


def mvlog_command() -> list[str]:
    """The ``mvlog`` console script next to this interpreter (the venv's), else ``python -m``."""
    script = Path(sys.executable).with_name("mvlog")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "mvlog.services.cli"]


class SourceProcesses:
    """``mvlog run-source TABLE`` for each table, as child processes; their output goes to ``log_dir``."""

    def __init__(self, settings: Settings, tables: Iterable[str], log_dir: Path, *, until_caught_up: bool) -> None:
        self.settings = settings
        self.tables = list(tables)
        self.log_dir = log_dir
        self.until_caught_up = until_caught_up
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        env = {**os.environ, **self.settings.to_env()}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for table in self.tables:
            args = [*mvlog_command(), "run-source", table] + (["--until-caught-up"] if self.until_caught_up else [])
            with (self.log_dir / f"run-source-{table}.log").open("wb") as log:
                self.processes[table] = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> None:
        """Until every ingester says it is consuming (its ``ingesting topic`` line)."""
        deadline = time.monotonic() + timeout
        for table, process in self.processes.items():
            log = self.log_dir / f"run-source-{table}.log"
            while "ingesting topic" not in log.read_text(errors="replace"):
                if process.poll() is not None:
                    self._check(table, process.returncode)
                    raise RuntimeError(f"mvlog run-source {table} exited before ingesting")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mvlog run-source {table} did not start in {timeout:.0f} s")
                time.sleep(0.05)

    def ready_time(self) -> float | None:
        """When the last ingester began consuming (``time.time()``), from the timestamp of its ``ingesting``
        log line; None when a log lacks it."""
        times = []
        for table in self.processes:
            text = (self.log_dir / f"run-source-{table}.log").read_text(errors="replace")
            found = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: \S+: ingesting ", text, re.M)
            if found is None:
                return None
            times.append(datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
        return max(times) if times else None

    def wait(self, timeout: float) -> None:
        """Wait for every ingester to exit (``--until-caught-up``); a failure is raised with its log."""
        deadline = time.monotonic() + timeout
        for table, process in self.processes.items():
            try:
                code = process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"mvlog run-source {table} did not catch up in {timeout:.0f} s "
                                   f"(log: {self.log_dir / f'run-source-{table}.log'})") from None
            self._check(table, code)

    def stop(self) -> None:
        """SIGTERM (the ingester commits what it read, then exits), then wait; SIGKILL after 60 s."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for table, process in self.processes.items():
            try:
                code = process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
                raise TimeoutError(f"mvlog run-source {table} did not stop on SIGTERM within 60 s") from None
            self._check(table, code)

    def _check(self, table: str, code: int) -> None:
        if code not in (0, -signal.SIGTERM):
            log = (self.log_dir / f"run-source-{table}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mvlog run-source {table} exited {code}:\n{log}")

    def kill_all(self) -> None:
        """Stop whatever still runs (cleanup after an error), without checking."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


class MceWatch:
    """Polls the MCE of some tables and views every few ms; remembers when each value was first seen."""

    def __init__(self, store: ViewStore, names: Sequence[str]) -> None:
        self.store = store
        self.names = list(names)
        self.history: dict[str, list[tuple[float, int]]] = {n: [] for n in self.names}  # (time.time(), mce)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mce-watch", daemon=True)

    def __enter__(self) -> MceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            mces = self.store.mce_many(self.names)
            now = time.time()
            for name, mce in mces.items():
                seen = self.history[name]
                if mce is not None and (not seen or mce > seen[-1][1]):
                    seen.append((now, mce))
            time.sleep(_POLL_S)

    def first_time_at_least(self, name: str, epoch: int) -> float | None:
        """When ``name``'s MCE was first seen at or above ``epoch`` (None: not yet)."""
        return next((t for t, mce in self.history[name] if mce >= epoch), None)

    def wait_at_least(self, name: str, epoch: int, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while (seen := self.first_time_at_least(name, epoch)) is None:
            if time.monotonic() > deadline:
                last = self.history[name][-1][1] if self.history[name] else None
                raise TimeoutError(f"{name}: MCE {last} did not reach {epoch} in {timeout:.0f} s")
            time.sleep(0.01)
        return seen


def reachable_epoch(settings: Settings, client: redis.Redis, sources: Sequence[str]) -> int:
    """The last epoch a view of ``sources`` can commit now: the bound its consumer plans through
    (:func:`mvlog.connectors.redis.table_writers.plan_through`, without sealing anything here). One
    source: that table's latest epoch. A join: the union of its tables' epochs up to the least latest
    epoch of those whose ingesters run, or, once they all stopped (``--until-caught-up``), the last epoch
    of them all: the effect of every event."""
    catalog = CatalogStore(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    return plan_through(store.index, TableWriters(client, settings.topic_prefix), [catalog.get(s) for s in sources],
                        seal=False)


def source_epochs(settings: Settings, client: redis.Redis, table: str) -> list[tuple[int, dict[int, int]]]:
    """(epoch, partition -> next source offset) of each committed epoch of a source table, from the
    ``source_offsets`` mutations on its barriers."""
    entry = CatalogStore(settings, client).get(table)
    store = ViewStore(client, settings.topic_prefix)
    out = []
    with ChangelogReader(settings, table, entry.key_columns, entry.partitions, store.index,
                         upto_epoch=store.mce(table)) as reader:
        for epoch in reader.epochs(idle_timeout=10.0):
            offsets = offsets_of(epoch.mutation)
            if offsets is not None:
                out.append((epoch.epoch, offsets))
    return out


def committed_source_offsets(settings: Settings, table: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "isolation.level": "read_committed",
                         "group.id": source_group(settings.topic_prefix, table), "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "nexmark-ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def wait_ingested(settings: Settings, topics: NexmarkTopics, tables: Iterable[str], timeout: float) -> None:
    """Until each table's committed source offsets reach its topic's end."""
    deadline = time.monotonic() + timeout
    for table in tables:
        topic = topics.topic_of(table)
        ends = end_offsets(settings.bootstrap_servers, topic, topics.partitions)
        while committed_source_offsets(settings, table, topic, topics.partitions) != ends:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{table}: the ingester did not reach the end of {topic} ({ends}) in "
                                   f"{timeout:.0f} s")
            time.sleep(0.1)


def view_rows(settings: Settings, client: redis.Redis, view: str) -> list[dict[str, Any]]:
    """The view's rows in Redis, visible columns only (hidden key columns such as ``bid_key`` dropped)."""
    schema = CatalogStore(settings, client).get(view).schema
    visible = [c.name for c in schema.columns if not c.hidden]
    return [{c: row.get(c) for c in visible}
            for row in (decode_row(raw) for _, raw in ViewStore(client, settings.topic_prefix).scan_rows(view))]


def sources_of(planned: Planned) -> tuple[str, ...]:
    assert planned.plan is not None, f"{planned.query.id} is not planned"
    return tuple(planned.plan.sources)


@dataclass
class CatchUp:
    seconds: float
    rows: list[dict[str, Any]]
    epochs: int  # epochs the view committed
    ingest_seconds: float  # from the start until the last ingester exited (its tables complete)
    first_epoch_seconds: float | None  # from the start until the view's first commit
    startup_seconds: float | None  # from the start until the last ingester began consuming (process start-up)
    task_epochs: int = 0  # partition epochs its operator's Spark tasks wrote (MVLOG_OPERATORS_IN_TASKS)


@dataclass
class Steady:
    latencies_s: list[float]
    uncovered: int  # counted events whose epoch the view never reached (should be 0)
    epochs: int
    notes: list[str] = field(default_factory=list)

    @property
    def p50_ms(self) -> float | None:
        return percentile(self.latencies_s, 50) * 1000 if self.latencies_s else None

    @property
    def p99_ms(self) -> float | None:
        return percentile(self.latencies_s, 99) * 1000 if self.latencies_s else None


@dataclass
class MvlogNexmark:
    """Runs planned queries in mvlog on one stack (``settings_for(prefix)`` gives a run's settings)."""

    settings_for: Callable[[str], Settings]
    spark: SparkSession
    work_dir: Path
    timeout_s: float = 900.0

    def _prepare(self, prefix: str, planned: Planned, topics: NexmarkTopics
                 ) -> tuple[Settings, redis.Redis, ViewConsumer]:
        settings = self.settings_for(prefix)
        client = redis.Redis.from_url(settings.redis_url)
        create_tables(settings, topics, planned.query.tables, client=client)
        create_view(settings, planned.query.id, planned.query.sql, client=client)
        return settings, client, ViewConsumer(settings, planned.query.id, spark=self.spark, client=client)

    def catch_up(self, prefix: str, planned: Planned, topics: NexmarkTopics) -> CatchUp:
        """Ingest the filled ``topics`` and maintain the view, timed to the last event's effect committed."""
        settings, client, consumer = self._prepare(prefix, planned, topics)
        view, tables = planned.query.id, planned.query.tables
        store = ViewStore(client, settings.topic_prefix)
        sources = SourceProcesses(settings, tables, self.work_dir / prefix, until_caught_up=True)
        try:
            with MceWatch(store, [view]) as watch:
                start = time.time()
                sources.start()
                consumer.start()
                sources.wait(self.timeout_s)
                ingested = time.time()
                last = reachable_epoch(settings, client, sources_of(planned))
                consumer.wait_for_epoch(last, self.timeout_s)  # raises when the view's query failed
                reached = watch.wait_at_least(view, last, 10)
            rows = view_rows(settings, client, view)
            history = watch.history[view]
            first = history[0][0] - start if history else None
            ready = sources.ready_time()
            return CatchUp(reached - start, rows, len(history), ingested - start, first,
                           ready - start if ready is not None else None,
                           consumer.tasks.epochs_written if consumer.tasks is not None else 0)
        finally:
            sources.kill_all()
            consumer.stop()
            client.close()

    def steady(self, prefix: str, planned: Planned, phase: SteadyPhase) -> Steady:
        """Ingesters and the consumer running on ``phase.topics``; events paced at ``phase.rate``."""
        topics = phase.topics
        if topics.partitions != 1:
            raise ValueError("the steady phase maps events to offsets by their order: use 1 partition per topic")
        settings, client, consumer = self._prepare(prefix, planned, topics)
        view, tables = planned.query.id, planned.query.tables
        store = ViewStore(client, settings.topic_prefix)
        sources = SourceProcesses(settings, tables, self.work_dir / prefix, until_caught_up=False)
        try:
            with MceWatch(store, [view]) as watch:
                sources.start()
                query = consumer.start()
                # Counted events start once everything runs (as the peers' runners wait for their job).
                sources.wait_ready(self.timeout_s)
                deadline = time.monotonic() + self.timeout_s
                while query.lastProgress is None:
                    if query.exception() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{view}: the streaming query did not start: {query.exception()}")
                    time.sleep(0.05)
                produced = phase.produce()
                wait_ingested(settings, topics, tables, self.timeout_s)
                sources.stop()
                last = reachable_epoch(settings, client, sources_of(planned))
                consumer.wait_for_epoch(last, self.timeout_s)
                watch.wait_at_least(view, last, 10)
            epochs = {t: source_epochs(settings, client, t) for t in tables}
        finally:
            sources.kill_all()
            consumer.stop()
            client.close()
        # Event n -> (table, offset): its table follows from n (the generator's mix), its offset from the
        # count of earlier events of that table (one partition, an idempotent producer: no gaps).
        config = GeneratorConfig(events=phase.events)
        counts: dict[str, int] = {"person": 0, "auction": 0, "bid": 0}
        latencies: list[float] = []
        uncovered = 0
        for number, produce_time in enumerate(produced.produce_times):
            table = config.table_of(number)
            offset = counts[table]
            counts[table] += 1
            if number < produced.warmup_events or table not in tables:
                continue
            epoch = next((e for e, offsets in epochs[table] if offsets.get(0, 0) > offset), None)
            seen = watch.first_time_at_least(view, epoch) if epoch is not None else None
            if seen is None:
                uncovered += 1
            else:
                latencies.append(seen - produce_time)
        return Steady(latencies, uncovered, len(watch.history[view]))
