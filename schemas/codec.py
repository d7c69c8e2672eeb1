"""Encoding of change events, barriers, keys and catalog entries (fastavro, schemaless Avro binary).

fastavro encodes and decodes change events 8-10x faster than the reference ``avro`` package here
(``bench/codec.py``), and the reference package writes the ints and booleans of mvlog rows as doubles
(it takes the last union branch that fits), so fastavro is the codec. On the writers' hot path, plain
rows and keys are encoded directly, with the same bytes (see below). Decoding errors surface as
:class:`DecodeError` naming what was wrong.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from importlib.resources import files
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from mvlog.changes import Barrier, Change, Mutation, Op
from mvlog.row_schema import Key, Row
from mvlog.schemas import load_schema

HEADER_TYPE = "mvlog.type"
TYPE_CHANGE = b"change"
TYPE_BARRIER = b"barrier"

_CHANGE = load_schema("change_event")
_BARRIER = load_schema("barrier")
_VALUE = load_schema("value")
_CATALOG = load_schema("catalog_entry")


class DecodeError(ValueError):
    """A record that is not what an mvlog changelog holds (malformed Avro, wrong schema, ...)."""


def _write(schema: Any, datum: Any) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, schema, datum)
    return buffer.getvalue()


def _read(schema: Any, data: bytes, what: str) -> Any:
    buffer = io.BytesIO(data)
    try:
        datum = schemaless_reader(buffer, schema, None)
    except Exception as exc:  # fastavro raises many types on garbage input
        raise DecodeError(f"malformed {what}: {type(exc).__name__}: {exc}") from exc
    if buffer.tell() != len(data):
        raise DecodeError(f"malformed {what}: {len(data) - buffer.tell()} trailing bytes")
    return datum


# --- the hot path: rows, keys and change events -----------------------------------------------------
#
# Rows and keys are Avro maps of a union of scalars (value.avsc). fastavro resolves that union value by
# value, which costs about 0.7 us per column; the writers encode every row of every epoch, so plain
# dicts of plain scalars are encoded here directly, byte for byte as fastavro does (checked when this
# module loads, see _fast_path_matches). Anything else (other mapping or value types, ints beyond 64
# bits, a schema that changed) goes through fastavro as before.

_VALUE_BRANCHES = ["null", "boolean", "long", "double", "string", "bytes"]
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_pack_double = struct.Struct("<d").pack
_VARINTS = [bytes([i]) for i in range(128)]
_LABELS: dict[str, bytes] = {}  # column name -> its encoded map key
_NULL, _TRUE, _FALSE = b"\x00", b"\x02\x01", b"\x02\x00"
_LONG, _DOUBLE, _STRING, _BYTES = b"\x04", b"\x06", b"\x08", b"\x0a"
_ONE_ENTRY = b"\x02"  # a map block of one entry


def _varint(n: int) -> bytes:
    """Avro's variable-length encoding of a non-negative (already zigzagged) number."""
    if n < 0x80:
        return _VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _label(name: str) -> bytes:
    label = _LABELS.get(name)
    if label is None:
        data = name.encode()
        label = _varint(len(data) << 1) + data
        if len(_LABELS) < 10_000:
            _LABELS[name] = label
    return label


def _fast_value_map(datum: Any, _labels: dict[str, bytes] = _LABELS, _small: list[bytes] = _VARINTS) -> bytes | None:
    """value.avsc bytes of a dict of str -> None/bool/int/float/str/bytes; None for anything else."""
    if type(datum) is not dict:
        return None
    if not datum:
        return _NULL
    parts = [_varint(len(datum) << 1)]  # one block: its count (a long), the entries, then 0
    append = parts.append
    for name, value in datum.items():
        label = _labels.get(name)
        if label is None:
            if type(name) is not str:
                return None
            label = _label(name)
        append(label)
        kind = type(value)
        if kind is int:
            if not _INT64_MIN <= value <= _INT64_MAX:
                return None
            append(_LONG)
            number = (value << 1) ^ (value >> 63)
            append(_small[number] if number < 128 else _varint(number))
        elif kind is str:
            data = value.encode()
            append(_STRING)
            append(_small[len(data) << 1] if len(data) < 64 else _varint(len(data) << 1))
            append(data)
        elif kind is float:
            append(_DOUBLE)
            append(_pack_double(value))
        elif value is None:
            append(_NULL)
        elif kind is bool:
            append(_TRUE if value else _FALSE)
        elif kind is bytes:
            append(_BYTES)
            append(_varint(len(value) << 1))
            append(value)
        else:
            return None
    append(_NULL)
    return b"".join(parts)


