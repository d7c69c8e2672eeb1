"""Source tables (issue 18): tables fed from users' topics, exactly once, bad records dead-lettered.

The oracle is independent of the decoders: the producer records the effect it means each message to have
(the row of a key, or its delete) and where the broker put it (partition, offset); folding those effects
up to a set of offsets gives the table the ingester must show. Checked at the end and, from the table's
changelog read with plain confluent-kafka + fastavro, at every committed epoch against the source offsets
that epoch's barriers record (which must never go back: each message belongs to exactly one epoch).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]
from prometheus_client import generate_latest

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.source_status import SourceStatusStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key
from mvlog.schemas.codec import decode_row
from mvlog.services.cli import main
from mvlog.services.dashboard.metrics import pipeline_registry
from mvlog.services.lag_sampler import LagSampler
from mvlog.services.sources.declare import create_source_table
from mvlog.services.sources.ingester import SourceIngester
from mvlog.services.status_snapshot import take_snapshot
from mvlog.source_spec import source_group
from tests.integration.independent_consumer import read_topic
from tests.integration.test_durable_stack import own_stack, stack_settings
from tests.integration.test_redis_restart import DOWN_S, AofRedis

Effect = dict[str, Any] | None  # the row a message leaves for its key, None when it deletes the key

_SCRIPT = Path(sys.executable).with_name("mvlog")
MVLOG = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "mvlog.services.cli"]


@dataclass
class SourceTopic:
    """A user topic and what the test producer meant by each message, by (partition, offset)."""

    settings: Settings
    name: str
    partitions: int = 3
    effects: dict[tuple[int, int], tuple[Key, Effect]] = field(default_factory=dict)
    bad: dict[tuple[int, int], str] = field(default_factory=dict)  # bad records: what the DLQ must say
    stamps: dict[tuple[int, int], int] = field(default_factory=dict)  # the broker's timestamp of each message

    def __post_init__(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.settings.bootstrap_servers})
        admin.create_topics([NewTopic(self.name, self.partitions, 1)])[self.name].result(30)
        self.producer = Producer({"bootstrap.servers": self.settings.bootstrap_servers, "linger.ms": 5,
                                  "enable.idempotence": True})

    def send(self, key: Any, value: Any, effect_key: Key, effect: Effect, partition: int | None = None) -> None:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.effects[(msg.partition(), msg.offset())] = (effect_key, effect)
            self.stamps[(msg.partition(), msg.offset())] = msg.timestamp()[1]

        encoded = None if value is None else json.dumps(value).encode()
        self._produce(json.dumps(key).encode(), encoded, delivered, partition)

    def send_bad(self, key: bytes | None, value: bytes | None, problem: str) -> None:
        """A record the table must dead-letter (``problem``: part of the reason it must give)."""
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.bad[(msg.partition(), msg.offset())] = problem

        self._produce(key, value, delivered, None)

    def _produce(self, key: bytes | None, value: bytes | None, delivered: Any, partition: int | None) -> None:
        while True:
            try:
                if partition is None:
                    self.producer.produce(self.name, value, key, on_delivery=delivered)
                else:
                    self.producer.produce(self.name, value, key, partition=partition, on_delivery=delivered)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    def fold(self, below: dict[int, int] | None = None) -> dict[Key, dict[str, Any]]:
        """The table after the messages below ``below`` (partition -> offset; all when None). A key's
        messages are all in one partition (same key bytes), so folding in offset order is exact."""
        rows: dict[Key, dict[str, Any]] = {}
        for (partition, offset), (key, effect) in sorted(self.effects.items()):
            if below is not None and offset >= below.get(partition, 0):
                continue
            if effect is None:
                rows.pop(key, None)
            else:
                rows[key] = effect
        return rows


def table_rows(client: redis.Redis, settings: Settings, table: str, key: tuple[str, ...]) -> dict[Key, Any]:
    rows = (decode_row(raw) for _, raw in ViewStore(client, settings.topic_prefix).scan_rows(table))
    return {tuple(row[k] for k in key): row for row in rows}


def committed_offsets(settings: Settings, table: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "isolation.level": "read_committed",
                         "group.id": source_group(settings.topic_prefix, table), "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def end_offsets(settings: Settings, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def check_every_epoch(settings: Settings, table: str, key: tuple[str, ...], source: SourceTopic) -> int:
    """At every epoch in the table's changelog, the table folded from the changelog equals the oracle's
    fold of the source messages below the offsets the epoch's barriers record, and those offsets never go
    back. Returns how many epochs were checked."""
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic(table), settings.partitions, idle=2.0)
    epochs = sorted(set.intersection(*(set(log.barriers) for log in logs.values())))
    rows: dict[Key, Any] = {}
    last: dict[int, int] = {}
    for epoch in epochs:
        for log in logs.values():
            assert len(log.barriers[epoch]) == 1, f"epoch {epoch} has two barriers in a partition"
            for _, change in log.changes.get(epoch, []):
                after = change["after"]
                change_key = tuple(change["key"][k] for k in key)
                if after is None:
                    rows.pop(change_key, None)
                else:
                    rows[change_key] = dict(after)
        mutation = logs[0].barriers[epoch][0][1]["mutation"]
        assert mutation is not None and mutation["kind"] == "source_offsets", mutation
        payload = json.loads(mutation["payload"])
        assert payload["topic"] == source.name
        offsets = {int(p): o for p, o in payload["offsets"].items()}
        assert all(offsets.get(p, 0) >= o for p, o in last.items()), f"epoch {epoch}: offsets went back"
        last = offsets
        assert rows == source.fold(offsets), f"epoch {epoch} (offsets {offsets}) differs from the fold"
    return len(epochs)


def env_of(settings: Settings) -> dict[str, str]:
    return {"MVLOG_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "MVLOG_REDIS_URL": settings.redis_url,
            "MVLOG_TOPIC_PREFIX": settings.topic_prefix, "MVLOG_PARTITIONS": str(settings.partitions),
            "MVLOG_BARRIER_INTERVAL_MS": str(settings.barrier_interval_ms),
            "MVLOG_STACK_DIR": str(settings.stack_dir), "MVLOG_SPARK_CONF": json.dumps(settings.spark_conf)}


def mvlog(settings: Settings, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env_of(settings), catch_exceptions=False)


# ------------------------------------------------------------------------------------------ workloads


BAD_RECORDS: list[tuple[bytes | None, bytes | None, str]] = [
    (b"7", b"{not json", "the value is not valid JSON"),
    (None, b'{"id": 7, "v": 1}', "the message has no key"),
    (b"7", b'{"v": "seven"}', "field 'v': expected int, got str 'seven'"),
    (b'"x"', b'{"v": 1}', "field 'id': expected int, got str 'x'"),
    (b"7", b"[1, 2]", "the value is not a JSON object"),
    (b"{\"other\": 7}", b'{"v": 1}', "field 'id': primary key column is missing or null in the key"),
]


def upsert_workload(source: SourceTopic, rng: random.Random, count: int, keys: int = 40,
                    bad_share: float = 0.0) -> None:
    """upsert-json: keys repeated within and across epochs, a key as an object or a bare value (fixed per
    key, so its messages share a partition), rows without their key columns, tombstones; ``bad_share`` of
    the messages are bad records (:data:`BAD_RECORDS`), which change nothing."""
    for _ in range(count):
        if bad_share and rng.random() < bad_share:
            source.send_bad(*rng.choice(BAD_RECORDS))
            continue
        k = rng.randrange(keys)
        message_key: Any = {"id": k} if k % 2 else k
        if rng.random() < 0.2:
            source.send(message_key, None, (k,), None)
            continue
        v, label = rng.randrange(-1000, 1000), rng.choice(["a", "b", None])
        value: dict[str, Any] = {"v": v, "label": label, "extra": "ignored"}
        if rng.random() < 0.5:
            value["id"] = k
        source.send(message_key, value, (k,), {"id": k, "v": v, "label": label})


def debezium_workload(source: SourceTopic, rng: random.Random, count: int, keys: int = 30) -> None:
    """debezium-json: snapshot reads, then inserts, updates and deletes each followed by its tombstone, half
    of the events in the JSON converter's schema/payload wrapper; bytes as base64."""
    present: dict[int, dict[str, Any]] = {}
    lsn = 1000
    for i in range(count):
        k = rng.randrange(keys)
        lsn += 8
        src = {"connector": "postgresql", "name": "db1", "db": "shop", "schema": "public", "table": "items",
               "lsn": lsn, "txId": 500 + i, "ts_ms": 1732540000000 + i, "snapshot": "true" if i < 10 else "false"}
        before = present.get(k)
        if before is not None and rng.random() < 0.3:
            envelope = {"op": "d", "before": {"id": k, "price": None, "ok": None, "data": None},
                        "after": None, "source": src, "ts_ms": 1}
            effect: Effect = None
            del present[k]
        else:
            raw = bytes(rng.randrange(256) for _ in range(3))
            after = {"id": k, "price": rng.randrange(10000) / 100, "ok": rng.random() < 0.5,
                     "data": base64.b64encode(raw).decode()}
            op = "r" if i < 10 else "c" if before is None else "u"
            envelope = {"op": op, "before": before, "after": after, "source": src, "ts_ms": 1}
            present[k] = after
            effect = {**after, "data": raw}
        value = {"schema": {"type": "struct", "name": "db1.public.items.Envelope"}, "payload": envelope} \
            if rng.random() < 0.5 else envelope
        source.send({"id": k}, value, (k,), effect)
        if effect is None:
            source.send({"id": k}, None, (k,), None)  # the tombstone after a delete: no change


