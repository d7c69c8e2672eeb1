"""The fast path of the JSON source decoders: msgspec's typed decoding straight into normalized rows.

:mod:`mvlog.source_formats` is the reference: it maps every message by the documented rules and names
what is wrong with a bad one, one ``json.loads`` and one Python check per column at a time. Most
messages of a topic are plain, so a **fast decoder** tries each message first with ``msgspec`` decoders
built from the table's column types (a struct per row: ints within 64 bits, numbers for float
columns, strings, booleans, base64 text for bytes; fields the table lacks are skipped in C), and
answers either the message's one change or ``None``, meaning "not plain: ask the reference decoder".
Anything msgspec refuses (a wrong type, a float for an int column, numeric text for a float column,
malformed JSON, a missing key column, a key that disagrees with the value, an oversized text) is
``None``, so the reference decoder gives the mapping or the error it always gave: **for every message it
accepts, the fast decoder's change equals the reference decoder's**, with the row already in the
table's normalized form (every column, in schema order, of its exact type), which
:meth:`~mvlog.services.tables.writer.Table.queue_normalized` queues without checking it again.

A row's strings and bytes are bounded so that it surely fits one record of the changelog (``text_limit``
characters in all, the table writer's bound): each text column takes at most its share, and a row with a
longer text goes the reference way, where the table measures it.

``upsert-json`` and ``append-json`` have fast decoders (:func:`fast_decoder_for`); ``debezium-json`` has
its own (:func:`fast_debezium_decoder_for`), which also answers the change's source position (the per-key
redelivery rule of :mod:`mvlog.source_dedupe`, applied by the ingester): an envelope with or without the JSON
converter's schemas whose ``op`` is ``c``, ``r`` or ``u`` with a plain ``after`` row (and for ``u`` a
``before`` of the same key, or none), or ``d`` with a ``before`` holding the key. Tombstones, an update
that changes the key (two changes), a delete keyed by the message key, truncates, unknown ops and
anything msgspec refuses go the reference way. Without msgspec installed there is no fast path at all.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Annotated, Any, Protocol

from mvlog.row_schema import INT64_MAX, INT64_MIN, ColumnType, Key, Row, RowSchema
from mvlog.source_dedupe import debezium_position
from mvlog.source_spec import SourceFormat, SourceSpec

try:
    import msgspec
except ImportError:  # pragma: no cover - a declared dependency; without it only the reference decoders run
    msgspec = None  # type: ignore[assignment]



class Record(Protocol):
    """What the fast decoders read of a message (confluent-kafka's ``Message`` has these methods), only
    what each needs: ``key`` and ``value`` bytes, ``partition`` and ``offset`` for a generated key."""

    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...


#: a message -> (key, normalized row or None for a delete), or None when the message is not plain (the
#: reference decoder then maps it or names the problem).
FastDecoder = Callable[[Record], tuple[Key, Row | None] | None]
#: ``debezium-json``'s: (key, normalized row or None for a delete, source position or None), or None (not plain).
DebeziumFastDecoder = Callable[[Record], tuple[Key, Row | None, int | None] | None]

_GENERATED_KEY_CHARS = 42  # "<partition>-<offset>": two 64-bit numbers and a dash, at most


def _text_share(spec: SourceSpec, schema: RowSchema, text_limit: int) -> int | None:
    """Each text column's share of ``text_limit``; None when the format's rows have no fast path for ``schema``."""
    if msgspec is None or any(schema.column(name).type is ColumnType.BYTES or schema.column(name).nullable
                              for name in schema.primary_key):
        return None  # no msgspec; base64 keys, nullable key columns: the reference way
    generated = spec.generated_key if spec.format is SourceFormat.APPEND_JSON else None
    texts = [c for c in schema.columns if c.type in (ColumnType.STRING, ColumnType.BYTES) and c.name != generated]
    share = (text_limit - (_GENERATED_KEY_CHARS if generated else 0)) // max(1, len(texts))
    return share if share > 0 else None


def fast_decoder_for(spec: SourceSpec, schema: RowSchema, text_limit: int) -> FastDecoder | None:
    """The fast decoder of ``spec``'s format (``upsert-json``, ``append-json``) for a table of ``schema`` whose
    rows with at most ``text_limit`` characters of text surely fit the changelog; None where there is none."""
    if spec.format not in (SourceFormat.UPSERT_JSON, SourceFormat.APPEND_JSON):
        return None
    share = _text_share(spec, schema, text_limit)
    if share is None:
        return None
    if spec.format is SourceFormat.UPSERT_JSON:
        return _upsert_decoder(schema, share)
    return _append_decoder(schema, share, spec.generated_key)


def fast_debezium_decoder_for(spec: SourceSpec, schema: RowSchema, text_limit: int) -> DebeziumFastDecoder | None:
    """The fast decoder of a ``debezium-json`` source (see the module doc), as :func:`fast_decoder_for`."""
    if spec.format is not SourceFormat.DEBEZIUM_JSON:
        return None
    share = _text_share(spec, schema, text_limit)
    return None if share is None else _debezium_decoder(schema, share)


def _field_type(kind: ColumnType, share: int) -> Any:
    """The msgspec type of a column's non-null values (bytes as their base64 text, decoded after)."""
    if kind is ColumnType.INT:
        return Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
    if kind is ColumnType.FLOAT:
        return float  # JSON ints too (made floats); JSON has no NaN, and msgspec refuses out-of-range numbers
    if kind is ColumnType.BOOLEAN:
        return bool
    return Annotated[str, msgspec.Meta(max_length=share)]  # strings; base64 text of bytes


def _row_struct(schema: RowSchema, share: int, *, keys_optional: bool, skip: str | None = None) -> Any:
    """A struct of the row's columns in schema order: nullable ones default to None, non-nullable ones
    are required and never null (``keys_optional``: the key columns, never nullable, may be absent, left
    UNSET, never null).
    ``skip`` names a column decoded as anything (the generated key, overwritten)."""
    fields: list[tuple[str, Any, Any]] = []
    for column in schema.columns:
        if column.name == skip:
            fields.append((column.name, Any, None))
            continue
        kind = _field_type(column.type, share)
        if column.nullable:
            fields.append((column.name, kind | None, None))
        elif keys_optional and column.name in schema.primary_key:
            fields.append((column.name, kind | msgspec.UnsetType, msgspec.UNSET))
        else:
            fields.append((column.name, kind, msgspec.NODEFAULT))
    spec = [(name, kind) if default is msgspec.NODEFAULT else (name, kind, default) for name, kind, default in fields]
    return msgspec.defstruct("SourceRow", spec, kw_only=True)


def _bytes_columns(schema: RowSchema) -> tuple[str, ...]:
    return tuple(c.name for c in schema.columns if c.type is ColumnType.BYTES)


def _unbase64(row: Row, names: tuple[str, ...]) -> bool:
    """Decode the base64 text of ``row``'s bytes columns in place; False when one is not base64."""
    for name in names:
        text = row[name]
        if text is not None:
            try:
                row[name] = base64.b64decode(text, validate=True)
            except (ValueError, binascii.Error):
                return False
    return True


def _upsert_decoder(schema: RowSchema, share: int) -> FastDecoder:
    """``upsert-json``: the key a JSON object of the key columns (or a bare value for a one-column key),
    the value an object of the row (its key columns absent or equal to the key's), null deletes."""
    pk = schema.primary_key
    key_fields = [(name, _field_type(schema.column(name).type, share)) for name in pk]
    key_struct = msgspec.defstruct("SourceKey", key_fields)
    key_type: Any = key_struct | key_fields[0][1] if len(pk) == 1 else key_struct
    decode_key = msgspec.json.Decoder(key_type).decode
    decode_value = msgspec.json.Decoder(_row_struct(schema, share, keys_optional=True)).decode
    astuple, asdict, unset = msgspec.structs.astuple, msgspec.structs.asdict, msgspec.UNSET
    error = msgspec.MsgspecError
    binary = _bytes_columns(schema)

    def decode(message: Record) -> tuple[Key, Row | None] | None:
        key_bytes, value_bytes = message.key(), message.value()
        if key_bytes is None:
            return None
        try:
            decoded = decode_key(key_bytes)
            if value_bytes is None:
                return (astuple(decoded) if type(decoded) is key_struct else (decoded,)), None
            row = asdict(decode_value(value_bytes))
        except error:
            return None
        key: Key = astuple(decoded) if type(decoded) is key_struct else (decoded,)
        for name, value in zip(pk, key, strict=True):
            found = row[name]
            if found is unset:
                row[name] = value
            elif found != value:
                return None
        if binary and not _unbase64(row, binary):
            return None
        return key, row

    return decode


def _append_decoder(schema: RowSchema, share: int, generated: str | None) -> FastDecoder:
    """``append-json``: the value an object of the row; its key the key columns, or ``generated`` filled
    with ``"<partition>-<offset>"``."""
    decode_value = msgspec.json.Decoder(_row_struct(schema, share, keys_optional=False, skip=generated)).decode
    asdict, error = msgspec.structs.asdict, msgspec.MsgspecError
    binary = _bytes_columns(schema)
    pk = schema.primary_key
    single = pk[0] if len(pk) == 1 else None

    def decode(message: Record) -> tuple[Key, Row | None] | None:
        value_bytes = message.value()
        if value_bytes is None:
            return None
        try:
            row = asdict(decode_value(value_bytes))
        except error:
            return None
        if generated is not None:
            row[generated] = f"{message.partition()}-{message.offset()}"
        if binary and not _unbase64(row, binary):
            return None
        return ((row[single],) if single is not None else tuple(row[name] for name in pk)), row

    return decode


def _debezium_decoder(schema: RowSchema, share: int) -> DebeziumFastDecoder:
    """``debezium-json`` (the reference: :func:`mvlog.source_formats.decode_debezium_json`). One struct decodes
    the envelope: ``after`` a full row (as ``typed_row``), ``before`` only its key columns (all a delete reads
    of it, and all an update compares), ``source`` only what :func:`debezium_position` reads, and the JSON
    converter's ``schema`` and ``payload`` left undecoded (``msgspec.Raw``); when those two are the only
    fields, the payload is decoded as the envelope."""
    pk = schema.primary_key
    unset, unset_type, raw = msgspec.UNSET, msgspec.UnsetType, msgspec.Raw
    key_struct = msgspec.defstruct("DebeziumKey", [(name, _field_type(schema.column(name).type, share) | None |
                                                    unset_type, unset) for name in pk])
    row_struct = _row_struct(schema, share, keys_optional=False)
    source_struct = msgspec.defstruct("DebeziumSource", [(name, Any, unset) for name in ("connector", "snapshot",
                                                                                       "lsn")])
    envelope = msgspec.defstruct("DebeziumEnvelope", [
        ("op", str | unset_type, unset), ("before", key_struct | None | unset_type, unset),
        ("after", row_struct | None | unset_type, unset), ("source", source_struct | None | unset_type, unset),
        ("schema", raw | unset_type, unset), ("payload", raw | unset_type, unset)])
    decode_envelope = msgspec.json.Decoder(envelope).decode
    decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
    astuple, asdict, error = msgspec.structs.astuple, msgspec.structs.asdict, msgspec.MsgspecError
    binary = _bytes_columns(schema)
    wrapped = {"schema", "payload"}

    def decode(message: Record) -> tuple[Key, Row | None, int | None] | None:
        value = message.value()
        if value is None:
            return None  # a tombstone: no change (the reference says so)
        try:
            event: Any = decode_envelope(value)
            if event.schema is not unset or event.payload is not unset:
                fields = decode_fields(value)  # (the converter's wrapper has these two fields only)
                if fields.keys() == wrapped:
                    event = decode_envelope(fields["payload"])  # a null payload is refused: the reference way
        except error:
            return None
        op, before, source = event.op, event.before, event.source
        position = None if source is unset or source is None else debezium_position(
            op, {name: found for name, found in zip(("connector", "snapshot", "lsn"), astuple(source), strict=True)
                 if found is not unset})
        if op == "d":
            if before is unset or before is None:
                return None  # keyed by the message key, or no key at all: the reference way
            old = astuple(before)
            if unset in old or None in old:
                return None  # the reference names the missing key column
            return old, None, position
        if op not in ("c", "r", "u"):
            return None
        after = event.after
        if after is unset or after is None:
            return None
        row = asdict(after)
        if binary and not _unbase64(row, binary):
            return None
        key = tuple(row[name] for name in pk)
        if op == "u" and before is not unset and before is not None:
            old = astuple(before)
            if unset not in old and None not in old and old != key:
                return None  # the key changed: a delete of the old key, then the row (the reference's two changes)
        return key, row, position

    return decode


__all__ = ["DebeziumFastDecoder", "FastDecoder", "Record", "fast_debezium_decoder_for", "fast_decoder_for"]