def _value_map(datum: Any) -> bytes:
    return (_fast_value_map(datum) if _FAST else None) or _write(_VALUE, datum)


def encode_key(key_columns: tuple[str, ...], key: Key) -> bytes:
    """Deterministic bytes of a primary key: the Kafka key, the vnode hash input and the Redis field."""
    if _FAST and len(key) == 1 and len(key_columns) == 1:  # the usual key: one int or string column
        value, kind = key[0], type(key[0])
        label = _LABELS.get(key_columns[0])
        if label is not None:
            if kind is int and _INT64_MIN <= value <= _INT64_MAX:
                return b"".join((_ONE_ENTRY, label, _LONG, _varint((value << 1) ^ (value >> 63)), _NULL))
            if kind is str:
                data = value.encode()
                return b"".join((_ONE_ENTRY, label, _STRING, _varint(len(data) << 1), data, _NULL))
    return _value_map(dict(zip(key_columns, key, strict=True)))


def decode_key(key_columns: tuple[str, ...], data: bytes) -> Key:
    values = _read(_VALUE, data, "key")
    try:
        return tuple(values[c] for c in key_columns)
    except KeyError as exc:
        raise DecodeError(f"key lacks column {exc.args[0]!r}") from None


def encode_row(row: Row) -> bytes:
    return _value_map(row)


def decode_row(data: bytes) -> Row:
    row: Row = _read(_VALUE, data, "row")
    return row


def _change_tail_schema() -> Any:
    """The change event without its first two fields, when those are the ``before`` and ``after`` rows.

    An Avro record is its fields' encodings one after the other, so a change event is the encoded
    ``before``, the encoded ``after``, then this tail (op, source, ts_ms), which is the same for every
    change of one op in one vnode of an epoch: it is encoded once per epoch (``_TAILS``).
    """
    raw = json.loads(files("mvlog.schemas").joinpath("change_event.avsc").read_text())
    fields = raw["fields"]
    row_union = ["null", {"type": "map", "values": _VALUE_BRANCHES}]
    if [f["name"] for f in fields[:2]] != ["before", "after"] or any(f["type"] != row_union for f in fields[:2]):
        return None
    return parse_schema({"type": "record", "name": "ChangeEventTail", "namespace": raw.get("namespace"),
                         "fields": fields[2:]})


_CHANGE_TAIL = _change_tail_schema()
_TAILS: dict[tuple[Any, ...], bytes] = {}
_NULL_ROW, _SOME_ROW = b"\x00", b"\x02"  # the branches of a ["null", row] union
_PLAIN_ROW = (dict, type(None))


def _change_tail(view: str, epoch: int, vnode: int, op: str, ts_ms: int, txn: str) -> dict[str, Any]:
    return {"op": op, "source": {"view": view, "epoch": epoch, "vnode": vnode, "txn": txn}, "ts_ms": ts_ms}


def encode_change(view: str, epoch: int, vnode: int, change: Change, ts_ms: int, txn: str = "") -> bytes:
    before, after = change.before, change.after
    if type(before) in _PLAIN_ROW and type(after) in _PLAIN_ROW:
        return encode_change_rows(view, epoch, vnode, change.op.value,
                                  None if before is None else encode_row(before),
                                  None if after is None else encode_row(after), ts_ms, txn)
    return _write(_CHANGE, {"before": before, "after": after,
                            **_change_tail(view, epoch, vnode, change.op.value, ts_ms, txn)})


def encode_change_rows(view: str, epoch: int, vnode: int, op: str, before: bytes | None, after: bytes | None,
                       ts_ms: int, txn: str = "") -> bytes:
    """:func:`encode_change` of rows that are encoded already (:func:`encode_row` bytes): the same bytes."""
    if _CHANGE_TAIL is None:
        return _write(_CHANGE, {"before": None if before is None else decode_row(before),
                                "after": None if after is None else decode_row(after),
                                **_change_tail(view, epoch, vnode, op, ts_ms, txn)})
    cache_key = (view, epoch, vnode, op, ts_ms, txn)
    tail = _TAILS.get(cache_key)
    if tail is None:
        tail = _write(_CHANGE_TAIL, _change_tail(view, epoch, vnode, op, ts_ms, txn))
        if len(_TAILS) >= 4096:
            _TAILS.clear()
        _TAILS[cache_key] = tail
    return b"".join((_NULL_ROW if before is None else _SOME_ROW, before or b"",
                     _NULL_ROW if after is None else _SOME_ROW, after or b"", tail))