# ---------------------------------------------------------------------------------------------- tests


def test_upsert_json_topic_equals_the_fold_and_resumes(settings: Settings, redis_client: redis.Redis) -> None:
    rng = random.Random(18)
    source = SourceTopic(settings, f"{settings.topic_prefix}.user-events")
    create_source_table(settings, "events", {"id": "int", "v": "int", "label": "string"}, ["id"], source.name,
                        "upsert-json", client=redis_client)
    upsert_workload(source, rng, 1500)
    source.flush()
    with SourceIngester(settings, "events", redis_client) as ingester:
        first = ingester.run(until_caught_up=True)
    assert first.messages == 1500 and first.epochs >= 1
    assert table_rows(redis_client, settings, "events", ("id",)) == source.fold()
    upsert_workload(source, rng, 700)  # a second run resumes from the committed offsets
    source.flush()
    with SourceIngester(settings, "events", redis_client) as ingester:
        second = ingester.run(until_caught_up=True)
    assert second.messages == 700
    assert table_rows(redis_client, settings, "events", ("id",)) == source.fold()
    assert committed_offsets(settings, "events", source.name, 3) == end_offsets(settings, source.name, 3)
    assert check_every_epoch(settings, "events", ("id",), source) == first.epochs + second.epochs


def test_debezium_json_topic_equals_the_fold(settings: Settings, redis_client: redis.Redis) -> None:
    source = SourceTopic(settings, f"{settings.topic_prefix}.db1.public.items")
    create_source_table(settings, "items", {"id": "int", "price": "float", "ok": "boolean", "data": "bytes"},
                        ["id"], source.name, "debezium-json", client=redis_client)
    debezium_workload(source, random.Random(7), 1200)
    source.flush()
    with SourceIngester(settings, "items", redis_client) as ingester:
        ingester.run(until_caught_up=True)
    assert table_rows(redis_client, settings, "items", ("id",)) == source.fold()
    assert check_every_epoch(settings, "items", ("id",), source) >= 1


