"""The barriers one changelog partition committed from an offset to its end, read ``read_committed``.

A Spark task that writes one partition of a view's epochs reads them after fencing the partition's
earlier writers (``init_transactions`` of its transactional id aborts their open transaction), so what
it reads is all that partition will ever hold of those epochs: see :mod:`mvlog.partition_epochs`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, TopicPartition

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReadError, next_records, reader_consumer
from mvlog.partition_epochs import PartitionBarrier
from mvlog.schemas.codec import TYPE_BARRIER, decode_barrier, record_type

TAIL_TIMEOUT_S = 60.0
#: How long the broker holds a fetch that finds nothing (Kafka's default, 500 ms, is for a consumer
#: waiting for new records): the end of the partition is what this read is after, and each Spark task of a
#: view in tasks reads its partition's tail once per micro-batch, mostly finding nothing after the MCE.
TAIL_FETCH_WAIT_MS = 10


def partition_barriers(settings: Settings, view: str, partition: int, start_offset: int,
                       timeout: float = TAIL_TIMEOUT_S) -> list[PartitionBarrier]:
    """Committed barriers of ``view``'s changelog partition from ``start_offset`` to its end, in order."""
    topic = settings.changelog_topic(view)
    consumer = reader_consumer(settings, {"enable.partition.eof": True, "fetch.wait.max.ms": TAIL_FETCH_WAIT_MS})
    found: list[PartitionBarrier] = []
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, partition, start_offset)])
        while True:
            if time.monotonic() > deadline:
                raise ChangelogReadError(f"{topic} partition {partition}: its end was not reached in {timeout:.0f} s")
            for message in next_records(consumer):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return found
                    raise ChangelogReadError(f"{topic} partition {partition}: {error}")
                if record_type(message.headers()) == TYPE_BARRIER:
                    barrier = decode_barrier(message.value() or b"")
                    found.append(PartitionBarrier(barrier.epoch, barrier.prev_epoch, message.offset() or 0,
                                                  barrier.records, barrier.mutation))
    finally:
        consumer.close()


def barriers_above(settings: Settings, view: str, partitions: int, start_offsets: Mapping[int, int]
                   ) -> dict[int, list[PartitionBarrier]]:
    """Per partition of ``view``, the committed barriers from ``start_offsets`` (per partition, the first
    offset after the MCE's barrier: the epoch index's ``offsets_after``) to its end: what an attempt committed
    there above the MCE, read by a driver that must complete or redo it (a chunk, a cut-over)."""
    return {partition: partition_barriers(settings, view, partition, start_offsets.get(partition, 0))
            for partition in range(partitions)}
