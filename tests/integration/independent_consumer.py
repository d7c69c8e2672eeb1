"""A consumer of mvlog changelogs written with plain confluent-kafka and fastavro over the ``.avsc``
files: no mvlog code, so the tests prove the wire format is readable by any client."""

from __future__ import annotations

import io
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from fastavro import parse_schema, schemaless_reader

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _schema(name: str) -> Any:
    return parse_schema(json.loads((SCHEMAS / f"{name}.avsc").read_text()))


CHANGE, BARRIER, KEY = _schema("change_event"), _schema("barrier"), _schema("key")


@dataclass
class PartitionLog:
    # epoch -> list of (offset, change) and the barriers (offset, record) seen for it
    changes: dict[int, list[tuple[int, dict[str, Any]]]] = field(default_factory=lambda: defaultdict(list))
    barriers: dict[int, list[tuple[int, dict[str, Any]]]] = field(default_factory=lambda: defaultdict(list))
    order: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, epoch, offset) in log order


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each non-empty partition's high watermark: the end of what the topic holds, open transactions too.
    Asked with read_uncommitted: read_committed answers the last stable offset, which stays behind a
    transaction for a moment after its commit returned (its markers are written after that)."""
    client = Consumer({"bootstrap.servers": bootstrap, "group.id": "independent-ends",
                       "isolation.level": "read_uncommitted"})
    try:
        marks = {p: client.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)}
    finally:
        client.close()
    return {p: high for p, (low, high) in marks.items() if high > low}


#: How long :func:`read_topic` waits for a first record, however short its ``idle``.
FIRST_RECORD_WAIT = 10.0


def read_topic(bootstrap: str, topic: str, partitions: int, idle: float = 3.0,
               max_seconds: float = 120.0) -> dict[int, PartitionLog]:
    """Read what the topic held when the read began: until every partition's position reached its high
    watermark of then (read_committed moves a position past the markers of committed and aborted
    transactions), or no record came for ``idle`` seconds (a transaction still open holds a position
    back; before the first record, ``FIRST_RECORD_WAIT`` seconds at least: a consumer's first fetch takes
    longer on a busy machine), or ``max_seconds`` passed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "independent", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    ends = _high_watermarks(bootstrap, topic, partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    logs = {p: PartitionLog() for p in range(partitions)}
    started = time.monotonic()
    last: float | None = None  # when the last record came

    def at_ends() -> bool:
        positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
        return all(tp.offset >= ends[tp.partition] for tp in positions if tp.partition in ends)

    try:
        while (time.monotonic() - (last or started) < (idle if last is not None else max(idle, FIRST_RECORD_WAIT))
               and time.monotonic() - started < max_seconds and not at_ends()):
            # What is queued, else the next record: consume(n, t) waits all of t unless n records are queued.
            messages = consumer.consume(1000, timeout=0) or consumer.consume(1, timeout=0.3)
            for msg in messages:
                assert msg.error() is None, msg.error()
                last = time.monotonic()
                kind = dict(msg.headers() or [])["mvlog.type"]
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                log = logs[partition]
                value: Any = msg.value()
                if kind == b"barrier":
                    barrier: Any = schemaless_reader(io.BytesIO(value), BARRIER, None)
                    log.barriers[barrier["epoch"]].append((offset, barrier))
                    log.order.append(("barrier", barrier["epoch"], offset))
                else:
                    change: Any = schemaless_reader(io.BytesIO(value), CHANGE, None)
                    change["key"] = schemaless_reader(io.BytesIO(msg.key() or b""), KEY, None)
                    epoch = change["source"]["epoch"]
                    log.changes[epoch].append((offset, change))
                    log.order.append(("change", epoch, offset))
    finally:
        consumer.close()
    return logs


def committed_epochs(logs: dict[int, PartitionLog]) -> set[int]:
    """The protocol's commit rule, as any client can apply it: an epoch is committed once a later
    barrier names it as ``prev_epoch`` (a writer names only epochs whose transaction committed). It
    also holds where a broker delivers the records of aborted transactions (Tansu 0.6 does)."""
    named = {b["prev_epoch"] for log in logs.values() for entries in log.barriers.values() for _, b in entries}
    # A read that stopped while the writer was writing holds a prefix of each partition: only epochs up
    # to the last barrier every partition has reached can be judged.
    reached = min((max(log.barriers, default=0) for log in logs.values()), default=0)
    return {e for log in logs.values() for e in log.barriers if e <= reached} & named


def check_whole_epochs(logs: dict[int, PartitionLog]) -> set[int]:
    """Assert every committed epoch is whole: one barrier per partition, after exactly its announced
    changes. Returns the committed epochs."""
    epochs = committed_epochs(logs)
    for epoch in epochs:
        for partition, log in logs.items():
            barriers = log.barriers.get(epoch, [])
            assert len(barriers) == 1, f"epoch {epoch} has {len(barriers)} barriers in partition {partition}"
            offset, barrier = barriers[0]
            changes = log.changes.get(epoch, [])
            assert barrier["records"] == len(changes), (epoch, partition, barrier["records"], len(changes))
            assert all(o < offset for o, _ in changes), "a change after its epoch's barrier"
    for log in logs.values():  # within a partition, committed epochs never interleave
        seen_epochs = [e for _, e, _ in log.order if e in epochs]
        assert seen_epochs == sorted(seen_epochs)
    return epochs
