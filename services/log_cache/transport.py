"""How the log-cache worker reads Kafka (see :mod:`~mvlog.services.log_cache.worker`): Faust's consumer only
takes part in the consumer group (:class:`CacheApp`, every partition it is assigned paused in aiokafka),
and one confluent-kafka consumer per upstream (:class:`UpstreamConsumer`) fetches the records of the
partitions Faust assigned; plus the Arrow memory pool the worker allocates from."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust
import pyarrow as pa
from aiokafka.structs import TopicPartition as AIOKafkaTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

from mvlog.config import Settings

CONSUME_MESSAGES = 4000  # records per consume call (one feed step, decoded at once)
CONSUME_WAIT_S = 0.1
# librdkafka's pre-fetch queue of each upstream's consumer, and one fetch response (which may land on a
# full queue). At 1 MiB fetches into a 4 MiB queue a worker followed 30k changes/s falling behind by a
# second per epoch, waiting in consume() (py-spy: 2 % of its time decoding); the readers' sizes (16 MiB
# fetches, a 32 MiB queue) are halved here, as the worker holds them for every upstream (I4).
QUEUED_KIB = 16 * 1024
FETCH_MAX_BYTES = 8 * 1024 * 1024
FETCH_BYTES = QUEUED_KIB * 1024 + FETCH_MAX_BYTES  # records in flight per upstream besides the cache (I4)


def use_returning_memory_pool() -> str:
    """Make Arrow allocate from a pool that gives freed memory back, for this process (I4).

    pyarrow's default pool is mimalloc, which keeps much of what a worker frees (the builders' transient
    buffers, evicted epochs) in its segments: ``bench/cache.py`` measured the worker's peak RSS 130 MiB
    above idle for a 64 MiB cache with mimalloc, 96 MiB with jemalloc or the system allocator (Arrow's
    own count was 64 MiB in every case). jemalloc with decay 0 purges freed pages at once.
    """
    try:
        pool = pa.jemalloc_memory_pool()
        pa.jemalloc_set_decay_ms(0)
    except NotImplementedError:  # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    return str(pool.backend_name)


class BoundedFetchThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread with every assigned partition paused in aiokafka: the records come through
    the upstreams' confluent-kafka consumers (see the module's docstring), so aiokafka's fetcher must not
    fetch them too (Faust's own pause only filters what it hands out). ``fetch_max_bytes`` bounded all
    the same (not a Faust setting; 50 MB by default)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_bytes = FETCH_MAX_BYTES  # read by the fetcher aiokafka creates at start()
        return consumer

    async def on_partitions_assigned(self, assigned: Any, generation_id: int = 0) -> None:
        self._ensure_consumer().pause(*(AIOKafkaTopicPartition(tp.topic, tp.partition) for tp in assigned))
        await super().on_partitions_assigned(assigned, generation_id)


class BoundedFetchConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return BoundedFetchThread(self, loop=self.loop, beacon=self.beacon)


class BoundedFetchTransport(faust_aiokafka.Transport):
    Consumer = BoundedFetchConsumer


class UpstreamConsumer:
    """The confluent-kafka consumer of one upstream's partitions held by this worker.

    Every call goes through one thread of its own (:meth:`call`): ``consume`` waits there, off the event
    loop, and ``close`` can never run while a ``consume`` is under way. It is ``assign()``-ed only (Faust's
    consumer is the group member): it reads the group's committed offsets to start from, and commits none.
    """

    def __init__(self, settings: Settings, group_id: str, topic: str) -> None:
        self.topic = topic
        self.assigned: list[int] = []
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cache-{topic}")
        self._consumer = Consumer({
            **settings.kafka_client_config(),
            "group.id": group_id,
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": FETCH_MAX_BYTES,
            "max.partition.fetch.bytes": FETCH_MAX_BYTES // 2,
            "queued.max.messages.kbytes": QUEUED_KIB,
            "fetch.wait.max.ms": 50,
            # After a full queue librdkafka waits this long before the next fetch (1 s by default): a worker
            # taking an epoch's burst of records off a full queue then lagged its writer by seconds.
            "fetch.queue.backoff.ms": 5,
        })

    async def call(self, method: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, method, *args)

    def assign(self, partitions: list[int]) -> None:
        """Read ``partitions`` from where the group left them (its committed offsets), or the start."""
        if not partitions:
            if self.assigned:
                self._consumer.unassign()
            self.assigned = []
            return
        committed = self._consumer.committed([TopicPartition(self.topic, p) for p in partitions], timeout=10)
        starts = [(tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING) for tp in committed]
        self._consumer.assign([TopicPartition(self.topic, partition, offset) for partition, offset in starts])
        self.assigned = list(partitions)

    def consume(self) -> list[Any]:
        if not self.assigned:
            return []
        messages: list[Any] = self._consumer.consume(CONSUME_MESSAGES, CONSUME_WAIT_S)
        return messages

    def pause(self, partitions: list[int]) -> None:
        self._consumer.pause([TopicPartition(self.topic, p) for p in partitions])

    def resume(self, partitions: list[int]) -> None:
        self._consumer.resume([TopicPartition(self.topic, p) for p in partitions])

    def close(self) -> None:
        self._thread.submit(self._consumer.close)
        self._thread.shutdown(wait=False)


class CacheApp(faust.App):
    """The worker's Faust app, on the transport whose consumer fetches nothing itself."""

    def _new_transport(self) -> Any:
        return BoundedFetchTransport(self.conf.broker_consumer, self)
