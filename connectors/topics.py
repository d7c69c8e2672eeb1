"""Creating the topics mvlog owns: changelogs (delete policy) and the catalog (compacted)."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from mvlog.config import Settings
from mvlog.connectors.kafka_security import cluster_metadata, watched_admin


class TopicError(RuntimeError):
    pass


def ensure_topic(settings: Settings, topic: str, partitions: int, config: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
    """Create ``topic`` unless it exists; an existing topic with another partition count is an error.

    Returns once the broker serves every partition: Apache Kafka (KRaft) acknowledges CreateTopics when
    the controller has committed the topic, and its brokers learn it a moment later; a request in between
    (a watermark query, say) fails with UNKNOWN_TOPIC_OR_PARTITION.

    Usually mvlog's first contact with Kafka: a broker refusing the credentials or the TLS handshake
    raises :class:`~mvlog.connectors.kafka_security.KafkaAccessError` at once, naming the reason."""
    admin, watch = watched_admin(settings)
    metadata = cluster_metadata(admin, watch, timeout=timeout)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            raise TopicError(f"topic {topic} exists with {len(existing.partitions)} partitions, "
                             f"expected {partitions}")
        return
    new = NewTopic(topic, num_partitions=partitions, replication_factor=settings.replication_factor,
                   config=config or {})
    future = admin.create_topics([new], operation_timeout=timeout)[topic]
    try:
        future.result(timeout)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise TopicError(f"cannot create topic {topic}: {exc}") from exc
    _wait_until_served(admin, topic, partitions, timeout)


def _wait_until_served(admin: AdminClient, topic: str, partitions: int, timeout: float) -> None:
    """Poll the metadata until ``topic`` shows ``partitions`` partitions, each with a leader."""
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_topics(topic, timeout=max(1.0, deadline - time.monotonic())).topics.get(topic)
        if (found is not None and found.error is None and len(found.partitions) == partitions
                and all(p.leader >= 0 for p in found.partitions.values())):
            return
        if time.monotonic() > deadline:
            raise TopicError(f"topic {topic} was created, but the broker does not serve it after {timeout:.0f} s")
        time.sleep(0.05)


def partition_count(settings: Settings, topic: str, timeout: float = 30.0) -> int:
    admin = AdminClient(settings.kafka_client_config())
    meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None:
        raise TopicError(f"topic {topic} does not exist")
    return len(meta.partitions)


def delete_topic(settings: Settings, topic: str, timeout: float = 30.0) -> None:
    admin = AdminClient(settings.kafka_client_config())
    try:
        admin.delete_topics([topic], operation_timeout=timeout)[topic].result(timeout)
    except KafkaException as exc:
        if "UNKNOWN_TOPIC" not in str(exc):
            raise TopicError(f"cannot delete topic {topic}: {exc}") from exc
