"""Avro source topics: the Confluent wire format, Avro types as mvlog column types, and schema evolution.

Pure rules (no Kafka, no HTTP): :class:`AvroDecoder` turns a message of an ``upsert-avro``,
``append-avro`` or ``debezium-avro`` topic into the table's changes, with the writer schema of each
message found by its id through a resolver the caller gives (``.avsc`` files kept in the table's catalog
entry, or a Schema Registry: :mod:`mvlog.connectors.kafka.schema_registry`). Every value is framed as Confluent
does: byte 0, the schema id as 4 big-endian bytes, then the Avro binary encoding (``schemaless``).

**Schema evolution is judged against the table's columns** (:func:`check_writer_schema`), once per
schema id: each column must be a field of the writer's row record whose Avro type maps to the column's
type (:func:`column_type_of`); fields the table does not have are ignored, so added fields (nullable, with
a default, or not) are accepted. A column the writer no longer has, or a field whose type no longer maps
to its column, raises :class:`SchemaChangeError`: the ingester stops the source there (nothing after it is
ingested) instead of dead-lettering every later message. Undecodable bytes, a wrong magic byte and an
unknown schema id are bad records (:class:`~mvlog.source_records.BadRecordError`): dead-lettered.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastavro import parse_schema, schemaless_reader

from mvlog.row_schema import Column, ColumnType, Key, Row, RowSchema
from mvlog.source_dedupe import debezium_position
from mvlog.source_records import BadRecordError, RowChange, SourceMessage, typed_key, typed_value

MAGIC = 0
_HEADER = 5  # magic byte + 4-byte schema id

#: Resolves a schema id to the writer schema's JSON text, None when the id is unknown.
SchemaResolver = Callable[[int], str | None]

_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_NAIVE = datetime.datetime(1970, 1, 1)
_EPOCH_DATE = datetime.date(1970, 1, 1)
_MILLI = datetime.timedelta(milliseconds=1)

# Avro type (or logical type) -> mvlog column type (the README's mapping table).
_PRIMITIVES = {"int": ColumnType.INT, "long": ColumnType.INT, "float": ColumnType.FLOAT,
               "double": ColumnType.FLOAT, "string": ColumnType.STRING, "boolean": ColumnType.BOOLEAN,
               "bytes": ColumnType.BYTES, "fixed": ColumnType.BYTES, "enum": ColumnType.STRING}
_LOGICAL = {"timestamp-millis": ColumnType.INT, "timestamp-micros": ColumnType.INT,
            "local-timestamp-millis": ColumnType.INT, "local-timestamp-micros": ColumnType.INT,
            "date": ColumnType.INT, "time-millis": ColumnType.INT, "time-micros": ColumnType.INT,
            "decimal": ColumnType.FLOAT, "uuid": ColumnType.STRING}
# A column takes these Avro-mapped types (an int column refuses a float field; a float column takes ints).
_ACCEPTS = {ColumnType.INT: {ColumnType.INT}, ColumnType.FLOAT: {ColumnType.FLOAT, ColumnType.INT},
            ColumnType.STRING: {ColumnType.STRING}, ColumnType.BOOLEAN: {ColumnType.BOOLEAN},
            ColumnType.BYTES: {ColumnType.BYTES}}


class SchemaChangeError(ValueError):
    """A writer schema the table cannot take (a column gone, a type changed): stops the source."""

    def __init__(self, message: SourceMessage, schema_id: int, field: str, problem: str) -> None:
        self.where = message.where
        self.schema_id = schema_id
        self.field = field
        self.problem = problem
        super().__init__(f"schema change at {message.where}: writer schema id {schema_id}, field {field!r}: {problem}")


def split_confluent(data: bytes, message: SourceMessage, what: str) -> tuple[int, bytes]:
    """The schema id and the Avro bytes of a Confluent-framed key or value."""
    if len(data) < _HEADER:
        raise BadRecordError(message, None, f"the {what} is {len(data)} byte(s): too short for the Confluent "
                                            "wire format (magic byte 0 + 4-byte schema id + Avro)")
    if data[0] != MAGIC:
        raise BadRecordError(message, None, f"the {what} starts with byte {data[0]}, not the Confluent magic "
                                            "byte 0 (not Confluent-framed Avro)")
    return int.from_bytes(data[1:_HEADER], "big"), data[_HEADER:]


def _strip_null(avro_type: Any) -> tuple[Any, bool]:
    """The type inside a union with null, and whether null is allowed."""
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        nullable = len(rest) < len(avro_type)
        return (rest[0] if len(rest) == 1 else rest), nullable
    return avro_type, avro_type == "null"


def column_type_of(avro_type: Any) -> tuple[ColumnType, bool] | None:
    """The mvlog column type of an Avro field type and whether it is nullable; None when it has none
    (records, arrays, maps, unions of several non-null types)."""
    inner, nullable = _strip_null(avro_type)
    if isinstance(inner, Mapping):
        logical = inner.get("logicalType")
        if isinstance(logical, str) and logical in _LOGICAL:
            return _LOGICAL[logical], nullable
        inner = inner.get("type")  # {"type": "string", ...}, {"type": "enum", ...}, or a nested type
        if isinstance(inner, list | Mapping):
            found = column_type_of(inner)
            return _nullable(found) if nullable else found
    if isinstance(inner, str) and inner in _PRIMITIVES:
        return _PRIMITIVES[inner], nullable
    return None


def _nullable(found: tuple[ColumnType, bool] | None) -> tuple[ColumnType, bool] | None:
    return None if found is None else (found[0], True)


def row_fields(schema: Any, envelope: bool) -> dict[str, Mapping[str, Any]]:
    """The fields of the row record of a value schema by name: the record itself, or for Debezium's
    envelope (``envelope``) the record of its ``after`` field. ValueError when there is none."""
    record = schema
    if envelope:
        if not isinstance(schema, Mapping) or schema.get("type") != "record":
            raise ValueError("a Debezium value schema is a record (the envelope)")
        after = next((f for f in schema.get("fields", []) if f.get("name") == "after"), None)
        if after is None:
            raise ValueError("the Debezium envelope schema has no 'after' field")
        record, _ = _strip_null(after["type"])
        if isinstance(record, str):  # a reference to a record named before (Debezium's "Value")
            record = _named(schema).get(record.rsplit(".", 1)[-1], record)
    if not isinstance(record, Mapping) or record.get("type") != "record":
        raise ValueError(f"the row schema is not an Avro record but {json.dumps(record)[:80]}")
    return {f["name"]: f for f in record.get("fields", [])}


def _named(schema: Any, found: dict[str, Any] | None = None) -> dict[str, Any]:
    """The records defined anywhere in ``schema`` by their short name."""
    found = {} if found is None else found
    if isinstance(schema, list):
        for item in schema:
            _named(item, found)
    elif isinstance(schema, Mapping):
        if schema.get("type") == "record" and isinstance(schema.get("name"), str):
            found.setdefault(schema["name"].rsplit(".", 1)[-1], schema)
        for avro_field in schema.get("fields", []) if schema.get("type") == "record" else []:
            _named(avro_field.get("type"), found)
        for part in ("items", "values"):
            if part in schema:
                _named(schema[part], found)
        if isinstance(schema.get("type"), list | Mapping):
            _named(schema["type"], found)
    return found


def derive_columns(schema_text: str, envelope: bool) -> dict[str, ColumnType]:
    """The table's columns from an Avro value schema (create-table without ``-c``): every field of the
    row record whose type maps to a column type, in schema order; others are left out."""
    columns: dict[str, ColumnType] = {}
    for name, avro_field in row_fields(json.loads(schema_text), envelope).items():
        found = column_type_of(avro_field["type"])
        if found is not None:
            columns[name] = found[0]
    if not columns:
        raise ValueError("the Avro schema has no field of a type mvlog columns hold")
    return columns


def check_writer_schema(schema: RowSchema, fields: Mapping[str, Mapping[str, Any]],
                        generated: str | None = None) -> tuple[str, str] | None:
    """(field, problem) when a writer schema's row ``fields`` cannot feed ``schema``'s columns (but the
    ``generated`` key column, which no message carries), else None."""
    for column in schema.columns:
        if column.name == generated:
            continue
        avro_field = fields.get(column.name)
        if avro_field is None:
            return column.name, "the table's column is no longer a field of the writer schema (a removed field)"
        found = column_type_of(avro_field["type"])
        if found is None or found[0] not in _ACCEPTS[column.type]:
            shown = json.dumps(avro_field["type"])[:80]
            return column.name, f"the writer's type {shown} does not map to the column's type {column.type.value}"
    return None


def avro_value(column: Column, value: Any) -> Any:
    """A value fastavro decoded as a value of ``column``: timestamps as epoch milliseconds, dates as days
    since the epoch, times as milliseconds of the day, decimals as floats, UUIDs as text."""
    if isinstance(value, datetime.datetime):
        epoch = _EPOCH_UTC if value.tzinfo is not None else _EPOCH_NAIVE
        value = (value - epoch) // _MILLI
    elif isinstance(value, datetime.date):
        value = (value - _EPOCH_DATE).days
    elif isinstance(value, datetime.time):
        value = ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + value.microsecond // 1000
    elif isinstance(value, decimal.Decimal):
        value = float(value)
    elif isinstance(value, uuid.UUID):
        value = str(value)
    if column.type is ColumnType.BYTES and isinstance(value, bytes):
        return value
    return typed_value(column, value)


def avro_row(schema: RowSchema, data: Any, message: SourceMessage, what: str = "value") -> Row:
    """A decoded Avro record as a full row of ``schema`` (fields the table lacks are ignored)."""
    if not isinstance(data, Mapping):
        raise BadRecordError(message, None, f"the {what} is not an Avro record but {type(data).__name__}")
    row: Row = {}
    for column in schema.columns:
        try:
            value = avro_value(column, data.get(column.name))
        except ValueError as error:
            raise BadRecordError(message, column.name, str(error)) from None
        if value is None and not column.nullable:
            raise BadRecordError(message, column.name, f"column is missing or null in the {what}")
        row[column.name] = value
    return row


@dataclass
class _Writer:
    raw: Any  # the schema's JSON (for the evolution check)
    parsed: Any  # fastavro's parsed schema (for decoding)
    checked: bool = False  # its row fields checked against the table (values only)


@dataclass
class AvroDecoder:
    """Decodes one format's messages (``upsert`` / ``append`` / ``debezium``) with writer schemas by id.

    ``accepted`` holds schema ids an operator accepted (``run-source --accept-schema ID``): their
    messages skip the evolution check; a column they lack is NULL (or the record is dead-lettered when
    the column is NOT NULL)."""

    schema: RowSchema
    kind: str
    resolve: SchemaResolver
    generated_key: str | None = None
    accepted: frozenset[int] = frozenset()
    _writers: dict[int, _Writer] = field(default_factory=dict)

    def _writer(self, schema_id: int, message: SourceMessage) -> _Writer:
        writer = self._writers.get(schema_id)
        if writer is None:
            text = self.resolve(schema_id)
            if text is None:
                raise BadRecordError(message, None, f"unknown Avro schema id {schema_id} (not in the table's "
                                                    "schemas nor the Schema Registry)")
            try:
                raw = json.loads(text)
                writer = _Writer(raw, parse_schema(raw))
            except (ValueError, KeyError, TypeError) as error:
                raise BadRecordError(message, None, f"Avro schema id {schema_id} does not parse: {error}") from None
            self._writers[schema_id] = writer
        return writer

    def _read(self, data: bytes, message: SourceMessage, what: str, check: bool) -> Any:
        schema_id, payload = split_confluent(data, message, what)
        writer = self._writer(schema_id, message)
        if check and not writer.checked and schema_id not in self.accepted:
            try:
                fields = row_fields(writer.raw, self.kind == "debezium")
            except ValueError as error:
                raise SchemaChangeError(message, schema_id, "", str(error)) from None
            problem = check_writer_schema(self.schema, fields, self.generated_key)
            if problem is not None:
                raise SchemaChangeError(message, schema_id, *problem)
            writer.checked = True
        try:
            return schemaless_reader(io.BytesIO(payload), writer.parsed, None)
        except Exception as error:
            raise BadRecordError(message, None, f"the {what} does not decode with Avro schema id {schema_id}: "
                                                f"{type(error).__name__}: {error}") from None

    def _key(self, message: SourceMessage, what: str = "key") -> Key:
        """The message key: Confluent-framed Avro (a record of the key columns or a bare value), else
        JSON, else its UTF-8 text as a one-column key."""
        assert message.key is not None
        data: Any
        if message.key[:1] == b"\x00":
            data = self._read(message.key, message, "key", check=False)
        else:
            try:
                data = json.loads(message.key)
            except ValueError:
                data = message.key.decode("utf-8", "replace")
        if isinstance(data, Mapping):
            data = {name: avro_value(self.schema.column(name), data.get(name)) if name in data else None
                    for name in self.schema.primary_key}
        return typed_key(self.schema, data, message, what)

    def __call__(self, message: SourceMessage) -> list[RowChange]:
        if self.kind == "upsert":
            return self._upsert(message)
        if self.kind == "append":
            return self._append(message)
        return self._debezium(message)

    def _upsert(self, message: SourceMessage) -> list[RowChange]:
        if message.key is None:
            raise BadRecordError(message, None, "the message has no key (upsert-avro: the key is the primary key)")
        key = self._key(message)
        if message.value is None:
            return [RowChange(key, None)]
        data = self._read(message.value, message, "value", check=True)
        if not isinstance(data, Mapping):
            raise BadRecordError(message, None, f"the value is not an Avro record but {type(data).__name__}")
        key_row = self.schema.key_row(key)
        row = avro_row(self.schema, {**data, **{k: v for k, v in key_row.items() if data.get(k) is None}}, message)
        for name, value in key_row.items():
            if row[name] != value:
                raise BadRecordError(message, name, f"the value's {row[name]!r} differs from the message key's "
                                                    f"{value!r}")
        return [RowChange(key, row)]

    def _append(self, message: SourceMessage) -> list[RowChange]:
        if message.value is None:
            raise BadRecordError(message, None, "the value is null (append-avro: every message is a row)")
        data = self._read(message.value, message, "value", check=True)
        if self.generated_key is not None and isinstance(data, Mapping):
            data = {**data, self.generated_key: f"{message.partition}-{message.offset}"}
        row = avro_row(self.schema, data, message)
        return [RowChange(self.schema.key_of(row), row)]

    def _before_key(self, before: Mapping[str, Any], message: SourceMessage) -> Key:
        try:
            keyed = {k: avro_value(self.schema.column(k), before.get(k)) for k in self.schema.primary_key}
        except ValueError as error:
            raise BadRecordError(message, None, f"{error} (in 'before')") from None
        return typed_key(self.schema, keyed, message, "before")

    def _debezium(self, message: SourceMessage) -> list[RowChange]:
        """Debezium's envelope in Avro (AvroConverter): the same rules as ``debezium-json``."""
        if message.value is None:
            return []
        data = self._read(message.value, message, "value", check=True)
        if not isinstance(data, Mapping):
            raise BadRecordError(message, None, f"the value is not a Debezium change event but {type(data).__name__}")
        op = data.get("op")
        position = debezium_position(op, data.get("source"))
        before, after = data.get("before"), data.get("after")
        if op in ("c", "r", "u"):
            if after is None:
                raise BadRecordError(message, "after", f"op {op!r} without an 'after' row")
            row = avro_row(self.schema, after, message, "after")
            key = self.schema.key_of(row)
            changes = []
            if op == "u" and isinstance(before, Mapping) and \
                    all(before.get(k) is not None for k in self.schema.primary_key):
                old = self._before_key(before, message)
                if old != key:
                    changes.append(RowChange(old, None, position))
            changes.append(RowChange(key, row, position))
            return changes
        if op == "d":
            if isinstance(before, Mapping):
                return [RowChange(self._before_key(before, message), None, position)]
            if message.key is None:
                raise BadRecordError(message, "before", "a delete without 'before' or a message key")
            return [RowChange(self._key(message), None, position)]
        if op == "t":
            raise BadRecordError(message, "op", "a truncate ('t') is not supported: recreate the table to start over")
        raise BadRecordError(message, "op", f"unknown Debezium op {op!r} (expected c, u, d or r)")
