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
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Producer

from mvlog.config import Settings
from mvlog.connectors.changelog_records import PoisonRecord
from mvlog.connectors.topics import ensure_topic

log = logging.getLogger(__name__)

DLQ_MAX_VALUE_BYTES = 900_000  # under Kafka's default message.max.bytes


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
        size = len(value or b"")
        kept = value if size <= DLQ_MAX_VALUE_BYTES else None
        original = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        dlq_headers: list[tuple[str, str | bytes | None]] = [
            *original, *([("mvlog.dlq.key", key)] if key is not None else []),
            ("mvlog.dlq.reason", poison.reason), ("mvlog.dlq.topic", poison.topic),
            ("mvlog.dlq.partition", str(poison.partition)), ("mvlog.dlq.offset", str(poison.offset)),
            ("mvlog.dlq.size", str(size))]
        where = f"{poison.topic}/{poison.partition}/{poison.offset}".encode()
        self._producer.produce(self.topic, kept, where, headers=dlq_headers)
        if self._producer.flush(30) != 0:
            raise DeadLetterError(f"could not write to {self.topic}: {poison.reason}")
        self.sent += 1

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer.close()
            self._producer = None
