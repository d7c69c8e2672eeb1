"""Avro source tables against a real Schema Registry (issue 18): Apicurio Registry's Confluent-compatible
API (the ``schema_registry`` fixture, from Maven Central), not ``.avsc`` files.

Schemas are registered through the registry's HTTP API (``POST /subjects/{subject}/versions``); messages
are written by Confluent's own ``AvroSerializer`` with its ``SchemaRegistryClient`` (which looks each
schema's id up in the registry: ids mvlog never saw in a file), so the framing and the ids are the
registry's, independently of mvlog's decoder. ``create-table --schema-registry URL`` takes the columns from
the subject's latest schema; ``mvlog run-source`` fetches every writer schema by id. The oracle is the
effect the producer meant each message to have, at every committed epoch
(:func:`tests.integration.test_source_tables.check_every_epoch`).
"""

from __future__ import annotations

import datetime
import decimal
import json
import random
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import redis
from click.testing import CliRunner, Result
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from mvlog.config import Settings
from mvlog.infra.local_stack import free_port
from mvlog.infra.schema_registry import CCOMPAT_PATH, RegistryServer
from mvlog.services.cli import main
from tests.integration.test_source_avro import ENVELOPE, ORDER_KEY, ORDER_V1, ORDER_V2, ORDER_V3, AvroTopic
from tests.integration.test_source_tables import _no_stray_env as _no_stray_env  # the same clean environment
from tests.integration.test_source_tables import (
    check_dead_letters,
    check_every_epoch,
    committed_offsets,
    end_offsets,
    env_of,
    mvlog,
    table_rows,
)

_JSON = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


