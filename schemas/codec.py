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
import sys
from collections.abc import Mapping
from importlib.resources import files
from types import ModuleType
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
# Rows and keys are Avro maps of a union of scalars (value.avsc), which fastavro resolves value by value
# through its generic schema dispatch: several microseconds per row, on every row every writer encodes
# and every reader decodes. The compiled module ``native_codec`` does these few fixed shapes directly,
# byte for byte as fastavro (checked when this module loads, see _native_matches). Where it is not built
# (no C compiler at install time) or the check fails, fastavro does everything, only slower.

_native_module: ModuleType | None
try:
    from mvlog.schemas import native_codec as _native_module
except ImportError:  # pragma: no cover - the extension is optional at install time
    _native_module = None

_VALUE_BRANCHES = ["null", "boolean", "long", "double", "string", "bytes"]
_native: Any = None  # the native module once _native_matches() accepted it


def _value_map(datum: Any) -> bytes:
    encoded = _native.encode_value_map(datum) if _native is not None else None
    return encoded if encoded is not None else _write(_VALUE, datum)


def encode_key(key_columns: tuple[str, ...], key: Key) -> bytes:
    """Deterministic bytes of a primary key: the Kafka key, the vnode hash input and the Redis field."""
    if _native is not None:
        encoded: bytes | None = _native.encode_key(tuple(key_columns), tuple(key))
        if encoded is not None:
            return encoded
    return _write(_VALUE, dict(zip(key_columns, key, strict=True)))


def _read_value_map(data: bytes, what: str) -> dict[str, Any]:
    if _native is None:
        values: dict[str, Any] = _read(_VALUE, data, what)
        return values
    try:
        native_values: dict[str, Any] = _native.decode_value_map(data)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"malformed {what}: {exc}") from None
    return native_values


def decode_key(key_columns: tuple[str, ...], data: bytes) -> Key:
    values = _read_value_map(data, "key")
    try:
        return tuple(values[c] for c in key_columns)
    except KeyError as exc:
        raise DecodeError(f"key lacks column {exc.args[0]!r}") from None


def encode_row(row: Row) -> bytes:
    return _value_map(row)


def decode_row(data: bytes) -> Row:
    return _read_value_map(data, "row")


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
        tail = change_tail(view, epoch, vnode, op, ts_ms, txn)
        if len(_TAILS) >= 4096:
            _TAILS.clear()
        _TAILS[cache_key] = tail
    return b"".join((_NULL_ROW if before is None else _SOME_ROW, before or b"",
                     _NULL_ROW if after is None else _SOME_ROW, after or b"", tail))


def change_tail(view: str, epoch: int, vnode: int, op: str, ts_ms: int, txn: str) -> bytes:
    """The bytes after the ``before`` and ``after`` rows of a change event (see ``_change_tail_schema``)."""
    if _CHANGE_TAIL is None:
        raise RuntimeError("change_event.avsc no longer starts with the before and after rows")
    return _write(_CHANGE_TAIL, _change_tail(view, epoch, vnode, op, ts_ms, txn))


def decode_change(key_columns: tuple[str, ...], key: bytes, data: bytes) -> tuple[Change, dict[str, Any]]:
    """The change and its ``source`` block (view, epoch, vnode, txn).

    The primary key is taken from the row image, which holds the key columns, and checked against the
    Kafka key by encoding it (decoding the Kafka key would cost as much as the rest). Only an image
    without the key columns, or a mismatch, takes the Kafka key's decoding, which then names the problem.
    """
    if _native is not None:
        try:
            before, after, op, view, epoch, vnode, txn, _ = _native.decode_change_event(data)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"malformed change event: {exc}") from None
        source = {"view": view, "epoch": epoch, "vnode": vnode, "txn": txn}
    else:
        datum = _read(_CHANGE, data, "change event")
        before, after, op, source = datum["before"], datum["after"], datum["op"], datum["source"]
    image = after if after is not None else before
    row_key: Key | None = None
    if image is not None:
        if len(key_columns) == 1:  # the usual key
            if key_columns[0] in image:
                row_key = (image[key_columns[0]],)
        elif all(c in image for c in key_columns):
            row_key = tuple(image[c] for c in key_columns)
    if row_key is None or encode_key(key_columns, row_key) != key:
        kafka_key = decode_key(key_columns, key)
        if row_key is not None and kafka_key != row_key:
            raise DecodeError(f"the record's key {kafka_key!r} is not its row's key {row_key!r}")
        row_key = kafka_key
    try:
        change = Change(_OPS[op], row_key, before, after)
    except (KeyError, ValueError) as exc:
        raise DecodeError(f"invalid change event: {exc}") from None
    return change, source


_OPS = {op.value: op for op in Op}


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


def _native_matches() -> bool:
    """Whether the native codec gives fastavro's bytes and values for every value type and the change
    event's layout (before, after, op, source {view, epoch, vnode, txn}, ts_ms) is still the schema's."""
    if _native_module is None or load_schema("value").get("values") != _VALUE_BRANCHES:
        return False
    if _CHANGE_TAIL is None or sys.byteorder != "little":
        return False
    fields = json.loads(files("mvlog.schemas").joinpath("change_event.avsc").read_text())["fields"][2:]
    tail = [(f["name"], f["type"] if isinstance(f["type"], str) else [(g["name"], g["type"])
                                                                      for g in f["type"]["fields"]]) for f in fields]
    if tail != [("op", "string"), ("source", [("view", "string"), ("epoch", "long"), ("vnode", "int"),
                                              ("txn", "string")]), ("ts_ms", "long")]:
        return False
    rows: list[Row] = [{}, {"i": 0, "n": -(1 << 63), "x": (1 << 63) - 1, "f": -1.5, "s": "é" * 70, "t": True,
                            "u": False, "z": None, "b": b"\x00" * 200, "w": 1 << 40, "long": "x" * 600}]
    for row in rows:
        data = _write(_VALUE, row)
        if _native_module.encode_value_map(row) != data or _native_module.decode_value_map(data) != row:
            return False
    for key in [(-5,), ("é",), (1 << 62, "a")]:
        columns = ("k", "l")[:len(key)]
        if _native_module.encode_key(columns, key) != _write(_VALUE, dict(zip(columns, key, strict=True))):
            return False
    event = {"before": rows[0], "after": rows[1], **_change_tail("v", 1 << 60, 255, "u", 1, "t")}
    decoded = _native_module.decode_change_event(_write(_CHANGE, event))
    return bool(decoded == (rows[0], rows[1], "u", "v", 1 << 60, 255, "t", 1))


_native = _native_module if _native_matches() else None


def native_module() -> Any:
    """The compiled codec when it is built and agrees with fastavro, else None (for other fast paths)."""
    return _native
