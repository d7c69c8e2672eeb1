"""Source table decoders (issue 18): upsert-json, append-json and debezium-json messages to row changes,
typed by the table's schema, and bad records named by topic, partition, offset and field."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mvlog.row_schema import RowSchema
from mvlog.source_formats import decode_append_json, decode_debezium_json, decode_upsert_json, decoder_for
from mvlog.source_records import BadRecordError, RowChange, SourceMessage
from mvlog.source_spec import SourceFormat, SourceSpec, SourceSpecError

SCHEMA = RowSchema.of({"id": "int", "name": "string", "price": "float", "active": "boolean", "blob": "bytes"},
                      ["id"])


def msg(key: Any = None, value: Any = None, *, raw_key: bytes | None = None, raw_value: bytes | None = None,
        partition: int = 1, offset: int = 42) -> SourceMessage:
    kb = raw_key if raw_key is not None else None if key is None else json.dumps(key).encode()
    vb = raw_value if raw_value is not None else None if value is None else json.dumps(value).encode()
    return SourceMessage("orders", partition, offset, kb, vb)


def full(id_: int, name: str = "a", price: float = 1.5, active: bool = True, blob: bytes | None = None) -> dict:
    return {"id": id_, "name": name, "price": price, "active": active, "blob": blob}


# ------------------------------------------------------------------------------------------- upsert-json


def test_upsert_json_object_key_and_bare_key() -> None:
    value = {"id": 7, "name": "x", "price": 2, "active": False, "blob": base64.b64encode(b"\x00\x01").decode()}
    expected = [RowChange((7,), {"id": 7, "name": "x", "price": 2.0, "active": False, "blob": b"\x00\x01"})]
    assert decode_upsert_json(SCHEMA, msg({"id": 7}, value)) == expected
    assert decode_upsert_json(SCHEMA, msg(7, value)) == expected


def test_upsert_json_key_fills_the_value_and_extra_fields_are_ignored() -> None:
    [change] = decode_upsert_json(SCHEMA, msg(3, {"name": "n", "unrelated": [1, 2]}))
    assert change == RowChange((3,), {"id": 3, "name": "n", "price": None, "active": None, "blob": None})


def test_upsert_json_tombstone_deletes() -> None:
    assert decode_upsert_json(SCHEMA, msg({"id": 9})) == [RowChange((9,), None)]


def test_upsert_json_composite_key() -> None:
    schema = RowSchema.of({"a": "int", "b": "string", "v": "int"}, ["a", "b"])
    assert decode_upsert_json(schema, msg({"b": "x", "a": 1}, {"v": 5})) == [RowChange((1, "x"), {"a": 1, "b": "x",
                                                                                                  "v": 5})]
    with pytest.raises(BadRecordError, match="must be a JSON object with a, b"):
        decode_upsert_json(schema, msg(1, {"v": 5}))


@pytest.mark.parametrize(("message", "pattern"), [
    (msg(None, {"id": 1}), r"orders\[1\]@42: the message has no key"),
    (msg(raw_key=b"{oops", value={"id": 1}), r"orders\[1\]@42: the key is not valid JSON"),
    (msg(1, {"id": 2}), r"field 'id': the value's 2 differs from the message key's 1"),
    (msg(1, {"price": "cheap"}), r"field 'price': expected a number, got str 'cheap'"),
    (msg(1, {"active": 1}), r"field 'active': expected boolean, got int 1"),
    (msg(1, {"blob": "***"}), r"field 'blob': bytes column: expected base64 text"),
    (msg("one", {"name": "x"}), r"field 'id': expected int, got str 'one' \(in the key\)"),
    (msg(1, [1, 2]), r"the value is not a JSON object"),
])
def test_upsert_json_bad_records_are_named(message: SourceMessage, pattern: str) -> None:
    with pytest.raises(BadRecordError, match=pattern):
        decode_upsert_json(SCHEMA, message)


# ------------------------------------------------------------------------------------------- append-json


def test_append_json_generated_key_from_partition_and_offset() -> None:
    schema = RowSchema.of({"event_id": "string", "user": "string", "amount": "int"}, ["event_id"])
    decode = decoder_for(SourceSpec("clicks", SourceFormat.APPEND_JSON, "event_id"), schema)
    first = decode(msg(None, {"user": "u", "amount": 3}, partition=2, offset=10))
    again = decode(msg(None, {"user": "u", "amount": 3}, partition=2, offset=11))
    assert first == [RowChange(("2-10",), {"event_id": "2-10", "user": "u", "amount": 3})]
    assert again[0].key == ("2-11",)  # the same content twice is two rows


def test_append_json_key_from_value_columns() -> None:
    assert decode_append_json(SCHEMA, msg("ignored", {"id": 5, "name": "e"}), None) == [
        RowChange((5,), {"id": 5, "name": "e", "price": None, "active": None, "blob": None})]
    with pytest.raises(BadRecordError, match="field 'id': primary key column is missing or null in the value"):
        decode_append_json(SCHEMA, msg(None, {"name": "e"}), None)
    with pytest.raises(BadRecordError, match="the value is null"):
        decode_append_json(SCHEMA, msg(1, None), None)


# ----------------------------------------------------------------------------------------- debezium-json
# Samples in the shape Debezium's PostgreSQL connector writes (JSON converter, schemas.enable both ways).

SOURCE = {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1732540000000,
          "snapshot": "false", "db": "shop", "sequence": "[\"24023128\",\"24023184\"]", "schema": "public",
          "table": "products", "txId": 556, "lsn": 24023184, "xmin": None}


def envelope(op: str, before: dict | None, after: dict | None, *, lsn: int = 24023184,
             schemas: bool = False) -> dict:
    payload = {"before": before, "after": after, "source": {**SOURCE, "lsn": lsn}, "op": op,
               "ts_ms": 1732540000123, "transaction": None}
    if not schemas:
        return payload
    row_schema = {"type": "struct", "optional": True, "name": "dbserver1.public.products.Value", "fields": [
        {"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "name"},
        {"type": "double", "optional": True, "field": "price"},
        {"type": "boolean", "optional": True, "field": "active"},
        {"type": "bytes", "optional": True, "field": "blob"}]}
    schema = {"type": "struct", "name": "dbserver1.public.products.Envelope", "optional": False, "fields": [
        {**row_schema, "field": "before"}, {**row_schema, "field": "after"},
        {"type": "struct", "name": "io.debezium.connector.postgresql.Source", "optional": False, "field": "source",
         "fields": []},
        {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
    return {"schema": schema, "payload": payload}


def key_of(id_: int, schemas: bool) -> Any:
    if not schemas:
        return {"id": id_}
    return {"schema": {"type": "struct", "name": "dbserver1.public.products.Key", "optional": False,
                       "fields": [{"type": "int64", "optional": False, "field": "id"}]}, "payload": {"id": id_}}


@pytest.mark.parametrize("schemas", [False, True], ids=["plain", "with-schemas"])
def test_debezium_each_op(schemas: bool) -> None:
    row = full(1, "widget", 9.5, True, None)
    read = decode_debezium_json(SCHEMA, msg(key_of(1, schemas), envelope("r", None, row, lsn=1, schemas=schemas)))
    create = decode_debezium_json(SCHEMA, msg(key_of(1, schemas), envelope("c", None, row, lsn=2, schemas=schemas)))
    assert read == [RowChange((1,), row, read[0].position)]
    assert read[0].position is None  # snapshot reads carry no per-row order (see source_dedupe)
    assert create[0].row == row and create[0].position == 2
    updated = {**row, "price": 11.0}
    update = decode_debezium_json(SCHEMA, msg(key_of(1, schemas), envelope("u", row, updated, schemas=schemas)))
    assert [(c.key, c.row) for c in update] == [((1,), updated)]
    # Default REPLICA IDENTITY: before holds the key columns only.
    only_key = {"id": 1, "name": None, "price": None, "active": None, "blob": None}
    delete = decode_debezium_json(SCHEMA, msg(key_of(1, schemas), envelope("d", only_key, None, schemas=schemas)))
    assert [(c.key, c.row) for c in delete] == [((1,), None)]
    assert decode_debezium_json(SCHEMA, msg(key_of(1, schemas), None)) == []  # the tombstone after the delete


def test_debezium_update_of_the_primary_key_deletes_the_old_key() -> None:
    changes = decode_debezium_json(SCHEMA, msg({"id": 2}, envelope("u", full(1), full(2))))
    assert [(c.key, c.row is None) for c in changes] == [((1,), True), ((2,), False)]


def test_debezium_delete_without_before_uses_the_message_key() -> None:
    assert [c.key for c in decode_debezium_json(SCHEMA, msg(key_of(4, True), envelope("d", None, None)))] == [(4,)]


def test_debezium_redelivery_has_the_same_position() -> None:
    message = msg({"id": 1}, envelope("c", None, full(1), lsn=77))
    assert decode_debezium_json(SCHEMA, message)[0].position == decode_debezium_json(SCHEMA, message)[0].position


def test_debezium_bytes_are_base64() -> None:
    row = {**full(1), "blob": base64.b64encode(b"\xff\x00").decode()}
    assert decode_debezium_json(SCHEMA, msg({"id": 1}, envelope("c", None, row)))[0].row == {**full(1),
                                                                                              "blob": b"\xff\x00"}


@pytest.mark.parametrize(("value", "pattern"), [
    (envelope("t", None, None), r"field 'op': a truncate"),
    (envelope("x", None, full(1)), r"field 'op': unknown Debezium op 'x'"),
    (envelope("c", None, None), r"field 'after': op 'c' without an 'after' row"),
    (envelope("c", None, {**full(1), "price": "n/a"}), r"orders\[1\]@42: field 'price': expected a number"),
    (envelope("c", None, {**full(1), "id": None}), r"field 'id': primary key column is missing or null in the after"),
    ([1], r"not a Debezium change event"),
])
def test_debezium_bad_records_are_named(value: Any, pattern: str) -> None:
    with pytest.raises(BadRecordError, match=pattern):
        decode_debezium_json(SCHEMA, msg({"id": 1}, value))


# ------------------------------------------------------------------------------------------- declaration


def test_spec_round_trips_through_catalog_options() -> None:
    spec = SourceSpec("clicks", SourceFormat.APPEND_JSON, "event_id")
    assert SourceSpec.from_options(spec.to_options()) == spec
    assert SourceSpec.from_options({}) is None


def test_spec_refuses_unknown_formats_and_bad_generated_keys() -> None:
    with pytest.raises(ValueError, match="unknown source format 'avro'; use one of upsert-json, append-json"):
        SourceFormat.parse("avro")
    with pytest.raises(SourceSpecError, match="for append-json sources, not upsert-json"):
        SourceSpec("t", SourceFormat.UPSERT_JSON, "id").check(SCHEMA)
    with pytest.raises(SourceSpecError, match="must be a string column"):
        SourceSpec("t", SourceFormat.APPEND_JSON, "id").check(SCHEMA)
    with pytest.raises(SourceSpecError, match="'nope' is not a column"):
        SourceSpec("t", SourceFormat.APPEND_JSON, "nope").check(SCHEMA)
