"""What a peer run measures, seen from outside the engine: its output topic, read as a consumer would.

The parent (mvlog's venv) never trusts an engine's own account. :class:`OutputTail` reads the engine's
output topic (``read_committed``: an exactly-once sink's rows count once their transaction commits) from a
thread of its own, keeps the output's current final result (a multiset of rows, whatever the engine's
output encoding), and notes the wall-clock time at which that result first equals the expected one (the
DuckDB oracle's over the same input records). That time, against the moment the engine's job starts,
is the catch-up figure. In the steady phase it also reads the input topics, so the produce time of each
input event (its Kafka timestamp) can be paired with the first output that reflects it
(:func:`latencies`).

Output encodings (an engine's job picks one per query):

* ``append``: one JSON object per row (value only); the result is the multiset of rows.
* ``upsert``: the key's JSON object as message key, the row's JSON object as value, or no value (a
  tombstone) for a deleted key; the result is the last row per key.
* ``diff``: one JSON object per change with a ``diff`` field (+1 insert, -1 retraction), as Pathway's
  Kafka writer emits; the result is the rows whose multiplicity is positive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from .queries import PeerQuery, Record, normalize_row

ENCODINGS = ("append", "upsert", "diff")
_json = msgspec.json.Decoder().decode  # the tail must keep up with the engines: msgspec, not json


def ensure_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0,
                 config: Mapping[str, str] | None = None) -> None:
    """Create topic ``name`` (with ``config``) when missing (an existing one is kept as it is)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if name in admin.list_topics(timeout=timeout).topics:
        return
    new = NewTopic(name, partitions, 1, config=dict(config or {}))
    for topic, future in admin.create_topics([new], operation_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as error:
            if "TOPIC_ALREADY_EXISTS" not in str(error):
                raise RuntimeError(f"cannot create topic {topic!r} on {bootstrap}: {error}") from error


def _partitions(consumer: Consumer, topic: str, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        found = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return sorted(found.partitions)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} does not exist")
        time.sleep(0.2)


def read_topics(bootstrap: str, topics: Mapping[str, str], timeout: float = 120.0) -> dict[str, list[Record]]:
    """Every record now in the given topics (table name -> topic), decoded from JSON, in offset order per
    partition: the input the oracle computes from."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mvlog-peer-oracle", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    records: dict[str, list[Record]] = {table: [] for table in topics}
    table_of = {topic: table for table, topic in topics.items()}
    try:
        assignment = [TopicPartition(topic, p, 0) for topic in topics.values() for p in _partitions(consumer, topic)]
        pending = {(tp.topic, tp.partition) for tp in assignment}
        consumer.assign(assignment)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {sorted(topics.values())} did not reach their end in {timeout:.0f} s")
            for message in consumer.consume(num_messages=5000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard((message.topic(), message.partition()))
                        continue
                    raise RuntimeError(f"reading {message.topic()}: {error}")
                records[table_of[message.topic() or ""]].append(_json(message.value() or b"null"))
    finally:
        consumer.close()
    return records


@dataclass
class TailState:
    """The output's current result against the expected one."""

    counts: dict[tuple[Any, ...], int] = field(default_factory=dict)  # the multiset of current rows
    by_key: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)  # upsert: key -> row
    expected: dict[tuple[Any, ...], int] | None = None
    differing: set[tuple[Any, ...]] = field(default_factory=set)  # rows whose count differs from expected

    def add(self, row: tuple[Any, ...], diff: int) -> None:
        count = self.counts.get(row, 0) + diff
        if count:
            self.counts[row] = count
        else:
            self.counts.pop(row, None)
        if self.expected is not None:
            if count == self.expected.get(row, 0):
                self.differing.discard(row)
            else:
                self.differing.add(row)

    def expect(self, expected: Mapping[tuple[Any, ...], int]) -> None:
        self.expected = dict(expected)
        rows = set(self.expected) | set(self.counts)
        self.differing = {row for row in rows if self.counts.get(row, 0) != self.expected.get(row, 0)}

    @property
    def matches(self) -> bool:
        return self.expected is not None and not self.differing


