"""Reader consumers kept between reads in one process, as Spark's Kafka source caches its consumers.

An executor's Python worker reads one partition range per task, micro-batch after micro-batch, and a
new consumer costs a connection, metadata and a first fetch before its first record (20-100 ms here,
as much as reading 20k records). A consumer whose read finished is unassigned and kept for the next
read with the same client settings; one whose read failed or stopped half-way is closed instead, so no
state of an interrupted read carries over.
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer

from mvlog.config import Settings
from mvlog.connectors.changelog_reader import reader_consumer


class ConsumerPool:
    """At most ``capacity`` idle consumers, reused for reads with the same client settings."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self._idle: list[tuple[str, Consumer]] = []
        self._lock = threading.Lock()
        self.created = 0  # consumers made, for tests and benchmarks

    @contextmanager
    def lease(self, settings: Settings) -> Iterator[Consumer]:
        """A reader consumer (see :func:`reader_consumer`) with no assignment, for one read."""
        key = json.dumps(settings.kafka_client_config(), sort_keys=True, default=str)
        consumer = self._take(key)
        if consumer is None:
            consumer = reader_consumer(settings)
            self.created += 1
        try:
            yield consumer
        except BaseException:  # includes GeneratorExit: a read stopped half-way
            consumer.close()
            raise
        consumer.unassign()  # drops the read's partitions and the records prefetched for them
        self._give_back(key, consumer)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, consumer in idle:
            consumer.close()

    def _take(self, key: str) -> Consumer | None:
        with self._lock:
            for i, (held, consumer) in enumerate(self._idle):
                if held == key:
                    del self._idle[i]
                    return consumer
        return None

    def _give_back(self, key: str, consumer: Consumer) -> None:
        with self._lock:
            self._idle.append((key, consumer))
            evicted = self._idle[:-self.capacity] if len(self._idle) > self.capacity else []
            del self._idle[:len(evicted)]
        for _, old in evicted:
            old.close()


#: The process's pool (a Spark Python worker runs its tasks one after the other).
reader_pool = ConsumerPool()
atexit.register(reader_pool.close)
