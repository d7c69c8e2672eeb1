"""Limits agree with the broker (issue 21, item 4), on the real Apache Kafka: a changelog is created with
the max.message.bytes mvlog needs, a row whose change events cannot fit is refused by name when written
(before any epoch), a row just under the limit is committed, updates included, and a view's writer names
an output row too large instead of a raw KafkaError{MSG_SIZE_TOO_LARGE}."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition

from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader, reader_consumer
from mvlog.connectors.kafka.changelog_writer import (
    ChangelogWriter,
    EncodedBatch,
    RecordTooLargeError,
    encode_batch,
    envelope_bytes,
)
from mvlog.connectors.kafka.retention import topic_config
from mvlog.connectors.kafka.topics import changelog_record_limit, changelog_topic_bytes
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.record_limits import PRODUCER_DEFAULT_MAX_BYTES, row_fits
from mvlog.schemas.codec import decode_row, encode_key, encode_row
from mvlog.services.tables.writer import RowValidationError, Table
from mvlog.services.view_ddl import create_view
from mvlog.views import ChangeBatch

pytestmark = [pytest.mark.integration]

MB = 1_000_000


def high_watermarks(settings: Settings, view: str, partitions: int) -> list[int]:
    consumer = reader_consumer(settings)
    try:
        return [consumer.get_watermark_offsets(TopicPartition(settings.changelog_topic(view), p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


def committed_rows(settings: Settings, client: redis.Redis, view: str, keys: list[int]) -> list[Any]:
    """The rows of ``keys`` in Redis, and checked against what the changelog in Kafka sums to."""
    store = ViewStore(client, settings.topic_prefix)
    in_redis = [None if raw is None else decode_row(raw)
                for raw in store.row_list(view, [encode_key(("id",), (k,)) for k in keys])]
    in_kafka: dict[Any, Any] = {}
    with ChangelogReader(settings, view, ("id",), settings.partitions, store.index,
                         upto_epoch=store.mce(view)) as reader:
        for epoch in reader.epochs(idle_timeout=10.0):
            for change in epoch.changes:
                in_kafka[change.key] = change.after
    assert [in_kafka.get((k,)) for k in keys] == in_redis
    return in_redis


def test_a_1mb_row_is_committed_and_changelogs_are_sized(settings: Settings, redis_client: redis.Redis) -> None:
    """With the default settings (max_record_bytes 8 MiB) a 1 MB row used to abort its epoch with the
    producer's MSG_SIZE_TOO_LARGE (librdkafka's default message.max.bytes is 1,000,000): it commits now,
    an update of it (two images) too, and the changelogs of a table and a view ask for what mvlog needs."""
    with Table.create(settings, "t1", {"id": "int", "s": "string"}, ["id"], client=redis_client,
                      auto_commit=False) as t1:
        t1.upsert([{"id": 1, "s": "a" * MB}])
        t1.flush()
        t1.upsert([{"id": 1, "s": "b" * MB}])
        t1.flush()
    assert committed_rows(settings, redis_client, "t1", [1]) == [{"id": 1, "s": "b" * MB}]
    create_view(settings, "mv1", "SELECT id, s FROM t1", client=redis_client)
    for view in ("t1", "mv1"):
        config = topic_config(settings, settings.changelog_topic(view))
        assert int(config["max.message.bytes"]) == changelog_topic_bytes(settings) > settings.max_record_bytes
        assert changelog_record_limit(settings, settings.changelog_topic(view)).bytes == settings.max_record_bytes


def test_a_row_that_cannot_fit_is_refused_before_an_epoch(make_settings: Any, redis_client: redis.Redis) -> None:
    """Producers held to librdkafka's default message.max.bytes (set in MVLOG_KAFKA): a 1 MB row is refused
    when written, naming its key, its encoded size and the limit, and no epoch is opened for it; a row just
    under the limit is committed, and so is an update of it by another row as large (two images)."""
    settings: Settings = make_settings(kafka={"message.max.bytes": str(PRODUCER_DEFAULT_MAX_BYTES)})
    with Table.create(settings, "t1", {"id": "int", "s": "string"}, ["id"], client=redis_client,
                      auto_commit=False) as t1:
        with pytest.raises(RowValidationError) as refused:
            t1.upsert([{"id": 1, "s": "ok"}, {"id": 2, "s": "x" * MB}])
        message = str(refused.value)
        limit = changelog_record_limit(settings, settings.changelog_topic("t1"))
        encoded = len(encode_row({"id": 2, "s": "x" * MB}))
        for part in ("row 1", "key (2,)", f"encodes to {encoded} bytes", f"{limit.bytes}-byte limit",
                     "message.max.bytes (1000000)", settings.changelog_topic("t1")):
            assert part in message, (part, message)
        assert "MSG_SIZE_TOO_LARGE" not in message and refused.value.accepted == 1
        # Refused before any epoch: nothing reached the changelog, and no epoch is committed.
        assert high_watermarks(settings, "t1", settings.partitions) == [0] * settings.partitions
        assert ViewStore(redis_client, settings.topic_prefix).mce("t1") is None

        # The largest row that fits, found by the same arithmetic from the key, row and envelope sizes.
        key_bytes, envelope = len(encode_key(("id",), (3,))), envelope_bytes("t1")

        def fits(chars: int) -> bool:
            row_bytes: int = len(encode_row({"id": 3, "s": "y" * chars}))
            return row_fits(row_bytes, key_bytes, envelope, limit)

        chars = max(n for n in range(limit.bytes // 2 - 200, limit.bytes // 2) if fits(n))
        assert chars > 499_000 and not fits(chars + 1)
        with pytest.raises(RowValidationError, match=r"key \(3,\)"):
            t1.upsert([{"id": 3, "s": "y" * (chars + 1)}])
        assert t1.upsert([{"id": 3, "s": "y" * chars}]) == 1
        t1.flush()
        assert t1.upsert([{"id": 3, "s": "z" * chars}]) == 1  # an update: both images in one change event
        t1.flush()
    assert committed_rows(settings, redis_client, "t1", [1, 2, 3]) == [
        {"id": 1, "s": "ok"}, None, {"id": 3, "s": "z" * chars}]


def test_a_view_output_row_too_large_names_view_key_size_and_limit(make_settings: Any,
                                                                   redis_client: redis.Redis) -> None:
    """A view's writer (the changelog writer of every consumer) given a change event above its changelog's
    limit aborts the epoch with an error naming the view, the key, the size and the limit (no raw
    KafkaError), and commits the next epoch as usual."""
    settings: Settings = make_settings(kafka={"message.max.bytes": str(PRODUCER_DEFAULT_MAX_BYTES)})
    Table.create(settings, "t1", {"id": "int", "s": "string"}, ["id"], client=redis_client, auto_commit=False).close()
    entry = create_view(settings, "mv1", "SELECT id, s FROM t1", client=redis_client)
    writer = ChangelogWriter(settings, "mv1", entry.key_columns, entry.partitions)

    def encoded(changes: list[Change]) -> EncodedBatch:
        return encode_batch(entry.key_columns, ChangeBatch.from_changes(entry.schema, changes))

    try:
        big = Change(Op.CREATE, (5,), None, {"id": 5, "s": "x" * MB})
        with pytest.raises(RecordTooLargeError) as refused:
            writer.commit_batches(1, 0, [encoded([Change(Op.CREATE, (4,), None, {"id": 4, "s": "ok"}), big])])
        message = str(refused.value)
        for part in ("mv1", "key (5,)", "bytes (key and value)", f"{writer.limit.bytes}-byte limit",
                     "message.max.bytes (1000000)"):
            assert part in message, (part, message)
        assert "KafkaError" not in message
        committed = writer.commit_batches(2, 0, [encoded([Change(Op.CREATE, (4,), None, {"id": 4, "s": "ok"})])])
        assert committed.records == 1
    finally:
        writer.close()
