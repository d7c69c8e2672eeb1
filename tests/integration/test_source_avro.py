"""Avro source tables (issue 18): upsert-avro and debezium-avro topics in the Confluent wire format, the
oracle fold at every committed epoch, schema evolution (an added nullable field accepted, a changed type
stopping the source at that message), bad records dead-lettered, and SIGKILLs of ``mvlog run-source``.

Writer schemas come from ``.avsc`` files given to ``create-table --avro-schema ID=FILE`` (a real Schema
Registry: ``test_source_schema_registry.py``). Messages are encoded by fastavro's writer behind Confluent's framing
(byte 0, the 4-byte schema id), independently of the decoder under test; the oracle is the effect the
producer meant each message to have (:class:`tests.integration.test_source_tables.SourceTopic`).
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from fastavro import parse_schema, schemaless_writer

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.source_status import SourceStatusStore
from mvlog.row_schema import Key
from mvlog.services.sources.ingester import SourceIngester
from tests.integration.test_source_tables import (
    MVLOG,
    Effect,
    SourceTopic,
    check_dead_letters,
    check_every_epoch,
    committed_offsets,
    end_offsets,
    env_of,
    mvlog,
    table_rows,
)
from tests.integration.test_source_tables import _no_stray_env as _no_stray_env  # the same clean environment

ORDER_V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "v", "type": "int"},
    {"name": "label", "type": ["null", "string"], "default": None}]}
ORDER_V2: dict[str, Any] = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                                   {"name": "note", "type": ["null", "string"], "default": None}]}
ORDER_V3: dict[str, Any] = {**ORDER_V1, "fields": [{"name": "id", "type": "long"}, {"name": "v", "type": "string"},
                                                   ORDER_V1["fields"][2]]}
ORDER_KEY: dict[str, Any] = {"type": "record", "name": "OrderKey", "namespace": "shop",
                             "fields": [{"name": "id", "type": "long"}]}
ITEM: dict[str, Any] = {"type": "record", "name": "Value", "namespace": "db1.public.items", "fields": [
    {"name": "id", "type": "int"},
    {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2}],
     "default": None},
    {"name": "ok", "type": ["null", "boolean"], "default": None},
    {"name": "data", "type": ["null", "bytes"], "default": None},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None}]}
ENVELOPE: dict[str, Any] = {"type": "record", "name": "Envelope", "namespace": "db1.public.items", "fields": [
    {"name": "before", "type": ["null", ITEM], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "connector", "type": "string"}, {"name": "lsn", "type": "long"},
                                           {"name": "snapshot", "type": ["null", "string"], "default": None}]}},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
SCHEMAS = {1: ORDER_V1, 2: ORDER_V2, 3: ORDER_V3, 9: ORDER_KEY, 21: ENVELOPE}
_PARSED = {schema_id: parse_schema(schema) for schema_id, schema in SCHEMAS.items()}


def framed(schema_id: int, record: Any) -> bytes:
    """Confluent's wire format, as its AvroSerializer writes it."""
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    schemaless_writer(out, _PARSED[schema_id], record)
    return out.getvalue()


def avsc_options(tmp_path: Path, *ids: int) -> list[str]:
    """``--avro-schema ID=FILE`` options for ``create-table``, the schemas written as .avsc files."""
    options = []
    for schema_id in ids:
        path = tmp_path / f"schema-{schema_id}.avsc"
        path.write_text(json.dumps(SCHEMAS[schema_id], indent=2))
        options += ["--avro-schema", f"{schema_id}={path}"]
    return options


class AvroTopic(SourceTopic):
    """A source topic whose messages are Confluent-framed Avro; ``send`` takes the encoded bytes."""

    def send_raw(self, key: bytes | None, value: bytes | None, effect_key: Key | None, effect: Effect) -> None:
        """A message meant to leave ``effect`` for ``effect_key`` (None: a redelivery, meant to change nothing)."""
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            if effect_key is not None:
                self.effects[(msg.partition(), msg.offset())] = (effect_key, effect)

        self._produce(key, value, delivered, None)


