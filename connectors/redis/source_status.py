"""What operators see of a source table's ingestion: its dead-letter count, its problem, its lag.

Redis (``<prefix>:{<table>}:source`` hash, written by the table's ingester and the lag sampler):

``dead_letters``  bad records dead-lettered so far: the running total of the last committed epoch's
                  barrier (:func:`mvlog.source_offsets.dead_letters_of`), set (never incremented) after
                  each commit, so it is exact after a SIGKILL and rebuilt from Kafka by the next ingester
``problem``       why the ingester stopped (retention passed its offsets, the topic is gone, ...), with
                  what to do; cleared when an ingester starts
``lag``           the newest :class:`~mvlog.source_lag.SourceLag` as JSON (the lag sampler's)

:class:`SourceLagProbe` measures the lag from Kafka: the group's committed offsets, the topic's start
and end offsets (``read_committed``: the last stable offset), and the timestamp of the first message
not ingested yet on each lagging partition. It asks Kafka, not the ingester, so a stopped ingester
shows a growing lag. Its cost per sample is a metadata request, one offsets request per source table
and two for all partitions, and one small fetch per lagging partition.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import cast

import redis
from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import next_records, reader_consumer
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.source_lag import PartitionPosition, SourceLag, SourceState, missing_topic, source_lag
from mvlog.source_spec import SourceSpec, source_group

log = logging.getLogger(__name__)


def source_key(prefix: str, table: str) -> str:
    return view_key(prefix, table, "source")


class SourceStatusStore:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def set_dead_letters(self, table: str, total: int) -> None:
        self.redis.hset(source_key(self.prefix, table), "dead_letters", total)

    def set_problem(self, table: str, problem: str | None) -> None:
        if problem:
            self.redis.hset(source_key(self.prefix, table), "problem", problem)
        else:
            self.redis.hdel(source_key(self.prefix, table), "problem")

    def forget(self, table: str) -> None:
        self.redis.delete(source_key(self.prefix, table))

    def record_lag(self, lags: Sequence[SourceLag]) -> None:
        if not lags:
            return
        pipe = self.redis.pipeline(transaction=False)
        for lag in lags:
            pipe.hset(source_key(self.prefix, lag.table), "lag", json.dumps(lag.to_json()))
        pipe.execute()

    def read(self, settings: Settings, entries: Sequence[CatalogEntry]) -> dict[str, SourceState]:
        """The state of every source table among ``entries`` (one round trip); lag as last recorded."""
        sources = [(e, spec) for e in entries if e.kind == "table"
                   and (spec := SourceSpec.from_options(e.options)) is not None]
        if not sources:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for entry, _ in sources:
            pipe.hgetall(source_key(self.prefix, entry.name))
        found = {}
        for (entry, spec), raw in zip(sources, pipe.execute(), strict=True):
            fields = {k.decode(): v.decode() for k, v in cast(dict[bytes, bytes], raw).items()}
            lag = SourceLag.from_json(json.loads(fields["lag"])) if fields.get("lag") else None
            found[entry.name] = SourceState(spec.topic, spec.format.value, int(fields.get("dead_letters", 0)),
                                            settings.dead_letter_topic_of(entry.name), fields.get("problem") or None,
                                            lag)
        return found


class SourceLagProbe:
    """Measures source tables' lag from Kafka (see module doc); keep one per sampler, :meth:`close` it."""

    def __init__(self, settings: Settings, timeout: float = 5.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._admin = AdminClient(settings.kafka_client_config())
        self._consumer = reader_consumer(settings, {"enable.partition.eof": False})

    def measure(self, entries: Sequence[CatalogEntry], now_ms: int | None = None) -> list[SourceLag]:
        """The lag of every source table among ``entries``; raises KafkaException when Kafka does not
        answer within the timeout (the caller shows the lag as unknown)."""
        sources = [(e.name, spec.topic) for e in entries if e.kind == "table"
                   and (spec := SourceSpec.from_options(e.options)) is not None]
        if not sources:
            return []
        now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        topics = self._admin.list_topics(timeout=self.timeout).topics
        partitions: dict[str, list[int]] = {}
        for _, topic in sources:
            found = topics.get(topic)
            if found is not None and found.error is None:
                partitions[topic] = sorted(found.partitions)
        tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
        starts = self._offsets(tps, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        ends = self._offsets(tps, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        committed: dict[str, dict[int, int]] = {}
        for table, topic in sources:
            if topic in partitions:
                committed[table] = self._committed(source_group(self.settings.topic_prefix, table), topic,
                                                   partitions[topic])
        # The first unread message of each lagging partition, for its timestamp (one fetch for all).
        unread = {(t, p): max(committed.get(table, {}).get(p, starts[(t, p)]), starts[(t, p)])
                  for table, t in sources if t in partitions for p in partitions[t]}
        stamps = self._first_timestamps({tp: o for tp, o in unread.items() if o < ends[tp]})
        lags = []
        for table, topic in sources:
            if topic not in partitions:
                lags.append(missing_topic(table, topic, now_ms))
                continue
            positions = [PartitionPosition(p, committed[table].get(p), starts[(topic, p)], ends[(topic, p)],
                                           stamps.get((topic, p))) for p in partitions[topic]]
            lags.append(source_lag(table, topic, source_group(self.settings.topic_prefix, table), now_ms,
                                   positions))
        return lags

    def _offsets(self, tps: Sequence[TopicPartition], spec: OffsetSpec) -> dict[tuple[str, int], int]:
        if not tps:
            return {}
        futures = self._admin.list_offsets({tp: spec for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED,
                                           request_timeout=self.timeout)
        return {(tp.topic, tp.partition): future.result(self.timeout).offset for tp, future in futures.items()}

    def _committed(self, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
        futures = self._admin.list_consumer_group_offsets([request], request_timeout=self.timeout)
        reply = futures[group].result(self.timeout)
        return {tp.partition: tp.offset for tp in reply.topic_partitions or [] if tp.offset >= 0 and tp.error is None}

    def _first_timestamps(self, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The timestamp of the first message at or after each offset (read_committed), within the timeout;
        a partition whose message does not arrive in time is left out (its age is unknown)."""
        if not offsets:
            return {}
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        found: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + min(self.timeout, 3.0)
        try:
            while len(found) < len(offsets) and time.monotonic() < deadline:
                for message in next_records(self._consumer, 0.2, len(offsets)):
                    topic, partition = message.topic(), message.partition()
                    if message.error() is not None or topic is None or partition is None:
                        continue
                    kind, ts = message.timestamp()
                    if (topic, partition) not in found and kind != 0:  # 0: TIMESTAMP_NOT_AVAILABLE
                        found[(topic, partition)] = ts
                        self._consumer.pause([TopicPartition(topic, partition)])
        finally:
            self._consumer.unassign()
        return found

    def close(self) -> None:
        self._consumer.close()


def measure_quietly(probe: SourceLagProbe, entries: Sequence[CatalogEntry], now_ms: int) -> list[SourceLag]:
    """:meth:`SourceLagProbe.measure`, or nothing when Kafka does not answer (logged): lag then stays as
    last recorded, and the status command says the broker is unreachable."""
    try:
        return probe.measure(entries, now_ms)
    except (KafkaException, TimeoutError, OSError) as error:
        log.warning("source lag not measured: %s", error)
        return []


__all__ = ["SourceLagProbe", "SourceStatusStore", "measure_quietly", "source_key"]