def test_debezium_json_redeliveries_and_key_changes_apply_once_and_in_order(settings: Settings,
                                                                          redis_client: redis.Redis) -> None:
    """Plain envelopes take the fast decoder (mvlog.source_fast), a key-changing update the reference one; a
    redelivered change (its LSN at or below its key's last) is skipped on both, in message order."""
    source = SourceTopic(settings, f"{settings.topic_prefix}.db1.public.redelivered")
    create_source_table(settings, "items", {"id": "int", "label": "string"}, ["id"], source.name, "debezium-json",
                        client=redis_client)
    lsn = iter(range(100, 1000, 8))

    def change(op: str, before: Any, after: Any, *, at: int | None = None, wrap: bool = False) -> dict[str, Any]:
        envelope = {"op": op, "before": before, "after": after, "ts_ms": 1,
                    "source": {"connector": "postgresql", "snapshot": "false", "lsn": at or next(lsn)}}
        return {"schema": {"type": "struct"}, "payload": envelope} if wrap else envelope

    def send(key: int, value: Any) -> None:
        source.send({"id": key}, value, (key,), None, partition=0)  # one partition: one order for all keys

    first_one, first_two = change("c", None, {"id": 1, "label": "a"}), change("c", None, {"id": 2, "label": "a"})
    send(1, first_one)
    send(2, first_two)
    send(1, change("u", {"id": 1, "label": "a"}, {"id": 1, "label": "b"}, wrap=True))
    send(2, change("d", {"id": 2, "label": "a"}, None))
    send(2, None)  # its tombstone
    send(1, first_one)  # redelivered: would overwrite b with a
    send(2, {"schema": {}, "payload": first_two})  # redelivered (wrapped this time): would bring 2 back
    send(3, change("c", None, {"id": 3, "label": "a"}))
    send(4, change("u", {"id": 3, "label": "a"}, {"id": 4, "label": "moved"}))  # reference: delete 3, then 4
    send(3, change("c", None, {"id": 3, "label": "again"}, wrap=True))  # after that delete
    source.flush()
    with SourceIngester(settings, "items", redis_client) as ingester:
        progress = ingester.run(until_caught_up=True)
    assert progress.redelivered == 2
    assert progress.messages == 10
    assert table_rows(redis_client, settings, "items", ("id",)) == {
        (1,): {"id": 1, "label": "b"}, (3,): {"id": 3, "label": "again"}, (4,): {"id": 4, "label": "moved"}}