AVRO_BAD: list[tuple[bytes | None, bytes | None, str]] = [
    (b"7", b"\x01\x00\x00\x00\x01\x02\x02\x00", "not the Confluent magic byte 0"),
    (b"7", b"\x00\x00\x00\x00\x63\x0e\x02\x00", "unknown Avro schema id 99"),
    (b"7", b"\x00\x00\x00\x00\x01\x0e", "does not decode with Avro schema id 1"),
    (b"7", b'{"id": 7, "v": 1}', "not the Confluent magic byte 0"),
    (None, framed(1, {"id": 7, "v": 1, "label": None}), "the message has no key"),
]


def upsert_avro_workload(source: AvroTopic, rng: random.Random, count: int, keys: int = 40,
                         bad_share: float = 0.0, schema_id: int = 1) -> None:
    """upsert-avro: keys repeated within and across epochs, an Avro key (schema 9) or a JSON bare key
    (fixed per key, so a key's messages share a partition), tombstones, ``bad_share`` bad records."""
    for _ in range(count):
        if bad_share and rng.random() < bad_share:
            key, value, problem = rng.choice(AVRO_BAD)
            source.send_bad(key, value, problem)
            continue
        k = rng.randrange(keys)
        message_key = framed(9, {"id": k}) if k % 2 else str(k).encode()
        if rng.random() < 0.2:
            source.send_raw(message_key, None, (k,), None)
            continue
        v, label = rng.randrange(-1000, 1000), rng.choice(["a", "b", None])
        record: dict[str, Any] = {"id": k, "v": v, "label": label}
        if schema_id == 2:
            record["note"] = rng.choice([None, "n"])
        source.send_raw(message_key, framed(schema_id, record), (k,), {"id": k, "v": v, "label": label})


def test_upsert_avro_topic_equals_the_fold_with_bad_records(settings: Settings, redis_client: redis.Redis,
                                                            tmp_path: Path) -> None:
    source = AvroTopic(settings, f"{settings.topic_prefix}.avro-orders")
    created = mvlog(settings, "create-table", "aorders", "-c", "id:int", "-c", "v:int", "-c", "label:string",
                    "-k", "id", "--from-topic", source.name, "--format", "upsert-avro", *avsc_options(tmp_path, 1, 9))
    assert created.exit_code == 0, created.output
    rng = random.Random(1801)
    upsert_avro_workload(source, rng, 1500, bad_share=0.05)
    source.flush()
    with SourceIngester(settings, "aorders", redis_client) as ingester:
        first = ingester.run(until_caught_up=True)
    assert first.messages == 1500 and first.dead_letters == len(source.bad) > 20
    assert table_rows(redis_client, settings, "aorders", ("id",)) == source.fold()
    upsert_avro_workload(source, rng, 500, bad_share=0.05)  # resumes from the committed offsets
    source.flush()
    with SourceIngester(settings, "aorders", redis_client) as ingester:
        second = ingester.run(until_caught_up=True)
    assert second.messages == 500
    assert table_rows(redis_client, settings, "aorders", ("id",)) == source.fold()
    assert committed_offsets(settings, "aorders", source.name, 3) == end_offsets(settings, source.name, 3)
    assert check_every_epoch(settings, "aorders", ("id",), source) == first.epochs + second.epochs
    assert check_dead_letters(settings, "aorders", source) == len(source.bad)


