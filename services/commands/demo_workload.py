"""The demo's workload: the path a user's data takes into mvlog.

``t1`` is a source table: its changes arrive on a Kafka topic in the envelope Debezium's PostgreSQL
connector writes (JSON converter without schemas), produced here by a plain confluent-kafka producer
standing in for a database and its connector (:class:`DebeziumTopic`), and ingested by ``mvlog run-source
t1`` exactly as a user's CDC topic would be. ``t2`` is written through mvlog's own :class:`Table` API. A
real PostgreSQL with Debezium is what ``tests/integration/test_cdc_postgres.py`` runs; it takes longer to
start (Kafka Connect) than the demo's time budget allows.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer

from mvlog.config import Settings
from mvlog.services.tables.writer import Table

NAMES = ("ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo")
KEY_SPACE = 2000
#: The name the "database" gives itself in the envelope's ``source`` block (Debezium's topic.prefix).
SERVER = "demo-db"


def cdc_topic(settings: Settings, table: str) -> str:
    """The Debezium-shaped topic that feeds ``table`` (``<server>.<schema>.<table>``, under the prefix)."""
    return f"{settings.topic_prefix}.{SERVER}.public.{table}"


class DebeziumTopic:
    """A table of a database, as its Debezium connector publishes it: every write is produced as a change
    event (``before``, ``after``, ``op`` ``c|u|d``, ``source`` with a rising ``lsn``), keyed by the primary
    key; a delete is followed by the tombstone Debezium writes for log compaction.

    It keeps the rows it holds (:attr:`rows`), which is what the table must equal once ingested. The
    ``lsn`` starts at the wall clock in microseconds, so a demo reusing a prefix never writes a position
    that mvlog's redelivery filter already saw."""

    def __init__(self, settings: Settings, table: str, primary_key: str,
                 rows: Iterable[dict[str, Any]] = ()) -> None:
        self.topic = cdc_topic(settings, table)
        self.table = table
        self.primary_key = primary_key
        self.rows: dict[Any, dict[str, Any]] = {row[primary_key]: dict(row) for row in rows}
        self._lsn = time.time_ns() // 1000
        self._tx = 0
        self._producer = Producer({**settings.kafka_client_config(), "enable.idempotence": True,
                                   "linger.ms": 20})

    def write(self, upserts: Iterable[dict[str, Any]], deletes: Iterable[Any]) -> int:
        """One database transaction: its changes produced in order; returns how many."""
        self._tx += 1
        produced = 0
        for row in upserts:
            key = row[self.primary_key]
            before = self.rows.get(key)
            self.rows[key] = dict(row)
            self._produce(key, "c" if before is None else "u", before, dict(row))
            produced += 1
        for key in deletes:
            before = self.rows.pop(key, None)
            if before is None:
                continue  # no such row: the database writes nothing
            self._produce(key, "d", before, None)
            self._producer.produce(self.topic, key=self._key(key), value=None)  # the tombstone
            produced += 1
        self._producer.poll(0)
        return produced

    def flush(self, timeout: float = 30.0) -> None:
        """Until every change is acknowledged by the broker."""
        if self._producer.flush(timeout) > 0:
            raise KafkaException(f"{self.topic}: changes still unacknowledged after {timeout:.0f} s")

    def _key(self, key: Any) -> bytes:
        return json.dumps({self.primary_key: key}).encode()

    def _produce(self, key: Any, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        self._lsn += 1
        now_ms = time.time_ns() // 1_000_000
        source = {"version": "3.3.2.Final", "connector": "postgresql", "name": SERVER, "ts_ms": now_ms,
                  "snapshot": "false", "db": "demo", "schema": "public", "table": self.table,
                  "txId": self._tx, "lsn": self._lsn}
        event = {"before": before, "after": after, "source": source, "op": op, "ts_ms": now_ms}
        while True:
            try:
                self._producer.produce(self.topic, key=self._key(key), value=json.dumps(event).encode())
                return
            except BufferError:  # the producer's queue is full: let it drain
                self._producer.poll(0.1)


@dataclass
class Workload:
    """Inserts, updates and deletes at about ``rate`` changes per second: t1's through its Debezium topic,
    t2's through the :class:`Table` API."""

    t1: DebeziumTopic
    t2: Table
    rate: int
    seed: int = 0
    changes: int = 0
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mvlog-demo-workload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop writing, and wait until the last of t1's changes is on the broker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.t1.flush()

    def _run(self) -> None:
        rng = random.Random(self.seed)
        tick = 0.1
        owed = 0.0
        next_tick = time.monotonic()
        try:
            while not self._stop.is_set():
                owed += self.rate * tick
                count, owed = int(owed), owed - int(owed)
                self._write(rng, count)
                self.changes += count
                next_tick += tick
                self._stop.wait(max(0.0, next_tick - time.monotonic()))
        except BaseException as error:  # the supervisor reports it
            self.error = error

    def _write(self, rng: random.Random, count: int) -> None:
        t1_rows: dict[int, dict[str, Any]] = {}
        t1_deletes: list[int] = []
        t2_rows: list[dict[str, Any]] = []
        t2_deletes: list[int] = []
        for _ in range(count):
            draw, key = rng.random(), rng.randrange(KEY_SPACE)
            if draw < 0.65:  # insert or update (a tenth of them mark the row deleted)
                t1_rows[key] = {"id": key, "v1": rng.randrange(1000), "deleted": rng.random() < 0.1}
            elif draw < 0.75:
                t1_deletes.append(key)
            elif draw < 0.95:
                t2_rows.append({"id": key, "name": f"{rng.choice(NAMES)}{rng.randrange(100)}"})
            else:
                t2_deletes.append(key)
        self.t1.write(t1_rows.values(), t1_deletes)
        if t2_rows:
            self.t2.upsert(t2_rows)
        if t2_deletes:
            self.t2.delete(t2_deletes)