class OutputTail(threading.Thread):
    """Reads an engine's output topic (and, to time latencies, its input topics) until :meth:`stop`."""

    def __init__(self, bootstrap: str, query: PeerQuery, output_topic: str, encoding: str,
                 inputs: Mapping[str, str] | None = None, renames: Mapping[str, str] | None = None) -> None:
        super().__init__(name=f"peer-tail-{output_topic}", daemon=True)
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown output encoding {encoding!r}; expected one of {ENCODINGS}")
        if encoding == "upsert" and query.key is None:
            raise ValueError(f"{query.name} is append-only: its output cannot be read as upserts")
        self.bootstrap, self.query, self.output_topic, self.encoding = bootstrap, query, output_topic, encoding
        self.inputs = dict(inputs or {})  # table -> topic, read only when latencies are wanted
        self.renames = dict(renames or {})  # the engine's output column -> the query's (a name it reserves)
        self.state = TailState()
        self.lock = threading.Lock()
        self.matched_at: float | None = None  # wall clock when the result last became equal to the expected
        # ... and the broker's append time of the newest output record then (LogAppendTime output topics):
        # receipt minus this is the wait for its transaction's commit (exactly-once sinks) plus the tail's
        # own lag behind the engine's writes.
        self.matched_appended_at: float | None = None
        self.last_appended_at = 0.0
        self.last_output_at: float | None = None
        self.output_records = 0
        self.outputs: list[tuple[float, Record]] = []  # (receipt time, row) of inserted rows, when timing
        self.input_events: list[tuple[float, str, Record]] = []  # (Kafka timestamp s, table, record)
        self.error: BaseException | None = None
        self._raw: dict[tuple[Any, ...], Record] = {}  # a normalized row -> the row as the engine wrote it
        self._stopping = threading.Event()
        self._assigned = threading.Event()

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"mvlog-peer-tail-{self.output_topic}",
                             "enable.auto.commit": False, "isolation.level": "read_committed",
                             "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 5})
        try:
            table_of = {topic: table for table, topic in self.inputs.items()}
            topics = [self.output_topic, *self.inputs.values()]
            consumer.assign([TopicPartition(t, p, 0) for t in topics for p in _partitions(consumer, t)])
            self._assigned.set()
            while not self._stopping.is_set():
                messages = consumer.consume(num_messages=5000, timeout=0.05)
                received = time.time()
                with self.lock:
                    for message in messages:
                        if message.error() is not None:
                            raise RuntimeError(f"reading {message.topic()}: {message.error()}")
                        topic = message.topic()
                        if topic == self.output_topic:
                            self.last_appended_at = max(self.last_appended_at, message.timestamp()[1] / 1000)
                            self._output(message.key(), message.value(), received)
                        else:
                            record = _json(message.value() or b"null")
                            self.input_events.append((message.timestamp()[1] / 1000, table_of[topic or ""], record))
                    if messages and self.state.matches:
                        if self.matched_at is None:
                            self.matched_at = received
                            self.matched_appended_at = self.last_appended_at
                    elif messages:
                        self.matched_at = None
        except BaseException as error:  # surfaced by wait_result
            self.error = error
        finally:
            self._assigned.set()
            consumer.close()

    def _decode(self, data: bytes | None) -> Any:
        decoded = _json(data or b"null")
        if self.renames and isinstance(decoded, dict):
            for engine_name, name in self.renames.items():
                if engine_name in decoded:
                    decoded[name] = decoded.pop(engine_name)
        return decoded

    def _output(self, key: bytes | None, value: bytes | None, received: float) -> None:
        self.output_records += 1
        self.last_output_at = received
        query = self.query
        if self.encoding == "upsert":
            assert query.key is not None
            if value is None:
                key_row = self._decode(key)
                key_tuple = tuple(key_row[c] for c in query.key)
                old = self.state.by_key.pop(key_tuple, None)
                if old is not None:
                    self.state.add(old, -1)
                return
            row_dict = self._decode(value)
            row = normalize_row(query, row_dict)
            self._raw[row] = row_dict
            key_tuple = tuple(row_dict[c] for c in query.key)
            old = self.state.by_key.get(key_tuple)
            if old is not None:
                self.state.add(old, -1)
            self.state.by_key[key_tuple] = row
            self.state.add(row, 1)
            diff = 1
        else:
            row_dict = self._decode(value)
            diff = int(row_dict.get("diff", 1)) if self.encoding == "diff" else 1
            row = normalize_row(query, row_dict)
            self._raw.setdefault(row, row_dict)
            self.state.add(row, diff)
        if self.inputs and diff > 0:
            self.outputs.append((received, row_dict))

    def wait_assigned(self, timeout: float = 60.0) -> None:
        if not self._assigned.wait(timeout) or self.error is not None:
            raise RuntimeError(f"the tail of {self.output_topic!r} could not start: {self.error}")

    def expect(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Compare with ``rows`` (the oracle's result) from now on."""
        counts: dict[tuple[Any, ...], int] = {}
        for row in rows:
            counts[row] = counts.get(row, 0) + 1
        with self.lock:
            self.state.expect(counts)
            self.matched_at = time.time() if self.state.matches else None

    def wait_result(self, deadline: float, *, grace_s: float = 2.0, quiet_s: float = 60.0,
                    alive: Any = None, starting: Any = None) -> float | None:
        """The wall-clock time at which the output first equalled the expected result and stayed so for
        ``grace_s``; ``None`` when it differs and nothing was output for ``quiet_s`` (or the deadline, a
        ``time.time()``, passed, or ``alive()`` says the engine's process ended). While ``starting()`` says
        the engine is still starting its query (a JVM engine's deployment can take a minute on a loaded
        machine), silence does not count."""
        quiet_from = time.time()
        while True:
            time.sleep(0.05)
            now = time.time()
            if self.error is not None:
                raise RuntimeError(f"reading {self.output_topic!r} failed: {self.error}") from self.error
            if starting is not None and starting():
                quiet_from = now
            with self.lock:
                matched_at, last = self.matched_at, max(self.last_output_at or 0.0, quiet_from)
            if matched_at is not None and now - matched_at >= grace_s:
                return matched_at
            if matched_at is None and (now - last > quiet_s or now > deadline or (alive is not None and not alive())):
                return None

    def difference(self, limit: int = 3) -> str:
        """A short account of how the output differs from the expected result."""
        with self.lock:
            expected = self.state.expected or {}
            extra = [r for r in self.state.differing if self.state.counts.get(r, 0) > expected.get(r, 0)]
            missing = [r for r in self.state.differing if self.state.counts.get(r, 0) < expected.get(r, 0)]
            return (f"{sum(self.state.counts.values())} rows out, {sum(expected.values())} expected; "
                    f"{len(missing)} rows missing (e.g. {missing[:limit]}), {len(extra)} extra or duplicated "
                    f"(e.g. {extra[:limit]})")

    def final_rows(self) -> list[dict[str, Any]]:
        """The current result as the engine wrote its rows (values not rounded), the query's columns only."""
        with self.lock:
            return [{column: self._raw[row][column] for column in self.query.columns}
                    for row, count in sorted(self.state.counts.items(), key=repr) for _ in range(max(count, 0))]

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)


def latencies(query: PeerQuery, input_events: Sequence[tuple[float, str, Record]],
              outputs: Sequence[tuple[float, Record]], counted_from: float) -> list[float]:
    """Seconds from each counted input event's produce time (its Kafka timestamp, at or after
    ``counted_from``) to the receipt of the first output row that reflects it.

    An append-only query's rows and events are paired in order per key (one row per event). An updating
    query's row reflects the first ``query.covers(row)`` events of its key (produce order), when the query
    says how many (q17: ``total_bids``); otherwise the first row of the key received after the event was
    produced counts. Events no output ever reflects (filtered out, never joined) give no sample.
    """
    events: dict[Hashable, list[float]] = {}
    for produced, table, record in sorted(input_events, key=lambda e: e[0]):
        key = query.event_key(table, record)
        if key is not None:
            events.setdefault(key, []).append(produced)
    rows: dict[Hashable, list[tuple[float, Record]]] = {}
    for received, row in sorted(outputs, key=lambda o: o[0]):
        rows.setdefault(query.output_key(row), []).append((received, row))
    samples: list[float] = []
    for key, produced_times in events.items():
        key_rows = rows.get(key, [])
        if query.key is None:  # one row per event, in order
            pairs = zip(produced_times, (received for received, _ in key_rows), strict=False)
            samples.extend(received - produced for produced, received in pairs if produced >= counted_from)
            continue
        covers = query.covers
        for number, produced in enumerate(produced_times, start=1):
            if produced < counted_from:
                continue
            for received, row in key_rows:
                if (covers(row) >= number) if covers is not None else received >= produced:
                    samples.append(received - produced)
                    break
    return samples
