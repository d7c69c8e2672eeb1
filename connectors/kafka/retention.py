"""What a changelog still retains: each partition's low watermark, the epochs Kafka still holds whole,
and whether the log's first epoch is still there (nothing was lost to retention before it).

Nothing trims the epoch index when Kafka's retention deletes segments: what is retained is always the
index compared with the low watermarks (:attr:`IndexEntry.first_offset`), never the index alone.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import reader_consumer
from mvlog.connectors.kafka.topics import describe_config
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.replay import RetainedRange, retained_range
from mvlog.schemas.codec import DecodeError, decode_barrier

#: What a partition of a topic created a moment ago answers until its leader is elected.
_NOT_SERVED_YET = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
                             KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError._TRANSPORT})


def low_watermarks(settings: Settings, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, int]:
    """Each partition's first retained offset.

    A topic created a moment ago may not have a leader yet for every partition (NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_TOPIC_OR_PART): a retriable error is asked again until ``timeout``."""
    consumer = reader_consumer(settings)
    deadline = time.monotonic() + timeout
    try:
        lows: dict[int, int] = {}
        for p in range(partitions):
            while p not in lows:
                try:
                    lows[p] = max(0, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0])
                except KafkaException as error:
                    code = error.args[0].code()
                    if not (error.args[0].retriable() or code in _NOT_SERVED_YET) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        return lows
    finally:
        consumer.close()


def retained_epochs(settings: Settings, index: EpochIndex, view: str, partitions: int) -> RetainedRange:
    """The epochs every partition of ``view``'s changelog still holds whole: from the oldest indexed epoch
    none of whose records retention deleted, to the latest indexed one (ReplayRangeError when none)."""
    lows = low_watermarks(settings, settings.changelog_topic(view), partitions)
    return retained_range(view, {p: index.first_retained(view, p, lows[p]) for p in range(partitions)},
                          {p: index.latest(view, p) for p in range(partitions)})


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
    return describe_config(settings, ConfigResource(ConfigResource.Type.TOPIC, topic), timeout)