def test_declaration_refusals_and_a_bad_record(settings: Settings, redis_client: redis.Redis) -> None:
    columns = ["-c", "id:int", "-c", "v:int", "-k", "id"]
    unknown = mvlog(settings, "create-table", "s1", *columns, "--from-topic", "x", "--format", "avro")
    assert unknown.exit_code == 2 and "unknown source format 'avro'; use one of upsert-json" in unknown.stderr
    missing = mvlog(settings, "create-table", "s1", *columns, "--from-topic", f"{settings.topic_prefix}.nope",
                    "--format", "upsert-json")
    assert missing.exit_code == 1 and f"source topic '{settings.topic_prefix}.nope' does not exist" in missing.stderr
    assert mvlog(settings, "views").stdout.count("s1") == 0  # nothing was created, the topic neither
    assert f"{settings.topic_prefix}.nope" not in AdminClient({"bootstrap.servers": settings.bootstrap_servers}
                                                             ).list_topics(timeout=10).topics

    source = SourceTopic(settings, f"{settings.topic_prefix}.feed")
    created = mvlog(settings, "create-table", "s1", *columns, "--from-topic", source.name, "--format", "upsert-json")
    assert created.exit_code == 0, created.output
    insert = CliRunner().invoke(main, ["insert", "s1"], input='{"id": 1, "v": 1}\n', env=env_of(settings))
    assert insert.exit_code == 1 and "is fed by topic" in insert.stderr
    source.send(1, {"v": 10}, (1,), {"id": 1, "v": 10})
    source.send_bad(b"1", b'{"v": "eleven"}', "field 'v': expected int, got str 'eleven'")  # dead-lettered
    source.send(1, {"v": 12}, (1,), {"id": 1, "v": 12})  # and ingestion goes on
    source.flush()
    run = mvlog(settings, "run-source", "s1", "--until-caught-up")
    assert run.exit_code == 0, run.output
    assert "1 bad record(s) dead-lettered" in run.stderr, run.stderr
    assert table_rows(redis_client, settings, "s1", ("id",)) == {(1,): {"id": 1, "v": 12}}
    check_dead_letters(settings, "s1", source)
    status = json.loads(mvlog(settings, "status", "-o", "json").stdout)
    (s1,) = [v for v in status["views"] if v["name"] == "s1"]
    assert s1["source"]["dead_letters"] == 1 and s1["source"]["topic"] == source.name, s1


