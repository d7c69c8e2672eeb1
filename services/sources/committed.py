"""What a source table's committed epochs recorded on their barriers, read back when an ingester starts.

Each epoch of a source table carries, on its barriers, the running total of dead letters and (for
``debezium-json``) each key's last applied source position (:mod:`mvlog.source_offsets`). Kafka is the
truth: a new :class:`~mvlog.services.sources.ingester.SourceIngester` reads them from the table's changelog,
never from Redis, so a killed ingester's last epoch counts whether or not Redis applied it.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import TopicPartition

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import next_records, reader_consumer
from mvlog.row_schema import Key
from mvlog.schemas.codec import HEADER_TYPE, TYPE_BARRIER, decode_barrier
from mvlog.services.tables.writer import Table
from mvlog.source_offsets import dead_letters_of, positions_of

log = logging.getLogger(__name__)


def committed_dead_letters(settings: Settings, table: Table) -> int | None:
    """The running total of dead letters on the barrier of ``table``'s last committed epoch (in its
    changelog's partition 0, found by the epoch index), 0 before the first epoch; None when that barrier
    was not read within 30 s (the caller stops the source, naming it)."""
    name = table.entry.name
    mce = table.store.mce(name)
    entry = table.store.index.at(name, 0, mce) if mce is not None else None
    if entry is None:
        return 0
    topic = settings.changelog_topic(name)
    consumer = reader_consumer(settings)
    try:
        consumer.assign([TopicPartition(topic, 0, entry.offset)])
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            for message in next_records(consumer, 0.5):
                value, offset = message.value(), message.offset()
                if message.error() is not None or offset is None:
                    continue
                if offset >= entry.offset and value is not None and \
                        (HEADER_TYPE, TYPE_BARRIER) in (message.headers() or []):
                    return dead_letters_of(decode_barrier(value).mutation)
        log.warning("%s: the barrier of its last epoch %d (%s[0]@%d) was not read within 30 s", name, mce, topic,
                    entry.offset)
        return None
    finally:
        consumer.close()


def committed_positions(settings: Settings, table: str, idle: float = 2.0) -> list[tuple[Key, int]]:
    """The per-key source positions every committed epoch of ``table`` recorded, in epoch order, read
    from the barriers of its changelog's partition 0 (each epoch's barrier there holds them all; a
    ``read_committed`` read sees no aborted epoch). Reads the whole partition: its cost grows with the
    table's log (bounded by its retention), paid once per ingester start."""
    topic = settings.changelog_topic(table)
    consumer = reader_consumer(settings)
    found: list[tuple[Key, int]] = []
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 15.0, False)
        if high <= low:
            return found
        consumer.assign([TopicPartition(topic, 0, low)])
        last_record = time.monotonic()
        while time.monotonic() - last_record < idle:
            for message in next_records(consumer, 0.2):
                last_record = time.monotonic()
                offset, value = message.offset(), message.value()
                if message.error() is not None or offset is None:
                    continue
                if (HEADER_TYPE, TYPE_BARRIER) in (message.headers() or []) and value is not None:
                    found.extend(positions_of(decode_barrier(value).mutation))
                if offset + 1 >= high:
                    return found
            if consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
                return found
        return found
    finally:
        consumer.close()


__all__ = ["committed_dead_letters", "committed_positions"]