def test_debezium_avro_columns_from_the_schema_equals_the_fold(settings: Settings, redis_client: redis.Redis,
                                                               tmp_path: Path) -> None:
    """create-table without -c takes the columns from the envelope's ``after`` record; snapshot reads,
    inserts, updates, key updates and deletes (each followed by its tombstone), redeliveries skipped."""
    source = AvroTopic(settings, f"{settings.topic_prefix}.db1.public.items")
    created = mvlog(settings, "create-table", "aitems", "-k", "id", "--from-topic", source.name,
                    "--format", "debezium-avro", *avsc_options(tmp_path, 21))
    assert created.exit_code == 0, created.output
    assert "(id int primary key, price float, ok boolean, data bytes, at int, columns from the Avro" in created.stdout
    rng = random.Random(1802)
    present: dict[int, dict[str, Any]] = {}
    lsn = 5000
    sent: list[tuple[bytes, bytes, Key, Effect]] = []
    for i in range(1200):
        k = rng.randrange(30)
        lsn += 8
        src = {"connector": "postgresql", "lsn": lsn, "snapshot": "true" if i < 10 else "false"}
        before = present.get(k)
        key = framed(9, {"id": k})
        effect: Effect
        if before is not None and rng.random() < 0.3:
            event = {"op": "d", "before": {"id": k}, "after": None, "source": src}
            effect = None
            del present[k]
        else:
            cents = rng.randrange(100000)
            at = 1732540000000 + rng.randrange(10**9)
            after = {"id": k, "price": None if cents % 7 == 0 else _decimal(cents),
                     "ok": rng.random() < 0.5, "data": bytes(rng.randrange(256) for _ in range(3)),
                     "at": _millis(at)}
            op = "r" if i < 10 else "c" if before is None else "u"
            event = {"op": op, "before": before, "after": after, "source": src}
            present[k] = after
            effect = {**after, "price": None if after["price"] is None else cents / 100, "at": at}
        value = framed(21, event)
        source.send_raw(key, value, (k,), effect)
        sent.append((key, value, (k,), effect))
        if effect is None:
            source.send_raw(key, None, (k,), None)  # the tombstone: no change
    source.flush()
    with SourceIngester(settings, "aitems", redis_client) as ingester:
        ingester.run(until_caught_up=True)
    streamed = [(key, value) for key, value, _, _ in sent[-60:]]  # (all streamed: snapshot reads came first)
    for key, value in streamed:  # Debezium redelivers after a worker restart: applied once (nothing)
        source.send_raw(key, value, None, None)
    source.flush()
    with SourceIngester(settings, "aitems", redis_client) as ingester:
        again = ingester.run(until_caught_up=True)
    assert again.redelivered == len(streamed) > 0
    assert table_rows(redis_client, settings, "aitems", ("id",)) == source.fold()
    assert check_every_epoch(settings, "aitems", ("id",), source) >= 2


def _decimal(cents: int) -> Any:
    import decimal

    return decimal.Decimal(cents).scaleb(-2)


def _millis(at: int) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(at / 1000, tz=datetime.UTC)


def test_schema_evolution_added_field_accepted_changed_type_stops(settings: Settings, redis_client: redis.Redis,
                                                                  tmp_path: Path) -> None:
    """Schema 2 adds a nullable field mid-stream: ingested. Schema 3 changes ``v`` to string: the source
    stops at that message (exit 1, the message names topic, partition, offset, schema id and field; kept
    for ``mvlog status``), the messages before it are committed and none after it, also on a second run;
    ``--accept-schema 3`` then goes on, dead-lettering what it cannot type."""
    source = AvroTopic(settings, f"{settings.topic_prefix}.evolving", partitions=1)
    created = mvlog(settings, "create-table", "evo", "-c", "id:int", "-c", "v:int", "-c", "label:string", "-k", "id",
                    "--from-topic", source.name, "--format", "upsert-avro", *avsc_options(tmp_path, 1, 2, 3, 9))
    assert created.exit_code == 0, created.output
    rng = random.Random(1803)
    upsert_avro_workload(source, rng, 200, schema_id=1)
    upsert_avro_workload(source, rng, 200, schema_id=2)  # an added nullable field: accepted
    source.flush()
    stop_at = end_offsets(settings, source.name, 1)[0]
    source.send_bad(b"5", framed(3, {"id": 5, "v": "five", "label": None}), "expected int, got str 'five'")
    upsert_avro_workload(source, rng, 100, schema_id=1)  # after the stop: not ingested until accepted
    source.flush()
    for _ in range(2):
        run = mvlog(settings, "run-source", "evo", "--until-caught-up")
        assert run.exit_code == 1, run.output
        assert f"source stopped at {source.name}[0]@{stop_at}" in run.stderr, run.stderr
        assert "writer schema id 3, field 'v'" in run.stderr and "does not map to the column's type int" in \
            run.stderr, run.stderr
        assert "--accept-schema 3" in run.stderr
        assert committed_offsets(settings, "evo", source.name, 1) == {0: stop_at}
        assert table_rows(redis_client, settings, "evo", ("id",)) == source.fold({0: stop_at})
    status = json.loads(mvlog(settings, "status", "-o", "json").stdout)
    (evo,) = [v for v in status["views"] if v["name"] == "evo"]
    assert any("writer schema id 3" in p for p in evo["source"]["problems"]), evo["source"]
    accepted = mvlog(settings, "run-source", "evo", "--until-caught-up", "--accept-schema", "3")
    assert accepted.exit_code == 0, accepted.output
    assert table_rows(redis_client, settings, "evo", ("id",)) == source.fold()
    assert check_dead_letters(settings, "evo", source) == 1
    check_every_epoch(settings, "evo", ("id",), source)


