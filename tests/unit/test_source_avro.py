"""Avro source formats (issue 18): Confluent framing, Avro types as column types, the evolution check,
and bad records, on messages encoded by fastavro's own writer (the encoder Confluent's AvroSerializer uses)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from mvlog.row_schema import ColumnType, RowSchema
from mvlog.source_avro import SchemaChangeError, check_writer_schema, derive_columns, row_fields, split_confluent
from mvlog.source_formats import decoder_for
from mvlog.source_records import BadRecordError, RowChange, SourceMessage
from mvlog.source_spec import SourceFormat, SourceSpec, SourceSpecError

SCHEMA = RowSchema.of({"id": "int", "name": "string", "price": "float", "ts": "int"}, ["id"])

ROW_V1: dict[str, Any] = {"type": "record", "name": "Item", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None}]}
ROW_V2 = {**ROW_V1, "fields": [*ROW_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
ROW_BAD_TYPE = {**ROW_V1, "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "int"},
                                     *ROW_V1["fields"][2:]]}
ROW_REMOVED = {**ROW_V1, "fields": [f for f in ROW_V1["fields"] if f["name"] != "price"]}
KEY = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}


def envelope(row: dict[str, Any]) -> dict[str, Any]:
    """Debezium's AvroConverter envelope: before/after of the row record (after by name), op, source."""
    return {"type": "record", "name": "Envelope", "namespace": "shop.public.items", "fields": [
        {"name": "before", "type": ["null", {**row, "name": "Value", "namespace": "shop.public.items"}],
         "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
            {"name": "connector", "type": "string"}, {"name": "lsn", "type": ["null", "long"], "default": None}]}},
        {"name": "op", "type": "string"}]}


SCHEMAS: dict[int, dict[str, Any]] = {1: ROW_V1, 2: ROW_V2, 3: ROW_BAD_TYPE, 4: ROW_REMOVED, 9: KEY,
           11: envelope(ROW_V1), 12: envelope(ROW_V2), 13: envelope(ROW_BAD_TYPE)}


PG = {"connector": "postgresql", "lsn": 1}


def resolve(schema_id: int) -> str | None:
    found = SCHEMAS.get(schema_id)
    return None if found is None else json.dumps(found)


