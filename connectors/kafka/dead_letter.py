"""The dead-letter topic of a view's changelog readers: records they cannot use, kept with the reason.

A poison record (malformed Avro, another schema, too large, no key, not an mvlog record at all) is
copied to ``<prefix>.<view>.dlq`` with headers saying why and where it came from, and the reader goes
on: one bad record never stops a view, and nothing is silently dropped. Headers:

``mvlog.dlq.reason``  the problem, naming topic, partition and offset
``mvlog.dlq.topic`` / ``mvlog.dlq.partition`` / ``mvlog.dlq.offset``  where the record was
``mvlog.dlq.size``    its original value size (a record too large is kept without its value)
``mvlog.dlq.key``     its original key (when it had one)

Every reader of a changelog dead-letters what it reads, so a poison record may be sent more than once;
the topic is compacted and keyed by ``topic/partition/offset``, so compaction keeps one copy of each.

A source table's ingester (:mod:`mvlog.services.sources`) writes the bad records of its topic
(undecodable, no key, wrong types, a row the table refuses) to ``<prefix>.<table>.dlq`` with the same
headers, through :func:`dead_letter_record`, but inside the epoch's own Kafka transaction: a
``read_committed`` reader of that topic sees each bad record exactly once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_records import PoisonRecord
from mvlog.connectors.kafka.topics import ensure_topic

log = logging.getLogger(__name__)

DLQ_MAX_VALUE_BYTES = 900_000  # under Kafka's default message.max.bytes


DlqHeaders = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """A record for a dead-letter topic: keyed by where the poison record was, with the headers above."""

    topic: str
    key: bytes
    value: bytes | None
    headers: DlqHeaders


def dead_letter_record(topic: str, poison: PoisonRecord, key: bytes | None, value: bytes | None,
                       headers: Any = None, max_value_bytes: int = DLQ_MAX_VALUE_BYTES) -> DeadLetterRecord:
    """The dead-letter record of ``poison`` (one place for the headers, so every writer of a dead-letter
    topic, view readers and source ingesters alike, writes the same ones). A value above
    ``max_value_bytes`` is left out (``mvlog.dlq.size`` still says how large it was)."""
    size = len(value or b"")
    original = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    dlq_headers: DlqHeaders = [
        *original, *([("mvlog.dlq.key", key)] if key is not None else []),
        ("mvlog.dlq.reason", poison.reason), ("mvlog.dlq.topic", poison.topic),
        ("mvlog.dlq.partition", str(poison.partition)), ("mvlog.dlq.offset", str(poison.offset)),
        ("mvlog.dlq.size", str(size))]
    where = f"{poison.topic}/{poison.partition}/{poison.offset}".encode()
    return DeadLetterRecord(topic, where, value if size <= max_value_bytes else None, dlq_headers)


class DeadLetterError(RuntimeError):
    """A poison record could not be written to the dead-letter topic (so the reader must stop)."""


class DeadLetterQueue:
    def __init__(self, settings: Settings, view: str) -> None:
        self.settings = settings
        self.topic = settings.dead_letter_topic_of(view)
        self._producer: Producer | None = None
        self.sent = 0

    def send(self, poison: PoisonRecord, key: bytes | None, value: bytes | None,
             headers: Any = None) -> None:
        """Write the record and why it is poison; returns once the broker has it."""
        log.warning("dead-lettered to %s: %s", self.topic, poison.reason)
        if self._producer is None:
            ensure_topic(self.settings, self.topic, 1, {"cleanup.policy": "compact"})
            self._producer = Producer({**self.settings.kafka_client_config(), "enable.idempotence": True})
        record = dead_letter_record(self.topic, poison, key, value, headers)
        self._producer.produce(record.topic, record.value, record.key, headers=record.headers)
        if self._producer.flush(30) != 0:
            raise DeadLetterError(f"could not write to {self.topic}: {poison.reason}")
        self.sent += 1

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer.close()
            self._producer = None