def read_dead_letters(settings: Settings, table: str) -> list[tuple[dict[str, str], bytes | None, bytes | None]]:
    """Every committed record of the table's dead-letter topic: (headers, key, value), read_committed."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "dlq-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    topic = settings.dead_letter_topic_of(table)
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        found: list[tuple[dict[str, str], bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and consumer.position([TopicPartition(topic, 0)])[0].offset < high:
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                raw = cast(list[tuple[str, bytes | None]], message.headers() or [])
                headers = {k: (v or b"").decode() for k, v in raw}
                found.append((headers, message.key(), message.value()))
        return found
    finally:
        consumer.close()


def check_dead_letters(settings: Settings, table: str, source: SourceTopic) -> int:
    """Each bad record of ``source`` is in the table's dead-letter topic exactly once (read_committed), with
    the headers view readers write, its value and a reason naming the problem; nothing else is there."""
    found = read_dead_letters(settings, table)
    where = [(int(h["mvlog.dlq.partition"]), int(h["mvlog.dlq.offset"])) for h, _, _ in found]
    assert sorted(where) == sorted(source.bad), f"dead letters {sorted(where)} != bad records {sorted(source.bad)}"
    for (headers, key, value), at in zip(found, where, strict=True):
        assert headers["mvlog.dlq.topic"] == source.name and key == f"{source.name}/{at[0]}/{at[1]}".encode()
        assert source.bad[at] in headers["mvlog.dlq.reason"], (headers["mvlog.dlq.reason"], source.bad[at])
        assert headers["mvlog.dlq.size"] == str(len(value or b""))
    return len(found)


def test_offsets_deleted_by_retention_are_reported(settings: Settings, redis_client: redis.Redis) -> None:
    source = SourceTopic(settings, f"{settings.topic_prefix}.short")
    create_source_table(settings, "short", {"id": "int", "v": "int", "label": "string"}, ["id"], source.name,
                        "upsert-json", client=redis_client)
    rng = random.Random(3)
    upsert_workload(source, rng, 30)
    source.flush()
    with SourceIngester(settings, "short", redis_client) as ingester:
        ingester.run(until_caught_up=True)
    upsert_workload(source, rng, 30)
    source.flush()
    # What retention does, at once: the messages the table has not ingested yet are gone.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    ends = end_offsets(settings, source.name, 3)
    for future in admin.delete_records([TopicPartition(source.name, p, o) for p, o in ends.items()]).values():
        future.result(30)
    run = mvlog(settings, "run-source", "short", "--until-caught-up")
    assert run.exit_code == 1, run.output
    assert "is no longer in the topic (retention deleted messages the table never ingested)" in run.stderr, run.stderr
    # mvlog status says so too, with what to do: the ingester's reason, and the lag measured from Kafka.
    status = json.loads(mvlog(settings, "status", "-o", "json").stdout)
    (short,) = [v for v in status["views"] if v["name"] == "short"]
    problems = " | ".join(short["source"]["problems"])
    assert "retention deleted messages the table never ingested" in problems, problems
    assert "before the table ingested them" in problems and f"reset group {settings.topic_prefix}.short.source" \
        in problems, problems
    assert short["source"]["lag"]["records"] == 0  # nothing left to read: what was there is gone


def test_a_missing_source_topic_is_reported(settings: Settings, redis_client: redis.Redis) -> None:
    source = SourceTopic(settings, f"{settings.topic_prefix}.doomed", partitions=1)
    create_source_table(settings, "doomed", {"id": "int", "v": "int"}, ["id"], source.name, "upsert-json",
                        client=redis_client)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    admin.delete_topics([source.name])[source.name].result(30)
    deadline = time.monotonic() + 30
    while source.name in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the topic was not deleted"
        time.sleep(0.2)
    run = mvlog(settings, "run-source", "doomed", "--until-caught-up")
    assert run.exit_code == 1 and f"source topic {source.name!r} does not exist" in run.stderr, run.output
    status = json.loads(mvlog(settings, "status", "-o", "json").stdout)
    (doomed,) = [v for v in status["views"] if v["name"] == "doomed"]
    assert any("does not exist" in p for p in doomed["source"]["problems"]), doomed["source"]
    metrics = generate_latest(pipeline_registry(lambda: take_snapshot(settings, redis_client))).decode()
    assert f'mvlog_source_problem{{table="doomed",topic="{source.name}"}} 1.0' in metrics, metrics


def test_bad_records_are_dead_lettered_and_counted(settings: Settings, redis_client: redis.Redis) -> None:
    source = SourceTopic(settings, f"{settings.topic_prefix}.mixed")
    create_source_table(settings, "mixed", {"id": "int", "v": "int", "label": "string"}, ["id"], source.name,
                        "upsert-json", client=redis_client)
    rng = random.Random(5)
    upsert_workload(source, rng, 800, bad_share=0.1)
    source.flush()
    with SourceIngester(settings, "mixed", redis_client) as ingester:
        first = ingester.run(until_caught_up=True)
    assert first.dead_letters == len(source.bad) > 20 and first.messages == 800
    upsert_workload(source, rng, 300, bad_share=0.1)  # a second ingester goes on counting from the barriers
    source.flush()
    with SourceIngester(settings, "mixed", redis_client) as ingester:
        assert ingester.dead_letters == first.dead_letters
        ingester.run(until_caught_up=True)
    assert table_rows(redis_client, settings, "mixed", ("id",)) == source.fold()
    assert check_dead_letters(settings, "mixed", source) == len(source.bad)
    check_every_epoch(settings, "mixed", ("id",), source)
    snapshot = take_snapshot(settings, redis_client)
    (mixed,) = [v for v in snapshot.views if v.name == "mixed"]
    assert mixed.source is not None and mixed.source.dead_letters == len(source.bad) and not mixed.source.problems
    metrics = generate_latest(pipeline_registry(lambda: take_snapshot(settings, redis_client))).decode()
    assert f'mvlog_source_dead_letters_total{{table="mixed",topic="{source.name}"}} {float(len(source.bad))}' \
        in metrics, metrics


def test_source_lag_in_status_lag_and_metrics(settings: Settings, redis_client: redis.Redis) -> None:
    source = SourceTopic(settings, f"{settings.topic_prefix}.behind")
    create_source_table(settings, "behind", {"id": "int", "v": "int", "label": "string"}, ["id"], source.name,
                        "upsert-json", client=redis_client)
    upsert_workload(source, random.Random(9), 500)
    source.flush()
    time.sleep(1.0)  # the oldest message waits at least this long
    lag = json.loads(mvlog(settings, "lag", "behind", "-o", "json").stdout)
    assert [(r["view"], r["upstream"], r["records"]) for r in lag] == [("behind", f"topic:{source.name}", 500)]
    assert lag[0]["seconds"] >= 1.0, lag
    text = mvlog(settings, "status")
    assert text.exit_code == 0 and "topic " + source.name in text.stdout and "500" in text.stdout, text.stdout
    metrics = generate_latest(pipeline_registry(lambda: take_snapshot(settings, redis_client))).decode()
    assert f'mvlog_source_lag_records{{table="behind",topic="{source.name}"}} 500.0' in metrics, metrics
    # The sampler (the dashboard's) records it in Redis, where status reads it.
    sampler = LagSampler(settings, redis_client)
    try:
        assert sampler.tick()
    finally:
        sampler.stop()
    stored = SourceStatusStore(redis_client, settings.topic_prefix).read(settings, CatalogStore(
        settings, redis_client).all())["behind"]
    assert stored.lag is not None and stored.lag.records == 500
    with SourceIngester(settings, "behind", redis_client) as ingester:
        ingester.run(until_caught_up=True)
    # (fresh samples are reused for three intervals: the sampler's above may still be current)
    time.sleep(3 * settings.lag_sample_interval_ms / 1000 + 1.1)
    caught_up = json.loads(mvlog(settings, "lag", "-o", "json").stdout)
    assert [(r["records"], r["seconds"]) for r in caught_up] == [(0, 0.0)], caught_up


class TimedIngester(SourceIngester):
    """An ingester that notes when each epoch committed and the offsets it committed (for the timing test)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.commits: list[tuple[float, dict[int, int]]] = []

    def epoch_committed(self, epoch: int, positions: Mapping[int, int], messages: int) -> None:
        self.commits.append((time.time(), dict(positions)))