def _call(url: str, method: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to the registry's Confluent API: (HTTP status, decoded JSON answer)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=_JSON, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def register(registry: RegistryServer, subject: str, schema: dict[str, Any]) -> int:
    """Register ``schema`` under ``subject`` through the HTTP API; its schema id."""
    status, answer = _call(f"{registry.url}/subjects/{urllib.parse.quote(subject, safe='')}/versions", "POST",
                           {"schema": json.dumps(schema)})
    assert status == 200, (status, answer)
    return int(answer["id"])


def serializer(client: SchemaRegistryClient, schema: dict[str, Any]) -> AvroSerializer:
    """Confluent's serializer of ``schema``, which must already be registered (it asks the registry its id)."""
    made: AvroSerializer = AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": False})
    return made


def schema_id_of(message: bytes) -> int:
    assert message[0] == 0, message[:5]
    return int.from_bytes(message[1:5], "big")


class RegistryProducer:
    """upsert-avro messages of one topic written by Confluent's serializers: the key as an Avro ``OrderKey``
    record under ``<topic>-key``, the value as the given value schema under ``<topic>-value``."""

    def __init__(self, source: AvroTopic, client: SchemaRegistryClient) -> None:
        self.source = source
        self.client = client
        self.keys = serializer(client, ORDER_KEY)

    def workload(self, rng: random.Random, count: int, value_schema: dict[str, Any], keys: int = 40) -> set[int]:
        """``count`` messages over ``keys`` keys (repeated within and across epochs), a fifth of them
        tombstones; fields the value schema adds beyond v1 are set but are no column. The schema ids used."""
        values = serializer(self.client, value_schema)
        extra = [f["name"] for f in value_schema["fields"][len(ORDER_V1["fields"]):]]
        ids: set[int] = set()
        for _ in range(count):
            k = rng.randrange(keys)
            key = self.keys({"id": k}, SerializationContext(self.source.name, MessageField.KEY))
            assert key is not None
            ids.add(schema_id_of(key))
            if rng.random() < 0.2:
                self.source.send_raw(key, None, (k,), None)
                continue
            row: dict[str, Any] = {"id": k, "v": rng.randrange(-1000, 1000), "label": rng.choice(["a", "b", None])}
            value = values({**row, **{name: rng.choice([None, "n"]) for name in extra}},
                           SerializationContext(self.source.name, MessageField.VALUE))
            assert value is not None
            ids.add(schema_id_of(value))
            self.source.send_raw(key, value, (k,), row)
        return ids


def test_upsert_avro_through_a_real_schema_registry_with_an_added_field(
        settings: Settings, redis_client: redis.Redis, schema_registry: RegistryServer) -> None:
    """Columns from the registry's latest value schema; v1 messages, then a second registered version with
    an added nullable field (the registry's BACKWARD rule accepts it, and refuses a changed type) written
    beside v1 messages: every message is in the table, upserts and deletes applied, nothing twice."""
    source = AvroTopic(settings, f"{settings.topic_prefix}.reg-orders")
    key_subject, value_subject = f"{source.name}-key", f"{source.name}-value"
    key_id = register(schema_registry, key_subject, ORDER_KEY)
    v1_id = register(schema_registry, value_subject, ORDER_V1)
    status, answer = _call(f"{schema_registry.url}/config/{value_subject}", "PUT", {"compatibility": "BACKWARD"})
    assert status == 200 and answer["compatibilityLevel"] == "BACKWARD", answer

    created = mvlog(settings, "create-table", "rorders", "-k", "id", "--from-topic", source.name,
                    "--format", "upsert-avro", "--schema-registry", schema_registry.url)
    assert created.exit_code == 0, created.output
    assert "(id int primary key, v int, label string, columns from the Avro schema)" in created.stdout, created.stdout

    producer = RegistryProducer(source, SchemaRegistryClient({"url": schema_registry.url}))
    rng = random.Random(1810)
    assert producer.workload(rng, 1200, ORDER_V1) == {key_id, v1_id}
    unknown = 4242  # framed with an id the registry does not know: a bad record, dead-lettered
    source.send_bad(b"7", b"\x00" + unknown.to_bytes(4, "big") + b"\x0e\x02\x00", f"unknown Avro schema id {unknown}")
    source.flush()
    first = mvlog(settings, "run-source", "rorders", "--until-caught-up")
    assert first.exit_code == 0, first.output
    assert table_rows(redis_client, settings, "rorders", ("id",)) == source.fold()

    v2_id = register(schema_registry, value_subject, ORDER_V2)  # BACKWARD-compatible: an added nullable field
    assert v2_id not in (key_id, v1_id)
    status, answer = _call(f"{schema_registry.url}/subjects/{value_subject}/versions", "POST",
                           {"schema": json.dumps(ORDER_V3)})  # v: int -> string
    assert status == 409, (status, answer)
    assert producer.workload(rng, 600, ORDER_V2) == {key_id, v2_id}
    producer.workload(rng, 200, ORDER_V1)  # a producer not upgraded yet: both versions in one epoch
    source.flush()
    second = mvlog(settings, "run-source", "rorders", "--until-caught-up")
    assert second.exit_code == 0, second.output

    expected = source.fold()
    assert table_rows(redis_client, settings, "rorders", ("id",)) == expected and len(expected) > 20
    assert committed_offsets(settings, "rorders", source.name, 3) == end_offsets(settings, source.name, 3)
    assert check_every_epoch(settings, "rorders", ("id",), source) >= 2
    assert check_dead_letters(settings, "rorders", source) == 1


def test_debezium_avro_columns_from_the_registry_equals_the_fold(
        settings: Settings, redis_client: redis.Redis, schema_registry: RegistryServer) -> None:
    """debezium-avro: the columns come from the ``after`` record of the envelope the registry holds (a
    record referenced by name in it); snapshot reads, inserts, updates and deletes (each followed by its
    tombstone), all framed by Confluent's serializer with the registry's ids."""
    source = AvroTopic(settings, f"{settings.topic_prefix}.db1.public.items")
    register(schema_registry, f"{source.name}-key", ORDER_KEY)
    register(schema_registry, f"{source.name}-value", ENVELOPE)
    created = mvlog(settings, "create-table", "ritems", "-k", "id", "--from-topic", source.name,
                    "--format", "debezium-avro", "--schema-registry", schema_registry.url)
    assert created.exit_code == 0, created.output
    assert "(id int primary key, price float, ok boolean, data bytes, at int, columns from the Avro" in created.stdout
    client = SchemaRegistryClient({"url": schema_registry.url})
    keys, values = serializer(client, ORDER_KEY), serializer(client, ENVELOPE)
    rng = random.Random(1813)
    present: dict[int, dict[str, Any]] = {}
    for i in range(600):
        k = rng.randrange(30)
        src = {"connector": "postgresql", "lsn": 5000 + 8 * i, "snapshot": "true" if i < 10 else "false"}
        before = present.get(k)
        effect: dict[str, Any] | None
        if before is not None and rng.random() < 0.3:
            event: dict[str, Any] = {"op": "d", "before": {"id": k}, "after": None, "source": src}
            effect = None
            del present[k]
        else:
            cents, at = rng.randrange(100000), 1732540000000 + rng.randrange(10**9)
            after = {"id": k, "price": None if cents % 7 == 0 else decimal.Decimal(cents).scaleb(-2),
                     "ok": rng.random() < 0.5, "data": rng.randbytes(3),
                     "at": datetime.datetime.fromtimestamp(at / 1000, tz=datetime.UTC)}
            event = {"op": "r" if i < 10 else "c" if before is None else "u", "before": before, "after": after,
                     "source": src}
            present[k] = after
            effect = {**after, "price": None if after["price"] is None else cents / 100, "at": at}
        key = keys({"id": k}, SerializationContext(source.name, MessageField.KEY))
        value = values(event, SerializationContext(source.name, MessageField.VALUE))
        assert key is not None and value is not None
        source.send_raw(key, value, (k,), effect)
        if effect is None:
            source.send_raw(key, None, (k,), None)  # the tombstone: no change
    source.flush()
    run = mvlog(settings, "run-source", "ritems", "--until-caught-up")
    assert run.exit_code == 0, run.output
    assert table_rows(redis_client, settings, "ritems", ("id",)) == source.fold()
    assert check_every_epoch(settings, "ritems", ("id",), source) >= 1


def test_a_registered_schema_the_columns_cannot_take_stops_the_source(
        settings: Settings, redis_client: redis.Redis, schema_registry: RegistryServer) -> None:
    """A writer schema fetched from the registry that changes a column's type (registered under another
    subject, as a producer with its own naming strategy would) stops the source at its first message,
    naming its id and the field; ``--accept-schema`` then dead-letters what cannot be typed."""
    source = AvroTopic(settings, f"{settings.topic_prefix}.reg-evo", partitions=1)
    register(schema_registry, f"{source.name}-key", ORDER_KEY)
    register(schema_registry, f"{source.name}-value", ORDER_V1)
    v3_id = register(schema_registry, f"{source.name}-shop.Order", ORDER_V3)
    created = mvlog(settings, "create-table", "revo", "-k", "id", "--from-topic", source.name,
                    "--format", "upsert-avro", "--schema-registry", schema_registry.url)
    assert created.exit_code == 0, created.output
    client = SchemaRegistryClient({"url": schema_registry.url})
    producer = RegistryProducer(source, client)
    rng = random.Random(1811)
    producer.workload(rng, 150, ORDER_V1)
    source.flush()
    stop_at = end_offsets(settings, source.name, 1)[0]
    changed = AvroSerializer(client, json.dumps(ORDER_V3), conf={
        "auto.register.schemas": False,
        "subject.name.strategy": lambda ctx, name: f"{source.name}-{name}"})  # the record-name subject
    value = changed({"id": 5, "v": "five", "label": None}, SerializationContext(source.name, MessageField.VALUE))
    assert value is not None and schema_id_of(value) == v3_id
    source.send_bad(b"5", value, "expected int, got str 'five'")
    producer.workload(rng, 50, ORDER_V1)  # after the stop: not ingested until accepted
    source.flush()

    stopped = mvlog(settings, "run-source", "revo", "--until-caught-up")
    assert stopped.exit_code == 1, stopped.output
    assert f"source stopped at {source.name}[0]@{stop_at}" in stopped.stderr, stopped.stderr
    assert f"writer schema id {v3_id}, field 'v'" in stopped.stderr, stopped.stderr
    assert committed_offsets(settings, "revo", source.name, 1) == {0: stop_at}
    assert table_rows(redis_client, settings, "revo", ("id",)) == source.fold({0: stop_at})

    accepted = mvlog(settings, "run-source", "revo", "--until-caught-up", "--accept-schema", str(v3_id))
    assert accepted.exit_code == 0, accepted.output
    assert table_rows(redis_client, settings, "revo", ("id",)) == source.fold()
    assert check_dead_letters(settings, "revo", source) == 1
    check_every_epoch(settings, "revo", ("id",), source)


def test_an_unreachable_registry_stops_the_source_with_its_address(
        settings: Settings, redis_client: redis.Redis, schema_registry: RegistryServer) -> None:
    """A registry that does not answer is no bad record: the source stops, naming the URL that failed, and
    commits nothing; with ``MVLOG_SCHEMA_REGISTRY_URL`` then pointing at the real registry (the table names
    none of its own) it ingests everything."""
    source = AvroTopic(settings, f"{settings.topic_prefix}.reg-gone", partitions=1)
    register(schema_registry, f"{source.name}-key", ORDER_KEY)
    register(schema_registry, f"{source.name}-value", ORDER_V1)
    created = mvlog(settings, "create-table", "rgone", "-c", "id:int", "-c", "v:int", "-c", "label:string",
                    "-k", "id", "--from-topic", source.name, "--format", "upsert-avro")
    assert created.exit_code == 0, created.output
    RegistryProducer(source, SchemaRegistryClient({"url": schema_registry.url})).workload(
        random.Random(1812), 100, ORDER_V1)
    source.flush()

    def run_source(registry_url: str) -> Result:
        return CliRunner().invoke(main, ["run-source", "rgone", "--until-caught-up"], catch_exceptions=False,
                                  env={**env_of(settings), "MVLOG_SCHEMA_REGISTRY_URL": registry_url})

    gone = f"http://127.0.0.1:{free_port()}{CCOMPAT_PATH}"  # nothing listens there
    stopped = run_source(gone)
    assert stopped.exit_code == 1, stopped.output
    assert f"Schema Registry {gone}/schemas/ids/" in stopped.stderr, stopped.stderr
    assert committed_offsets(settings, "rgone", source.name, 1) == {}
    assert table_rows(redis_client, settings, "rgone", ("id",)) == {}
    resumed = run_source(schema_registry.url)
    assert resumed.exit_code == 0, resumed.output
    assert table_rows(redis_client, settings, "rgone", ("id",)) == source.fold()
    check_every_epoch(settings, "rgone", ("id",), source)
