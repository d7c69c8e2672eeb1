"""Decoders of source topics: a message (key and value bytes) to the changes of the table it feeds.

One function per :class:`~mvlog.source_spec.SourceFormat`; :func:`decoder_for` picks it. Pure: no
Kafka here, so every mapping rule is unit-tested on hand-written messages. A message that cannot be
decoded raises :class:`~mvlog.source_records.BadRecordError` naming topic, partition, offset and field;
a message that carries no change (Debezium's tombstone after a delete) decodes to no change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from mvlog.row_schema import RowSchema
from mvlog.source_avro import AvroDecoder, SchemaResolver
from mvlog.source_dedupe import debezium_position
from mvlog.source_records import BadRecordError, RowChange, SourceMessage, typed_key, typed_row
from mvlog.source_spec import SourceFormat, SourceSpec

Decoder = Callable[[SourceMessage], list[RowChange]]


def decoder_for(spec: SourceSpec, schema: RowSchema, resolve: SchemaResolver | None = None,
                accepted: frozenset[int] = frozenset()) -> Decoder:
    """The decoder of ``spec``'s format for a table of ``schema``; an Avro format finds its writer
    schemas through ``resolve`` (schema id -> JSON text) and skips the evolution check for ``accepted`` ids."""
    if spec.format.is_avro:
        if resolve is None:
            raise ValueError(f"{spec.format.value} needs a resolver of Avro schema ids")
        return AvroDecoder(schema, spec.format.kind, resolve, spec.generated_key, accepted)
    if spec.format is SourceFormat.UPSERT_JSON:
        return lambda message: decode_upsert_json(schema, message)
    if spec.format is SourceFormat.APPEND_JSON:
        generated = spec.generated_key
        return lambda message: decode_append_json(schema, message, generated)
    return lambda message: decode_debezium_json(schema, message)


def _json(data: bytes, message: SourceMessage, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as error:
        detail = f"{error.msg} at char {error.pos}" if isinstance(error, json.JSONDecodeError) else str(error)
        raise BadRecordError(message, None, f"the {what} is not valid JSON: {detail}") from None


def decode_upsert_json(schema: RowSchema, message: SourceMessage) -> list[RowChange]:
    """The ``KTable`` / ``ENVELOPE UPSERT`` convention: the message key is the primary key (a JSON object
    of the key columns, or a bare value for a one-column key), the value the whole row (its key columns
    may be left out: the message key fills them), a null value (tombstone) deletes the key."""
    if message.key is None:
        raise BadRecordError(message, None, "the message has no key (upsert-json: the key is the primary key)")
    key = typed_key(schema, _json(message.key, message, "key"), message)
    if message.value is None:
        return [RowChange(key, None)]
    data = _json(message.value, message, "value")
    if not isinstance(data, Mapping):
        return [RowChange(key, typed_row(schema, data, message))]  # typed_row names the problem
    key_row = schema.key_row(key)
    row = typed_row(schema, {**key_row, **data}, message)
    for name, value in key_row.items():
        if row[name] != value:
            raise BadRecordError(message, name, f"the value's {row[name]!r} differs from the message key's {value!r}")
    return [RowChange(key, row)]


def decode_append_json(schema: RowSchema, message: SourceMessage, generated_key: str | None) -> list[RowChange]:
    """Every message a new row: the value is the row; its key is ``"<partition>-<offset>"`` in the
    ``generated_key`` column when one is configured (so a redelivered message is the same row), else
    the key columns of the value (a later message with the same key replaces the row)."""
    if message.value is None:
        raise BadRecordError(message, None, "the value is null (append-json: every message is a row)")
    data = _json(message.value, message, "value")
    if generated_key is not None and isinstance(data, Mapping):
        data = {**data, generated_key: f"{message.partition}-{message.offset}"}
    row = typed_row(schema, data, message)
    return [RowChange(schema.key_of(row), row)]


def _unwrap(data: Any) -> Any:
    """The payload of the JSON converter's ``{"schema": ..., "payload": ...}`` (schemas.enable=true)."""
    if isinstance(data, Mapping) and data.keys() == {"schema", "payload"}:
        return data["payload"]
    return data


def decode_debezium_json(schema: RowSchema, message: SourceMessage) -> list[RowChange]:
    """Debezium's change event envelope (JSON converter, with or without schemas).

    ``op`` ``c`` (insert), ``r`` (snapshot read) and ``u`` (update) upsert ``after``; an update whose
    ``before`` has another primary key first deletes that key; ``d`` deletes the key of ``before`` (or
    of the message key when ``before`` is absent). The null-valued tombstone Debezium writes after a
    delete (for log compaction) carries no change. Truncates (``t``) and anything else are refused.
    """
    if message.value is None:
        return []
    data = _unwrap(_json(message.value, message, "value"))
    if data is None:
        return []
    if not isinstance(data, Mapping):
        raise BadRecordError(message, None, f"the value is not a Debezium change event but {type(data).__name__}")
    op = data.get("op")
    position = debezium_position(op, data.get("source"))  # orders one row's streamed changes
    before, after = data.get("before"), data.get("after")
    if op in ("c", "r", "u"):
        if after is None:
            raise BadRecordError(message, "after", f"op {op!r} without an 'after' row")
        row = typed_row(schema, after, message, "after")
        key = schema.key_of(row)
        changes = []
        if op == "u" and isinstance(before, Mapping) and all(before.get(k) is not None for k in schema.primary_key):
            old = typed_key(schema, before, message, "before")
            if old != key:  # the primary key changed: the old key's row is gone
                changes.append(RowChange(old, None, position))
        changes.append(RowChange(key, row, position))
        return changes
    if op == "d":
        if before is not None:
            return [RowChange(typed_key(schema, before, message, "before"), None, position)]
        if message.key is None:
            raise BadRecordError(message, "before", "a delete without 'before' or a message key")
        return [RowChange(typed_key(schema, _unwrap(_json(message.key, message, "key")), message), None, position)]
    if op == "t":
        raise BadRecordError(message, "op", "a truncate ('t') is not supported: recreate the table to start over")
    raise BadRecordError(message, "op", f"unknown Debezium op {op!r} (expected c, u, d or r)")