def test_an_idle_and_a_lagging_partition_do_not_hold_epochs_back(settings: Settings, redis_client: redis.Redis,
                                                                  report: Callable[[str], None]) -> None:
    """Partition 0 gets a steady stream, partition 1 starts with a backlog of 30k messages, partition 2 gets
    none: epochs are still cut every barrier interval (the pace caps an epoch at what commits in time),
    and the live messages of partition 0 are committed within seconds, backlog or not. Once the topic is
    quiet, the table goes on cutting (empty) epochs, so a view joining it with another is not held back."""
    interval = settings.barrier_interval_ms / 1000
    source = SourceTopic(settings, f"{settings.topic_prefix}.skewed")
    create_source_table(settings, "skewed", {"id": "int", "v": "int", "label": "string"}, ["id"], source.name,
                        "upsert-json", client=redis_client)
    for i in range(30_000):
        source.send(100_000 + i % 5000, {"v": i}, (100_000 + i % 5000,), None, partition=1)
    source.flush()
    stop, live_done = threading.Event(), threading.Event()

    def live() -> None:
        for i in range(160):  # 8 s at 20 messages/s on partition 0 only
            source.send(i % 50, {"v": i}, (i % 50,), None, partition=0)
            source.producer.flush(5)
            time.sleep(0.05)
        live_done.set()

    ingester = TimedIngester(settings, "skewed", redis_client)
    with ingester:
        producer = threading.Thread(target=live, daemon=True)
        runner = threading.Thread(target=ingester.run, args=(stop,), daemon=True)
        runner.start()
        producer.start()
        producer.join(60)
        deadline = time.monotonic() + 60
        while not (ingester.commits and ingester.commits[-1][1].get(1) == 30_000
                   and ingester.commits[-1][1].get(0) == 160):
            assert time.monotonic() < deadline, "the ingester did not catch up"
            time.sleep(0.05)
        quiet_from = time.time()  # nothing more to read: the table still cuts (empty) epochs
        time.sleep(6 * interval)
        stop.set()
        runner.join(60)
    commits = ingester.commits
    quiet = [t for t, _ in commits if t > quiet_from]
    assert len(quiet) >= 3, f"{len(quiet)} epochs in {6 * interval:.1f} s of a quiet topic"
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(commits)]
    assert commits[-1][1].get(1) == 30_000 and 2 not in commits[-1][1]  # the backlog is in, partition 2 idle
    assert len(commits) >= 8 / interval * 0.6, f"{len(commits)} epochs in 8 s"
    assert max(gaps) < interval + 1.0, f"an epoch took {max(gaps):.2f} s to cut (interval {interval} s): {gaps}"
    latencies = []
    for (p, offset), stamp in source.stamps.items():
        if p == 0:
            committed_at = next(t for t, offsets in commits if offsets.get(0, 0) > offset)
            latencies.append(committed_at - stamp / 1000)
    latencies.sort()
    p50, worst = latencies[len(latencies) // 2], latencies[-1]
    # Live messages of partition 0 wait behind the backlog librdkafka fetched ahead (one queue, first in
    # first out; the ingester bounds the prefetch per partition): seconds, not the whole backlog's time.
    assert worst < 8.0, f"live messages waited up to {worst:.2f} s (p50 {p50:.2f} s)"
    report(f"idle + lagging partitions: {len(commits)} epochs, longest cut {max(gaps):.2f} s (interval {interval} s); "
           f"live partition 0 while a 30k backlog was read: p50 {p50:.2f} s, max {worst:.2f} s")


def test_partitions_added_while_the_source_runs_are_read_from_their_start(settings: Settings,
                                                                         redis_client: redis.Redis) -> None:
    """An operator adds partitions to a source topic while `run-source` runs, and a producer writes to them
    at once: the running ingester starts reading them (from their first message), nothing is missed."""
    source = SourceTopic(settings, f"{settings.topic_prefix}.grown", partitions=1)
    create_source_table(settings, "grown", {"id": "int", "v": "int"}, ["id"], source.name, "upsert-json",
                        client=redis_client)
    for k in range(40):
        source.send({"id": k}, {"id": k, "v": k}, (k,), {"id": k, "v": k})
    source.flush()
    stop = threading.Event()

    def table_is(expected: dict[Key, Any], what: str) -> None:
        deadline = time.monotonic() + 60
        while table_rows(redis_client, settings, "grown", ("id",)) != expected:
            assert runner.is_alive(), "the ingester stopped"
            assert time.monotonic() < deadline, f"the table never held {what}"
            time.sleep(0.1)

    with SourceIngester(settings, "grown", redis_client) as ingester:
        runner = threading.Thread(target=ingester.run, args=(stop,), daemon=True)
        runner.start()
        try:
            table_is(source.fold(), "partition 0's messages")
            admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
            admin.create_partitions([NewPartitions(source.name, 3)])[source.name].result(30)
            deadline = time.monotonic() + 30
            while len(source.producer.list_topics(source.name, 10).topics[source.name].partitions) < 3:
                assert time.monotonic() < deadline, "the producer never saw the new partitions"
                time.sleep(0.1)
            for k in range(40, 100):  # to the new partitions, updates of old keys among them
                key = k if k % 3 else k - 40
                source.send({"id": key}, {"id": key, "v": k}, (key,), {"id": key, "v": k}, partition=1 + k % 2)
            source.flush()
            table_is(source.fold(), "the new partitions' messages")
        finally:
            stop.set()
            runner.join(60)
    assert committed_offsets(settings, "grown", source.name, 3) == end_offsets(settings, source.name, 3)


def test_sigkilled_run_source_loses_and_doubles_nothing(settings: Settings, redis_client: redis.Redis,
                                                        report: Callable[[str], None]) -> None:
    rng = random.Random(int(os.environ.get("MVLOG_TEST_SEED", "1818")))
    source = SourceTopic(settings, f"{settings.topic_prefix}.orders")
    ok = mvlog(settings, "create-table", "orders", "-c", "id:int", "-c", "v:int", "-c", "label:string",
               "-k", "id", "--from-topic", source.name, "--format", "upsert-json")
    assert ok.exit_code == 0, ok.output
    stop = threading.Event()

    def produce() -> None:
        writer_rng = random.Random(rng.random())
        while not stop.is_set():
            upsert_workload(source, writer_rng, 100, bad_share=0.03)
            time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | env_of(settings)
    kills = 0
    try:
        while kills < 7:
            child = subprocess.Popen([*MVLOG, "run-source", "orders"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
            if kills % 3 == 2:  # somewhere in its start-up (fencing, roll-forward, offsets)
                time.sleep(rng.uniform(0.2, 2.5))
            else:  # while it ingests: before, during or after an epoch's commit
                assert child.stderr is not None
                while "ingesting topic" not in (line := child.stderr.readline()):
                    assert line, f"run-source ended: {child.communicate()[1]}"
                time.sleep(rng.uniform(0.05, 2.0))
            assert child.poll() is None, child.communicate()[1]
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            kills += 1
    finally:
        stop.set()
        producer.join(30)
    source.flush()
    final = subprocess.run([*MVLOG, "run-source", "orders", "--until-caught-up"], env=env, capture_output=True,
                           text=True, timeout=180)
    assert final.returncode == 0, final.stderr
    expected = source.fold()
    assert table_rows(redis_client, settings, "orders", ("id",)) == expected
    assert committed_offsets(settings, "orders", source.name, 3) == end_offsets(settings, source.name, 3)
    epochs = check_every_epoch(settings, "orders", ("id",), source)
    assert epochs > kills  # most runs committed epochs before their kill
    dead = check_dead_letters(settings, "orders", source)  # each once, though runs were killed mid-epoch
    counted = SourceStatusStore(redis_client, settings.topic_prefix).read(
        settings, [CatalogStore(settings, redis_client).get("orders")])["orders"].dead_letters
    assert counted == dead == len(source.bad) > 0
    report(f"{kills} SIGKILLs of run-source, {len(source.effects)} messages, {epochs} epochs checked, "
           f"{len(expected)} rows, {dead} bad records dead-lettered once each: exact")



def test_run_source_killed_between_kafka_and_redis_loses_nothing(settings: Settings,
                                                                 redis_client: redis.Redis) -> None:
    """The window the random kills above rarely hit: the epoch's transaction committed the changes and the
    consumed offsets, Redis never applied it. The next ingester must roll Redis forward over that epoch
    (abandoning it would lose its messages: the group's offsets are already past them)."""
    rng = random.Random(1819)
    source = SourceTopic(settings, f"{settings.topic_prefix}.payments")
    create_source_table(settings, "payments", {"id": "int", "v": "int", "label": "string"}, ["id"], source.name,
                        "upsert-json", client=redis_client)
    upsert_workload(source, rng, 800)
    source.flush()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    killed = subprocess.run([sys.executable, "-m", "tests.integration.processes.source_killed_before_redis",
                             settings.model_dump_json(), "payments"], capture_output=True, text=True, cwd=root,
                            env=env, timeout=120)
    assert killed.returncode == -9, killed.stderr
    epoch = int(killed.stdout.split()[1])
    store = ViewStore(redis_client, settings.topic_prefix)
    assert (store.mce("payments") or 0) < epoch  # Kafka has the epoch and its offsets, Redis does not
    assert sum(committed_offsets(settings, "payments", source.name, 3).values()) > 0
    upsert_workload(source, rng, 300)
    source.flush()
    with SourceIngester(settings, "payments", redis_client) as ingester:
        ingester.run(until_caught_up=True)
    assert table_rows(redis_client, settings, "payments", ("id",)) == source.fold()
    assert committed_offsets(settings, "payments", source.name, 3) == end_offsets(settings, source.name, 3)
    assert check_every_epoch(settings, "payments", ("id",), source) >= 2


def test_run_source_rides_out_a_redis_restart(make_settings: Callable[..., Settings], tmp_path: Path,
                                              report: Callable[[str], None]) -> None:
    """redis-server SIGKILLed and restarted from its AOF while ``run-source`` ingests a busy topic: the
    ingester waits for it (one line when Redis goes, one when it is back), never exits, and the table is
    exact at every committed epoch (issue 21, item 2, for source ingesters)."""
    aof = AofRedis(tmp_path / "redis")
    aof.start()
    settings = make_settings(redis_url=aof.url)
    client = redis.Redis.from_url(aof.url)
    rng = random.Random(2121)
    source = SourceTopic(settings, f"{settings.topic_prefix}.orders")
    ok = mvlog(settings, "create-table", "orders", "-c", "id:int", "-c", "v:int", "-c", "label:string",
               "-k", "id", "--from-topic", source.name, "--format", "upsert-json")
    assert ok.exit_code == 0, ok.output
    stop = threading.Event()

    def produce() -> None:
        writer_rng = random.Random(rng.random())
        while not stop.is_set():
            upsert_workload(source, writer_rng, 50)
            time.sleep(0.05)

    env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | env_of(settings)
    log_file = tmp_path / "run-source.log"
    with log_file.open("wb") as sink:
        child = subprocess.Popen([*MVLOG, "run-source", "orders"], env=env, stdout=sink, stderr=subprocess.STDOUT)
    producer = threading.Thread(target=produce, daemon=True)
    store = ViewStore(client, settings.topic_prefix)
    try:
        def alive() -> None:
            assert child.poll() is None, f"run-source exited with {child.returncode}:\n{log_file.read_text()}"

        def wait(condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
            deadline = time.monotonic() + timeout
            while not condition():
                alive()
                assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log_file.read_text()}"
                time.sleep(0.1)

        producer.start()
        wait(lambda: (store.mce("orders") or 0) >= 3, "the first epochs")
        before = store.mce("orders") or 0
        aof.kill()
        aof.restart_after(DOWN_S).join()
        wait(lambda: (store.mce("orders") or 0) > before + 3, "epochs after the restart")
        stop.set()
        producer.join(30)
        source.flush()
        ends = end_offsets(settings, source.name, 3)
        wait(lambda: committed_offsets(settings, "orders", source.name, 3) == ends, "the topic's end", 120)
        alive()
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == 0, log_file.read_text()
    finally:
        stop.set()
        if child.poll() is None:
            child.kill()
            child.wait()
        aof.stop()
        aof.start()  # the checks below read the table's Redis state
    output = log_file.read_text()
    assert f"Redis at 127.0.0.1:{aof.port} unreachable" in output and "back after" in output, output
    assert "Traceback" not in output, output
    assert table_rows(client, settings, "orders", ("id",)) == source.fold()
    epochs = check_every_epoch(settings, "orders", ("id",), source)
    aof.stop()
    report(f"run-source through a {DOWN_S:.0f} s Redis outage: {len(source.effects)} messages, {epochs} epochs "
           "checked against the fold, no exit")


def test_run_source_rides_out_a_broker_restart(tmp_path: Path, report: Callable[[str], None]) -> None:
    """The Kafka broker SIGKILLed while ``run-source`` ingests (its epoch's transaction open) and restarted on
    its log folder: the ingester reconnects, never exits, and the table is exact at every committed epoch
    (issue 21, item 2, for source ingesters)."""
    with own_stack(tmp_path) as stack:
        settings = stack_settings(stack, "brokerkill")
        client = redis.Redis.from_url(settings.redis_url)
        source = SourceTopic(settings, f"{settings.topic_prefix}.orders")
        ok = mvlog(settings, "create-table", "orders", "-c", "id:int", "-c", "v:int", "-c", "label:string",
                   "-k", "id", "--from-topic", source.name, "--format", "upsert-json")
        assert ok.exit_code == 0, ok.output
        rng = random.Random(2122)
        upsert_workload(source, rng, 2000)
        source.flush()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | env_of(settings)
        log_file = tmp_path / "run-source.log"
        with log_file.open("wb") as sink:
            child = subprocess.Popen([*MVLOG, "run-source", "orders"], env=env, stdout=sink,
                                     stderr=subprocess.STDOUT)
        store = ViewStore(client, settings.topic_prefix)
        try:
            def wait(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
                deadline = time.monotonic() + timeout
                while not condition():
                    assert child.poll() is None, f"run-source exited ({child.returncode}):\n{log_file.read_text()}"
                    assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log_file.read_text()}"
                    time.sleep(0.1)

            wait(lambda: (store.mce("orders") or 0) >= 2, "the first epochs")
            upsert_workload(source, rng, 500)  # being ingested when the broker dies
            source.producer.poll(0.2)
            before = store.mce("orders") or 0
            stack.kill("kafka")
            restart = stack.start()
            assert restart.started == ("kafka",)
            upsert_workload(source, rng, 2000)
            source.flush()
            wait(lambda: (store.mce("orders") or 0) > before + 2, "epochs after the restart")
            ends = end_offsets(settings, source.name, 3)
            wait(lambda: committed_offsets(settings, "orders", source.name, 3) == ends, "the topic's end")
            child.send_signal(signal.SIGTERM)
            assert child.wait(60) == 0, log_file.read_text()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        output = log_file.read_text()
        assert "Traceback" not in output, output
        assert table_rows(client, settings, "orders", ("id",)) == source.fold()
        epochs = check_every_epoch(settings, "orders", ("id",), source)
        client.close()
    restarts = [line for line in output.splitlines() if "ingesting again from the committed offsets" in line]
    report(f"run-source through a broker SIGKILL and restart: {len(source.effects)} messages, {epochs} epochs "
           f"checked against the fold, no exit; ingester restarted {len(restarts)} time(s) {restarts[:1]}")

@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MVLOG_") and n != "MVLOG_TEST_STACK"]:
        monkeypatch.delenv(name)
