"""What a changelog still retains: each partition's low watermark, and whether the log's first epoch
is still there (nothing was lost to retention before the oldest indexed epoch).

The low watermark is exact on every broker (only Tansu's *high* watermark is not), so it is safe to
use here; the end of an epoch is always taken from its barrier.
"""

from __future__ import annotations

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from mvlog.config import Settings
from mvlog.connectors.changelog_reader import reader_consumer
from mvlog.connectors.epoch_index import EpochIndex
from mvlog.schemas.codec import DecodeError, decode_barrier


def low_watermarks(settings: Settings, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's first retained offset."""
    consumer = reader_consumer(settings)
    try:
        return {p: max(0, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0])
                for p in range(partitions)}
    finally:
        consumer.close()


def has_records(settings: Settings, topic: str, partitions: int) -> bool:
    """Whether any partition holds a record (a high watermark above 0 says so even on Tansu, whose high
    watermark is otherwise not the end of the log)."""
    consumer = reader_consumer(settings)
    try:
        return any(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] > 0
                   for p in range(partitions))
    finally:
        consumer.close()


def starts_the_log(settings: Settings, index: EpochIndex, view: str) -> bool:
    """Whether the oldest indexed epoch of ``view`` is its changelog's first (its barrier names no previous
    epoch) and partition 0 still holds it from offset 0: then the whole history is retained."""
    oldest = index.oldest(view, 0)
    topic = settings.changelog_topic(view)
    if oldest is None or low_watermarks(settings, topic, 1)[0] > 0:
        return False
    consumer = reader_consumer(settings)
    try:
        consumer.assign([TopicPartition(topic, 0, oldest.offset)])
        message = consumer.poll(10.0)
        if message is None or message.error() is not None or message.offset() != oldest.offset:
            return False
        try:
            return decode_barrier(message.value() or b"").prev_epoch == 0
        except DecodeError:
            return False
    finally:
        consumer.close()


def topic_config(settings: Settings, topic: str, timeout: float = 10.0) -> dict[str, str]:
    """The settings a topic has of its own (broker defaults are not listed by every broker)."""
    admin = AdminClient(settings.kafka_client_config())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout)
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}