def decode_change(key_columns: tuple[str, ...], key: bytes, data: bytes) -> tuple[Change, dict[str, Any]]:
    """The change and its ``source`` block (view, epoch, vnode, txn).

    The primary key is taken from the row image, which holds the key columns, and checked against the
    Kafka key by encoding it (decoding the Kafka key would cost as much as the rest). Only an image
    without the key columns, or a mismatch, takes the Kafka key's decoding, which then names the problem.
    """
    datum = _read(_CHANGE, data, "change event")
    image = datum["after"] if datum["after"] is not None else datum["before"]
    row_key: Key | None = None
    if image is not None and all(c in image for c in key_columns):
        row_key = tuple(image[c] for c in key_columns)
    if row_key is None or encode_key(key_columns, row_key) != key:
        kafka_key = decode_key(key_columns, key)
        if row_key is not None and kafka_key != row_key:
            raise DecodeError(f"the record's key {kafka_key!r} is not its row's key {row_key!r}")
        row_key = kafka_key
    try:
        change = Change(Op(datum["op"]), row_key, datum["before"], datum["after"])
    except ValueError as exc:
        raise DecodeError(f"invalid change event: {exc}") from None
    return change, datum["source"]


def encode_barrier(barrier: Barrier) -> bytes:
    mutation = None
    if barrier.mutation is not None:
        mutation = {"kind": barrier.mutation.kind, "target": barrier.mutation.target,
                    "payload": json.dumps(dict(barrier.mutation.payload), sort_keys=True)}
    return _write(_BARRIER, {
        "view": barrier.view, "epoch": barrier.epoch, "prev_epoch": barrier.prev_epoch,
        "checkpoint": barrier.checkpoint, "partition": barrier.partition, "records": barrier.records,
        "ts_ms": barrier.ts_ms, "mutation": mutation, "txn": barrier.txn,
    })


def decode_barrier(data: bytes) -> Barrier:
    datum = _read(_BARRIER, data, "barrier")
    raw = datum["mutation"]
    try:
        payload = json.loads(raw["payload"]) if raw else None
    except ValueError as exc:
        raise DecodeError(f"barrier mutation payload is not JSON: {exc}") from None
    if raw and not isinstance(payload, dict):
        raise DecodeError("barrier mutation payload is not a JSON object")
    mutation = Mutation(raw["kind"], raw["target"], payload) if raw and payload is not None else None
    return Barrier(datum["view"], datum["epoch"], datum["prev_epoch"], datum["checkpoint"],
                   datum["partition"], datum["records"], datum["ts_ms"], mutation, datum["txn"])


def encode_catalog_entry(entry: Mapping[str, Any]) -> bytes:
    return _write(_CATALOG, dict(entry))


def decode_catalog_entry(data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = _read(_CATALOG, data, "catalog entry")
    return entry


def record_type(headers: Any) -> bytes | None:
    """The ``mvlog.type`` header of a Kafka record (None when absent: not an mvlog changelog record)."""
    items = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in items:
        if name == HEADER_TYPE:
            return value if isinstance(value, bytes) else None
    return None


def _fast_path_matches() -> bool:
    """Whether the direct encoders give fastavro's bytes for every value type (else fastavro is used)."""
    if load_schema("value").get("values") != _VALUE_BRANCHES:
        return False
    samples: list[Row] = [{}, {"i": 0, "n": -(1 << 63), "x": (1 << 63) - 1, "f": -1.5, "s": "é" * 70, "t": True,
                               "u": False, "z": None, "b": b"\x00" * 200, "w": 1 << 40}]
    if any(_fast_value_map(row) != _write(_VALUE, row) for row in samples):
        return False
    for key in [(-5,), ("é",), (1 << 63,), (None,)]:
        encode_key(("k",), key)  # the second call takes the one-column path
        if encode_key(("k",), key) != _write(_VALUE, {"k": key[0]}):
            return False
    change = Change(Op.UPDATE, (0,), samples[0], samples[1])
    return encode_change("v", 1 << 60, 255, change, 1, "t") == _write(_CHANGE, {
        "before": change.before, "after": change.after, **_change_tail("v", 1 << 60, 255, "u", 1, "t")})


_FAST = True
_FAST = _fast_path_matches()
