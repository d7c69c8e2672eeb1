"""The catalog: a Redis hash for reads, and a compacted Kafka topic from which Redis is rebuilt.

Every change goes to the topic first (flushed), then to Redis, so the topic is never behind Redis.
"""

from __future__ import annotations

import time
from typing import cast

import redis
from confluent_kafka import Producer, TopicPartition

from mvlog.catalog import CatalogEntry, CatalogError
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import next_records, reader_consumer
from mvlog.connectors.kafka.changelog_records import PoisonRecord
from mvlog.connectors.kafka.dead_letter import DeadLetterQueue
from mvlog.connectors.kafka.retention import has_records
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.redis_client import is_cluster
from mvlog.connectors.redis.redis_keys import control_key
from mvlog.schemas.codec import DecodeError, decode_catalog_entry, encode_catalog_entry

#: The catalog and marker of the layout before the control plane's hash tag, moved (see ``_migrated``).
_MIGRATE_SCRIPT = lua_script("catalog_migrate")


class CatalogStore:
    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.redis = client
        self.key = control_key(settings.topic_prefix, "catalog")
        # Present while Redis holds the control plane; gone after a wipe (FLUSHALL), which is how
        # readers tell "no such view" from "Redis lost everything" (see mvlog.services.control_plane).
        # Under the catalog's hash tag: :meth:`put` writes both in one transaction (one slot on a cluster).
        self.marker_key = control_key(settings.topic_prefix, "marker")
        self._migrate = client.register_script(_MIGRATE_SCRIPT)
        self._producer: Producer | None = None

    def _topic_producer(self) -> Producer:
        if self._producer is None:
            ensure_topic(self.settings, self.settings.catalog_topic, 1,
                         {"cleanup.policy": "compact"})
            self._producer = Producer({**self.settings.kafka_client_config(), "enable.idempotence": True})
        return self._producer

    def put(self, entry: CatalogEntry) -> None:
        """Write ``entry`` to the topic, then to Redis.

        The first write of a new catalog leaves the control-plane marker. One into a wiped Redis (the
        marker gone, the topic not empty) reloads the catalog first and leaves the marker gone: only
        the rebuild of everything else may say Redis holds the control plane again (a DDL statement
        during a wipe would otherwise hide it from every process still to notice it).
        """
        data = encode_catalog_entry(entry.to_record())
        producer = self._topic_producer()
        new_catalog = False
        if self.wiped():
            if has_records(self.settings, self.settings.catalog_topic, 1):
                self.rebuild_from_topic()
            else:
                new_catalog = True
        producer.produce(self.settings.catalog_topic, data, entry.name.encode())
        if producer.flush(30) != 0:
            raise CatalogError(f"catalog entry {entry.name} was not written to {self.settings.catalog_topic}")
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, entry.name, data)
        if new_catalog:
            pipe.hsetnx(self.marker_key, "since_ms", str(int(time.time() * 1000)))
        pipe.execute()

    def wiped(self) -> bool:
        """Whether Redis lost the control plane (the marker a catalog write leaves is gone)."""
        return not self.redis.exists(self.marker_key) and not self._migrated()

    def _migrated(self) -> bool:
        """Move a catalog and marker of the layout before the control plane's hash tag
        (``<prefix>:catalog``, ``<prefix>:control-plane``) to their keys now, in one script: a standalone
        Redis of an older mvlog keeps its control plane instead of looking wiped. True when moved. Never on
        a Redis Cluster, which no older mvlog ran on (and whose slots a RENAME cannot cross)."""
        if is_cluster(self.redis):
            return False
        prefix = self.settings.topic_prefix
        keys = [f"{prefix}:control-plane", f"{prefix}:catalog", self.marker_key, self.key]
        return bool(self._migrate(keys=keys))

    def mark_rebuilt(self) -> None:
        self.redis.hset(self.marker_key, mapping={"since_ms": str(int(time.time() * 1000)),
                                                  "rebuilt_ms": str(int(time.time() * 1000))})

    def delete(self, name: str) -> None:
        producer = self._topic_producer()
        producer.produce(self.settings.catalog_topic, None, name.encode())
        if producer.flush(30) != 0:
            raise CatalogError(f"catalog tombstone for {name} was not written")
        self.redis.hdel(self.key, name)

    def get(self, name: str) -> CatalogEntry:
        data = cast(bytes | None, self.redis.hget(self.key, name))
        if data is None and self.wiped() and self.rebuild_from_topic():  # Redis was wiped: reload it
            data = cast(bytes | None, self.redis.hget(self.key, name))
        if data is None:
            known = ", ".join(sorted(self.names())) or "none"
            raise CatalogError(f"unknown table or view {name!r} (known: {known})")
        return CatalogEntry.from_record(decode_catalog_entry(data))

    def find(self, name: str) -> CatalogEntry | None:
        data = cast(bytes | None, self.redis.hget(self.key, name))
        return CatalogEntry.from_record(decode_catalog_entry(data)) if data is not None else None

    def names(self) -> list[str]:
        return sorted(k.decode() for k in cast(list[bytes], self.redis.hkeys(self.key)))

    def all(self) -> list[CatalogEntry]:
        entries = sorted(cast(dict[bytes, bytes], self.redis.hgetall(self.key)).items())
        if not entries and self.wiped() and self.rebuild_from_topic():  # Redis was wiped: reload it
            entries = sorted(cast(dict[bytes, bytes], self.redis.hgetall(self.key)).items())
        return [CatalogEntry.from_record(decode_catalog_entry(value)) for _, value in entries]

    def dependents(self, name: str) -> list[str]:
        return [e.name for e in self.views_reading(name)]

    def views_reading(self, name: str) -> list[CatalogEntry]:
        """The views whose definition reads table or view ``name``."""
        return [e for e in self.all() if name in e.sources]

    def rebuild_from_topic(self, idle_timeout: float = 2.0) -> int:
        """Reload Redis from the compacted topic (after Redis was wiped); returns the entries loaded."""
        ensure_topic(self.settings, self.settings.catalog_topic, 1, {"cleanup.policy": "compact"})
        consumer = reader_consumer(self.settings)
        consumer.assign([TopicPartition(self.settings.catalog_topic, 0, 0)])
        latest: dict[str, bytes | None] = {}
        dead_letters = DeadLetterQueue(self.settings, "catalog")
        try:
            while batch := next_records(consumer, idle_timeout):
                for message in batch:
                    if message.error() is not None:
                        continue
                    key, value = message.key(), message.value()
                    problem = _catalog_record_problem(key, value)
                    if problem is not None:  # poison: kept in <prefix>.catalog.dlq, the rest is loaded
                        dead_letters.send(PoisonRecord(self.settings.catalog_topic, message.partition() or 0,
                                                       message.offset() or 0, problem), key, value)
                        continue
                    assert key is not None
                    latest[key.decode()] = value
        finally:
            consumer.close()
            dead_letters.close()
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key)
        live = {name: value for name, value in latest.items() if value is not None}
        if live:
            pipe.hset(self.key, mapping=live)  # type: ignore[arg-type]
        pipe.execute()
        return len(live)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer.close()
            self._producer = None


def _catalog_record_problem(key: bytes | None, value: bytes | None) -> str | None:
    """Why a record of the catalog topic cannot be loaded (None: it can; a tombstone is fine)."""
    if key is None:
        return "catalog record without a key (the key is the table or view name)"
    try:
        name = key.decode()
    except UnicodeDecodeError:
        return "catalog record key is not UTF-8"
    if value is None:
        return None
    try:
        entry = CatalogEntry.from_record(decode_catalog_entry(value))
    except (DecodeError, KeyError, TypeError, ValueError) as exc:
        return f"not a catalog entry: {exc}"
    if entry.name != name:
        return f"catalog entry of {entry.name!r} under the key {name!r}"
    return None
