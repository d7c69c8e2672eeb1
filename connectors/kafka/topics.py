"""Creating the topics mvlog owns: changelogs (delete policy) and the catalog (compacted).

A changelog is created with the ``max.message.bytes`` mvlog's largest record needs, and its record limit
is what the broker, the topic and the producer really allow (:func:`changelog_record_limit`), so a row
too large is refused by name when it is written instead of aborting its epoch with MSG_SIZE_TOO_LARGE.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from mvlog.config import Settings
from mvlog.connectors.kafka.kafka_security import RefusalWatch, cluster_metadata, watched_admin
from mvlog.record_limits import RecordLimit, effective_record_limit, headers_bytes, topic_bytes_needed
from mvlog.schemas.codec import HEADER_TYPE, TYPE_CHANGE

log = logging.getLogger(__name__)

#: The headers of a change event (ChangelogWriter writes these), in a record's bytes.
CHANGE_HEADER_BYTES = headers_bytes([(HEADER_TYPE, TYPE_CHANGE)])
TOPIC_LIMIT, BROKER_LIMIT, PRODUCER_LIMIT = "max.message.bytes", "message.max.bytes", "message.max.bytes"


class TopicError(RuntimeError):
    pass


def ensure_topic(settings: Settings, topic: str, partitions: int, config: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
    """Create ``topic`` unless it exists; an existing topic with another partition count is an error.

    Returns once the broker serves every partition: Apache Kafka (KRaft) acknowledges CreateTopics when
    the controller has committed the topic, and its brokers learn it a moment later; a request in between
    (a watermark query, say) fails with UNKNOWN_TOPIC_OR_PARTITION.

    Usually mvlog's first contact with Kafka: a broker refusing the credentials or the TLS handshake
    raises :class:`~mvlog.connectors.kafka.kafka_security.KafkaAccessError` at once, naming the reason."""
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
    """Delete ``topic`` and return once the broker no longer lists it.

    DeleteTopics answers when the controller has accepted the deletion; the brokers' metadata drops the
    topic a moment later. Waiting for that makes a drop over when it returns: the same name created
    again right after, or a listing, does not find the old topic."""
    admin = AdminClient(settings.kafka_client_config())
    try:
        admin.delete_topics([topic], operation_timeout=timeout)[topic].result(timeout)
    except KafkaException as exc:
        if "UNKNOWN_TOPIC" not in str(exc):
            raise TopicError(f"cannot delete topic {topic}: {exc}") from exc
    deadline = time.monotonic() + timeout
    while topic in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise TopicError(f"topic {topic} is still listed {timeout:.0f} s after its deletion")
        time.sleep(0.1)


def describe_config(settings: Settings, resource: ConfigResource, timeout: float = 10.0,
                    admin: AdminClient | None = None, watch: RefusalWatch | None = None) -> dict[str, str]:
    """The settings of a topic or broker that have a value (DescribeConfigs; raises KafkaException when
    it is refused, e.g. by ACLs, TopicError when it times out, and KafkaAccessError as soon as the broker
    refuses the client's login: a wrong password fails in seconds, not after the timeout)."""
    if admin is None:
        admin, watch = watched_admin(settings)
    future = admin.describe_configs([resource])[resource]
    deadline = time.monotonic() + timeout
    while True:
        try:
            entries = future.result(0.2)
            break
        except FutureTimeout:
            if watch is not None:
                admin.poll(0)  # serves error_cb, which records a refused login
                watch.check()
            if time.monotonic() > deadline:
                raise TopicError(f"DescribeConfigs of {resource.name} timed out after {timeout:g} s") from None
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def changelog_topic_bytes(settings: Settings) -> int:
    """The ``max.message.bytes`` a changelog needs: the largest record readers accept, in a batch of its own."""
    return topic_bytes_needed(settings.max_record_bytes, CHANGE_HEADER_BYTES)


def ensure_changelog(settings: Settings, name: str, partitions: int, timeout: float = 30.0) -> RecordLimit:
    """Create (or find) ``name``'s changelog with the max.message.bytes mvlog needs, and return its limit.

    Where the broker refuses that setting (a create-topic policy, no AlterConfigs right on a topic that
    exists already), the topic keeps what it has, with a warning: the limit returned is then smaller and
    rows above it are refused by name when written."""
    topic, needed = settings.changelog_topic(name), changelog_topic_bytes(settings)
    try:
        ensure_topic(settings, topic, partitions, {TOPIC_LIMIT: str(needed)}, timeout)
    except TopicError as error:
        if "exists with" in str(error):
            raise
        log.warning("%s: created without %s=%d, which the broker refused: %s", topic, TOPIC_LIMIT, needed, error)
        ensure_topic(settings, topic, partitions, timeout=timeout)
    admin, watch = watched_admin(settings)
    current = _topic_limit(settings, admin, topic, watch)
    if current is not None and current < needed:  # a topic created before, or by someone else
        _raise_topic_limit(admin, topic, needed, current, timeout)
    limit = changelog_record_limit(settings, topic, admin, watch)
    log.info("%s: change events up to %d bytes (set by %s)", topic, limit.bytes, limit.reason)
    return limit


def _raise_topic_limit(admin: AdminClient, topic: str, needed: int, current: int, timeout: float) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(TOPIC_LIMIT, str(needed), incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout)
    except KafkaException as error:
        log.warning("%s: %s stays %d (mvlog needs %d), the broker refused to raise it: %s",
                    topic, TOPIC_LIMIT, current, needed, error)


def _topic_limit(settings: Settings, admin: AdminClient, topic: str, watch: RefusalWatch | None) -> int | None:
    """The topic's max.message.bytes, else the broker's message.max.bytes (the topic's default), else None
    when DescribeConfigs is refused for both (ACLs) or the values are unreadable."""
    for kind, setting in ((ConfigResource.Type.TOPIC, TOPIC_LIMIT), (ConfigResource.Type.BROKER, BROKER_LIMIT)):
        name = topic if kind == ConfigResource.Type.TOPIC else _a_broker(admin, watch)  # asked only when needed
        if name is None:
            continue
        try:
            value = describe_config(settings, ConfigResource(kind, name), admin=admin, watch=watch).get(setting)
            if value is not None:
                return int(value)
        except (KafkaException, TopicError, ValueError) as error:
            log.warning("%s: cannot read %s of %s %s: %s", topic, setting, kind.name.lower(), name, error)
    return None


def _a_broker(admin: AdminClient, watch: RefusalWatch | None) -> str | None:
    try:
        metadata = cluster_metadata(admin, watch, timeout=10) if watch is not None else admin.list_topics(timeout=10)
    except KafkaException:
        return None
    return str(min(metadata.brokers)) if metadata.brokers else None


def changelog_record_limit(settings: Settings, topic: str, admin: AdminClient | None = None,
                           watch: RefusalWatch | None = None) -> RecordLimit:
    """The largest change event ``topic`` takes (key + value bytes): the smallest of max_record_bytes, the
    topic's max.message.bytes (or the broker's message.max.bytes) and a message.max.bytes configured for
    the producers in ``settings.kafka``. When neither the topic's nor the broker's setting can be read, the
    topic is taken to have what mvlog asked for, with a warning (the broker may then still refuse)."""
    if admin is None:
        admin, watch = watched_admin(settings)
    topic_max = _topic_limit(settings, admin, topic, watch)
    if topic_max is None:
        topic_max = changelog_topic_bytes(settings)
        log.warning("%s: limits unreadable; assuming %s=%d from max_record_bytes", topic, TOPIC_LIMIT, topic_max)
    configured = settings.kafka.get(PRODUCER_LIMIT)
    return effective_record_limit(settings.max_record_bytes, topic_max, CHANGE_HEADER_BYTES,
                                  int(configured) if configured is not None else None)
