"""Poison records in a changelog on the real stack: they go to the view's dead-letter topic with the reason
and where they came from, and the changelog reader, the Spark data source and a view's consumer go on."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader, ChangelogReadError
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.schemas.codec import HEADER_TYPE, TYPE_BARRIER, TYPE_CHANGE, encode_key
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import RowValidationError, Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle

pytestmark = [pytest.mark.integration]


def read_dlq(settings: Settings, view: str, expected: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"{settings.topic_prefix}.dlq",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(settings.dead_letter_topic_of(view), 0, 0)])
    found: list[Any] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                found.append(message)
    finally:
        consumer.close()
    return found


def test_poison_records_are_dead_lettered_and_reading_goes_on(make_settings: Any, redis_client: redis.Redis,
                                                              spark: Any) -> None:
    """Malformed Avro, a change of another schema/view, a record too large, a change without a key and a
    record that is no mvlog record at all, between two epochs of t1: every reader (changelog reader, Spark
    data source under the view consumer) yields the right epochs, the view equals the oracle, and the
    dead-letter topic holds each poison record with headers naming topic, partition, offset and problem."""
    settings: Settings = make_settings(max_record_bytes=4096)
    t1 = Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=redis_client, auto_commit=False)
    create_view(settings, "mv1", "SELECT id, v FROM t1 WHERE v > 0", client=redis_client)
    t1.upsert([{"id": i, "v": i - 2} for i in range(8)])
    t1.flush()
    topic = settings.changelog_topic("t1")
    # mvlog created the changelog for records up to max_record_bytes; a foreign producer's larger record
    # gets in where the topic allows more (raised here as an operator might), and readers dead-letter it.
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "1048588", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})  # held until the result is in
    admin.incremental_alter_configs([resource])[resource].result(30)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    key = encode_key(("id",), (1,))
    poison: list[tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]] | None, str]] = [
        (key, b"\xff\xfe not avro", [(HEADER_TYPE, TYPE_CHANGE)], "not a change event of the expected schema"),
        (key, b"\x00\x02\x00\x00", [(HEADER_TYPE, TYPE_CHANGE)], "not a change event of the expected schema"),
        (key, b"\x00" * 10_000, [(HEADER_TYPE, TYPE_CHANGE)], "record too large"),
        (None, b"\x00", [(HEADER_TYPE, TYPE_CHANGE)], "change event without a key"),
        (b"plain", b'{"id": 1}', None, "not an mvlog changelog record"),
        (None, b"\x00", [(HEADER_TYPE, TYPE_BARRIER)], "not a barrier of the expected schema"),
    ]
    for k, v, headers, _ in poison:
        producer.produce(topic, v, k, partition=0, headers=headers)
    assert producer.flush(10) == 0
    t1.upsert([{"id": 1, "v": 5}])
    t1.delete([3])
    t1.flush()
    t1.close()
    store = ViewStore(redis_client, settings.topic_prefix)
    with ChangelogReader(settings, "t1", ("id",), settings.partitions, store.index,
                         upto_epoch=store.mce("t1")) as reader:
        epochs = list(reader.epochs(idle_timeout=10.0))
        assert reader.dead_letters is not None and reader.dead_letters.sent == len(poison)
    assert len(epochs) == 2 and sum(len(e.changes) for e in epochs) == 8 + 2
    dead = read_dlq(settings, "t1", len(poison))
    assert len(dead) == len(poison)
    for message, (k, v, _, problem) in zip(dead, poison, strict=True):
        found: dict[str, bytes] = dict(message.headers() or [])
        assert found["mvlog.dlq.topic"] == topic.encode() and found["mvlog.dlq.partition"] == b"0"
        reason = found["mvlog.dlq.reason"].decode()
        assert reason.startswith(f"{topic} partition 0 offset {int(found['mvlog.dlq.offset'])}: ")
        assert problem in reason
        assert message.key() == f"{topic}/0/{int(found['mvlog.dlq.offset'])}".encode()  # one copy per record
        assert found.get("mvlog.dlq.key") == k and message.value() == v
    # The Spark data source (executors) and the view consumer carry on past the same records.
    consumer = ViewConsumer(settings, "mv1", spark=spark, client=redis_client)
    try:
        assert consumer.catch_up() == store.mce("t1")
    finally:
        consumer.stop()
    assert check_oracle(settings, redis_client, ["t1", "mv1"]) == 2


def test_a_topic_that_is_not_a_changelog(settings: Settings, redis_client: redis.Redis) -> None:
    """A reader pointed at a topic of plain records dead-letters each one naming where it was (and yields no
    epoch); asked to fail instead, it stops at the first with a clear error naming topic, partition, offset."""
    topic = settings.changelog_topic("plain")
    ensure_topic(settings, topic, 1)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, f'{{"n": {i}}}'.encode(), b"k", partition=0)
    assert producer.flush(10) == 0
    with ChangelogReader(settings, "plain", ("id",), 1) as reader:
        assert list(reader.epochs(idle_timeout=3.0)) == []
    dead = read_dlq(settings, "plain", 3)
    assert [int(dict(m.headers() or [])["mvlog.dlq.offset"]) for m in dead] == [0, 1, 2]
    with ChangelogReader(settings, "plain", ("id",), 1, dead_letter=False) as reader, \
            pytest.raises(ChangelogReadError, match=rf"{topic} partition 0 offset 0: not an mvlog changelog record"):
        list(reader.epochs(idle_timeout=3.0))


def test_a_row_too_large_is_refused_at_the_writer(make_settings: Any, redis_client: redis.Redis) -> None:
    """A row whose change event could not be one record is refused when written, naming row and column;
    the other rows of the call are kept."""
    settings: Settings = make_settings(max_record_bytes=4096)
    with Table.create(settings, "t1", {"id": "int", "s": "string"}, ["id"], client=redis_client,
                      auto_commit=False) as t1:
        with pytest.raises(RowValidationError,
                           match=r"row 1: field 's': row too large: key \(2,\) encodes to 50\d\d bytes") as refused:
            t1.upsert([{"id": 1, "s": "ok"}, {"id": 2, "s": "x" * 5000}])
        assert refused.value.accepted == 1
        t1.flush()
    assert ViewStore(redis_client, settings.topic_prefix).row_count("t1") == 1


def test_poison_in_the_catalog_topic_is_dead_lettered_on_rebuild(settings: Settings,
                                                                 redis_client: redis.Redis) -> None:
    """Rebuilding the catalog from its topic loads every good entry and dead-letters the bad ones."""
    Table.create(settings, "t1", {"id": "int"}, ["id"], client=redis_client, auto_commit=False).close()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    outcomes: list[str] = []
    for value, key in ((b"\x01garbage", b"bad"), (b"{}", None)):  # one batch each: the broker judges each
        producer.produce(settings.catalog_topic, value, key,
                         on_delivery=lambda error, _message: outcomes.append(str(error) if error else "ok"))
        assert producer.flush(10) == 0
    # Whether a keyless record reaches the compacted topic depends on the broker; the reader copes either way.
    assert outcomes[0] == "ok", outcomes
    keyless_landed = outcomes[1] == "ok"
    catalog = CatalogStore(settings, redis_client)
    assert catalog.rebuild_from_topic() == 1
    assert catalog.names() == ["t1"]
    dead = read_dlq(settings, "catalog", 1 + keyless_landed)
    reasons = sorted(dict(m.headers() or [])["mvlog.dlq.reason"].decode() for m in dead)
    assert any("not a catalog entry" in r for r in reasons), (reasons, outcomes)
    assert any("catalog record without a key" in r for r in reasons) == keyless_landed, (reasons, outcomes)
    assert all(r.startswith(f"{settings.catalog_topic} partition 0 offset ") for r in reasons)