def framed(schema_id: int, record: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    schemaless_writer(out, parse_schema(SCHEMAS[schema_id]), record)
    return out.getvalue()


def msg(key: bytes | None, value: bytes | None, offset: int = 42) -> SourceMessage:
    return SourceMessage("items", 0, offset, key, value)


def decoder(fmt: SourceFormat, accepted: frozenset[int] = frozenset()) -> Any:
    return decoder_for(SourceSpec("items", fmt), SCHEMA, resolve, accepted)


TS = datetime.datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=datetime.UTC)
TS_MS = (TS - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(milliseconds=1)


def item(id_: int, name: str | None = "a", price: str = "1.25", **extra: Any) -> dict[str, Any]:
    return {"id": id_, "name": name, "price": decimal.Decimal(price), "ts": TS, **extra}


def test_upsert_avro_key_forms_logical_types_and_tombstone() -> None:
    decode = decoder(SourceFormat.UPSERT_AVRO)
    expected = [RowChange((7,), {"id": 7, "name": "a", "price": 1.25, "ts": TS_MS})]
    assert decode(msg(framed(9, {"id": 7}), framed(1, item(7)))) == expected  # Avro key
    assert decode(msg(b'{"id": 7}', framed(1, item(7)))) == expected  # JSON key
    assert decode(msg(b"7", framed(1, item(7)))) == expected  # bare key
    assert decode(msg(framed(9, {"id": 7}), None)) == [RowChange((7,), None)]


def test_append_avro_generated_key_and_value_key() -> None:
    schema = RowSchema.of({"k": "string", "id": "int", "name": "string"}, ["k"])
    decode = decoder_for(SourceSpec("items", SourceFormat.APPEND_AVRO, "k"), schema, resolve)
    assert decode(msg(None, framed(1, item(3)), offset=5)) == [RowChange(("0-5",), {"k": "0-5", "id": 3, "name": "a"})]
    with pytest.raises(BadRecordError, match="value is null"):
        decode(msg(None, None))


def test_debezium_avro_ops_and_named_after_record() -> None:
    decode = decoder(SourceFormat.DEBEZIUM_AVRO)

    def event(op: str, before: Any, after: Any, lsn: int = 100) -> bytes:
        source = {"connector": "postgresql", "lsn": lsn}
        return framed(11, {"before": before, "after": after, "source": source, "op": op})

    row = {"id": 1, "name": "a", "price": 1.25, "ts": TS_MS}
    assert decode(msg(None, event("c", None, item(1)))) == [RowChange((1,), row, 100)]
    assert decode(msg(None, event("r", None, item(1)))) == [RowChange((1,), row, None)]
    assert decode(msg(None, event("u", item(2), item(1)))) == [RowChange((2,), None, 100), RowChange((1,), row, 100)]
    assert decode(msg(None, event("d", item(1), None))) == [RowChange((1,), None, 100)]
    assert decode(msg(framed(9, {"id": 1}), None)) == []  # the tombstone after a delete
    with pytest.raises(BadRecordError, match="truncate"):
        decode(msg(None, event("t", None, None)))


def test_evolution_added_nullable_field_accepted_type_change_and_removal_stop() -> None:
    decode = decoder(SourceFormat.UPSERT_AVRO)
    assert decode(msg(b"1", framed(2, item(1, note="n"))))[0].row == {"id": 1, "name": "a", "price": 1.25, "ts": TS_MS}
    with pytest.raises(SchemaChangeError) as stopped:
        decode(msg(b"1", framed(3, {**item(1), "name": 5}), offset=77))
    assert (stopped.value.schema_id, stopped.value.field, stopped.value.where) == (3, "name", "items[0]@77")
    assert "does not map to the column's type string" in str(stopped.value)
    with pytest.raises(SchemaChangeError, match="'price': the table's column is no longer a field"):
        decode(msg(b"1", framed(4, {k: v for k, v in item(1).items() if k != "price"})))
    debezium = decoder(SourceFormat.DEBEZIUM_AVRO)
    assert debezium(msg(None, framed(12, {"before": None, "after": item(1, note="x"), "source": PG,
                                          "op": "c"})))
    with pytest.raises(SchemaChangeError, match="writer schema id 13, field 'name'"):
        debezium(msg(None, framed(13, {"before": None, "after": {**item(1), "name": 3}, "source": PG,
                                       "op": "c"})))


def test_accepted_schema_skips_the_check_and_dead_letters_what_it_cannot_type() -> None:
    decode = decoder(SourceFormat.UPSERT_AVRO, frozenset({3, 4}))
    assert decode(msg(b"1", framed(4, {k: v for k, v in item(1).items() if k != "price"})))[0].row == \
        {"id": 1, "name": "a", "price": None, "ts": TS_MS}
    with pytest.raises(BadRecordError, match="expected string"):
        decode(msg(b"1", framed(3, {**item(1), "name": 5})))


@pytest.mark.parametrize(("value", "problem"), [
    (b"\x01\x00\x00\x00\x01abc", "not the Confluent magic byte 0"),
    (b"\x00\x00", "too short"),
    (b"\x00\x00\x00\x00\x63\x02", "unknown Avro schema id 99"),
    (b"\x00\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "does not decode with Avro schema id 1"),
    (b'{"id": 1}', "magic byte"),
])
def test_bad_records(value: bytes, problem: str) -> None:
    with pytest.raises(BadRecordError, match=problem):
        decoder(SourceFormat.UPSERT_AVRO)(msg(b"1", value))


def test_missing_key_and_key_value_mismatch() -> None:
    decode = decoder(SourceFormat.UPSERT_AVRO)
    with pytest.raises(BadRecordError, match="no key"):
        decode(msg(None, framed(1, item(1))))
    with pytest.raises(BadRecordError, match="differs from the message key"):
        decode(msg(b"2", framed(1, item(1))))


def test_derive_columns_and_mapping() -> None:
    assert derive_columns(json.dumps(ROW_V2), envelope=False) == {
        "id": ColumnType.INT, "name": ColumnType.STRING, "price": ColumnType.FLOAT, "ts": ColumnType.INT,
        "note": ColumnType.STRING}
    assert derive_columns(json.dumps(envelope(ROW_V1)), envelope=True) == {
        "id": ColumnType.INT, "name": ColumnType.STRING, "price": ColumnType.FLOAT, "ts": ColumnType.INT}
    mixed = {"type": "record", "name": "M", "fields": [
        {"name": "b", "type": "boolean"}, {"name": "raw", "type": {"type": "fixed", "name": "F", "size": 2}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "list", "type": {"type": "array", "items": "int"}}, {"name": "x", "type": "double"}]}
    assert derive_columns(json.dumps(mixed), envelope=False) == {
        "b": ColumnType.BOOLEAN, "raw": ColumnType.BYTES, "e": ColumnType.STRING, "d": ColumnType.INT,
        "u": ColumnType.STRING, "x": ColumnType.FLOAT}
    assert check_writer_schema(SCHEMA, row_fields(ROW_V1, False)) is None


def test_split_confluent_and_spec_options_round_trip() -> None:
    assert split_confluent(b"\x00\x00\x00\x01\x00xy", msg(None, None), "value") == (256, b"xy")
    spec = SourceSpec("items", SourceFormat.UPSERT_AVRO, None, "http://127.0.0.1:1", {1: json.dumps(ROW_V1)})
    assert SourceSpec.from_options(spec.to_options()) == spec
    with pytest.raises(SourceSpecError, match="Avro formats"):
        SourceSpec("items", SourceFormat.UPSERT_JSON, None, "http://127.0.0.1:1").check(SCHEMA)