def test_sigkilled_run_source_on_an_avro_topic(settings: Settings, redis_client: redis.Redis, tmp_path: Path,
                                               report: Callable[[str], None]) -> None:
    """7 SIGKILLs of ``mvlog run-source`` on an upsert-avro topic while a producer writes (3 % bad
    records): nothing lost, nothing doubled, each bad record dead-lettered once."""
    rng = random.Random(int(os.environ.get("MVLOG_TEST_SEED", "1804")))
    source = AvroTopic(settings, f"{settings.topic_prefix}.avro-killed")
    ok = mvlog(settings, "create-table", "akilled", "-c", "id:int", "-c", "v:int", "-c", "label:string",
               "-k", "id", "--from-topic", source.name, "--format", "upsert-avro", *avsc_options(tmp_path, 1, 9))
    assert ok.exit_code == 0, ok.output
    stop = threading.Event()

    def produce() -> None:
        writer_rng = random.Random(rng.random())
        while not stop.is_set():
            upsert_avro_workload(source, writer_rng, 50, bad_share=0.03)  # about 1000 messages/s
            time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | env_of(settings)
    kills = 0
    try:
        while kills < 7:
            child = subprocess.Popen([*MVLOG, "run-source", "akilled"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
            if kills % 3 == 2:  # somewhere in its start-up
                time.sleep(rng.uniform(0.2, 2.5))
            else:  # while it ingests
                assert child.stderr is not None
                lines: list[str] = []
                while "ingesting topic" not in (line := child.stderr.readline()):
                    lines.append(line)
                    assert line, f"run-source ended (kill {kills}): {''.join(lines)}{child.communicate()[1]}"
                time.sleep(rng.uniform(0.05, 2.0))
            assert child.poll() is None, child.communicate()[1]
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            kills += 1
    finally:
        stop.set()
        producer.join(30)
    source.flush()
    final = subprocess.run([*MVLOG, "run-source", "akilled", "--until-caught-up"], env=env, capture_output=True,
                           text=True, timeout=180)
    assert final.returncode == 0, final.stderr
    expected = source.fold()
    assert table_rows(redis_client, settings, "akilled", ("id",)) == expected
    assert committed_offsets(settings, "akilled", source.name, 3) == end_offsets(settings, source.name, 3)
    epochs = check_every_epoch(settings, "akilled", ("id",), source)
    assert epochs > kills  # most runs committed epochs before their kill
    dead = check_dead_letters(settings, "akilled", source)
    counted = SourceStatusStore(redis_client, settings.topic_prefix).read(
        settings, [CatalogStore(settings, redis_client).get("akilled")])["akilled"].dead_letters
    assert counted == dead == len(source.bad) > 0
    report(f"{kills} SIGKILLs of run-source on an upsert-avro topic, {len(source.effects)} messages, {epochs} epochs "
           f"checked, {len(expected)} rows, {dead} bad records dead-lettered once each: exact")
