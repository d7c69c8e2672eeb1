"""Which committed epochs are checkpoints: the flag is on the epoch's barriers in Kafka (the epoch index
holds only where they are), so the barrier is read back at its indexed offset.

Snapshots are taken at checkpoint epochs. Every ``checkpoint_frequency``-th barrier of a table writer is
one (view consumers mark every epoch), so the walk back from an epoch is short.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from mvlog.changes import Barrier
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import reader_consumer
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.schemas.codec import DecodeError, decode_barrier


def latest_checkpoint(settings: Settings, index: EpochIndex, view: str, at_or_before: int,
                      max_steps: int = 10_000) -> int | None:
    """The newest checkpoint epoch of ``view`` at or below ``at_or_before`` (None: none indexed)."""
    topic = settings.changelog_topic(view)
    consumer = reader_consumer(settings)
    try:
        entry = index.at(view, 0, at_or_before) or index.before(view, 0, at_or_before)
        for _ in range(max_steps):
            if entry is None:
                return None
            barrier = _barrier_at(consumer, topic, entry.offset)
            if barrier is not None and barrier.epoch == entry.epoch and barrier.checkpoint:
                return entry.epoch
            entry = index.before(view, 0, entry.epoch)
        return None
    finally:
        consumer.close()


def _barrier_at(consumer: Consumer, topic: str, offset: int) -> Barrier | None:
    consumer.assign([TopicPartition(topic, 0, offset)])
    message = consumer.poll(10.0)
    if message is None or message.error() is not None or message.offset() != offset:
        return None
    try:
        return decode_barrier(message.value() or b"")
    except DecodeError:
        return None
