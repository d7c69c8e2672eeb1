"""The compiled codec against fastavro: the same bytes out, the same values back, errors on bad bytes.

The writers and readers use ``mvlog.schemas.native_codec`` only when it was built and agreed with
fastavro on a few samples at import; these tests hold it to fastavro on generated rows, keys and change
events, and check that malformed input of any shape raises ``ValueError`` (never crashes or reads past
the data).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvlog.key_order import order_member, order_members, ordered_key
from mvlog.row_schema import RowSchema
from mvlog.schemas import codec, load_schema
from mvlog.vnode import vnode_of

native = pytest.importorskip("mvlog.schemas.native_codec")

VALUE = load_schema("value")
CHANGE = load_schema("change_event")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=False), st.text(max_size=80), st.binary(max_size=80),
)
rows = st.dictionaries(st.text(max_size=20), scalars, max_size=12)


def fastavro_bytes(schema: Any, datum: Any) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, schema, datum)
    return buffer.getvalue()


def fastavro_value(schema: Any, data: bytes) -> Any:
    return schemaless_reader(io.BytesIO(data), schema, None)


def test_the_codec_uses_the_native_module() -> None:
    assert codec._native is native  # it was built and agreed with fastavro at import


@given(rows)
def test_rows_encode_as_fastavro_and_decode_back(row: dict[str, Any]) -> None:
    data = native.encode_value_map(row)
    assert data == fastavro_bytes(VALUE, row)
    assert native.decode_value_map(data) == row == fastavro_value(VALUE, data)


@given(st.lists(st.tuples(st.text(min_size=1, max_size=10), scalars), min_size=1, max_size=4, unique_by=lambda c: c[0]))
def test_keys_encode_as_the_map_of_their_columns(columns: list[tuple[str, Any]]) -> None:
    names, values = tuple(c[0] for c in columns), tuple(c[1] for c in columns)
    assert native.encode_key(names, values) == fastavro_bytes(VALUE, dict(columns))


@pytest.mark.parametrize("datum", [
    {"a": 1 << 63}, {"a": -(1 << 63) - 1},  # beyond Avro's long
    {"a": 1.5j}, {"a": bytearray(b"x")}, {"a": [1]}, {1: 2},  # not a value the schema's union takes as is
])
def test_values_it_does_not_handle_are_left_to_fastavro(datum: dict[Any, Any]) -> None:
    assert native.encode_value_map(datum) is None
    assert native.encode_key(tuple(datum), tuple(datum.values())) is None


def test_a_mapping_that_is_not_a_plain_dict_is_left_to_fastavro() -> None:
    class Row(dict[str, int]):
        pass

    assert native.encode_value_map(Row(a=1)) is None
    assert native.encode_key(("a",), (1, 2)) is None  # as many values as columns, or nothing


@given(st.one_of(st.none(), rows), st.one_of(st.none(), rows), st.sampled_from("cudr"), st.text(max_size=30),
       st.integers(0, (1 << 63) - 1), st.integers(-(1 << 31), (1 << 31) - 1), st.text(max_size=30),
       st.integers(-(1 << 63), (1 << 63) - 1))
def test_change_events_decode_as_fastavro(before: Any, after: Any, op: str, view: str, epoch: int, vnode: int,
                                          txn: str, ts_ms: int) -> None:
    event = {"before": before, "after": after, "op": op,
             "source": {"view": view, "epoch": epoch, "vnode": vnode, "txn": txn}, "ts_ms": ts_ms}
    data = fastavro_bytes(CHANGE, event)
    assert native.decode_change_event(data) == (before, after, op, view, epoch, vnode, txn, ts_ms)


def test_map_blocks_with_a_byte_size_decode() -> None:
    # Avro writers may emit a block as -count, its size in bytes, then the entries (fastavro never does).
    entries = b"\x02a\x04\x02" + b"\x02b\x00"  # "a": long 1, "b": null
    assert native.decode_value_map(b"\x03" + bytes([len(entries) << 1]) + entries + b"\x00") == {"a": 1, "b": None}


@pytest.mark.parametrize("data, problem", [
    (b"", "unexpected end"),
    (b"\x02\x02a\x0e\x00\x00", "union branch 7 out of range"),
    (b"\x02\x02a\x04", "unexpected end"),
    (b"\x02\x7fa\x00\x00", "beyond the data"),
    (b"\x02\x02a\x06\x00\x00", "unexpected end of data in a double"),
    (b"\x00\x00", "1 trailing bytes"),
    (b"\x02" + b"\xff" * 10 + b"\x01", "longer than 64 bits"),
    (b"\x02\x04\xff\xfe\x00\x00", "can't decode"),  # a column name that is not UTF-8
])
def test_malformed_rows_raise_value_error_naming_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        native.decode_value_map(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_decode_as_fastavro_does_or_raise_value_error(data: bytes) -> None:
    decoders: list[tuple[Callable[[bytes], Any], Any]] = [(native.decode_value_map, VALUE),
                                                          (native.decode_change_event, CHANGE)]
    for decode, schema in decoders:
        try:
            value = decode(data)
        except ValueError:
            continue
        buffer = io.BytesIO(data)
        read: Any = schemaless_reader(buffer, schema, None)  # whatever the native side read, fastavro reads too
        assert buffer.tell() == len(data)
        expected = read if schema is VALUE else (read["before"], read["after"], read["op"],
                                                 *read["source"].values(), read["ts_ms"])
        assert repr(value) == repr(expected)  # repr: a NaN double equals itself


class Record:
    """What the run decoder reads of a confluent-kafka Message (a plain stand-in: the decoder is pure)."""

    def __init__(self, offset: int, key: bytes | None, value: bytes | None, kind: bytes = b"change",
                 error: object = None) -> None:
        self._offset, self._key, self._value, self._kind, self._error = offset, key, value, kind, error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return [(codec.HEADER_TYPE, self._kind)]

    def error(self) -> object:
        return self._error


def change_record(offset: int, key: int, epoch: int = 7, txn: str = "t", view: str = "v", op: str = "c",
                  row_key: int | None = None) -> Record:
    row = {"id": key if row_key is None else row_key, "x": "a" * offset}
    before, after = (row, None) if op == "d" else (None, row)
    event = {"before": before, "after": after, "op": op,
             "source": {"view": view, "epoch": epoch, "vnode": 0, "txn": txn}, "ts_ms": 1}
    return Record(offset, codec.encode_key(("id",), (key,)), fastavro_bytes(CHANGE, event))


@pytest.mark.parametrize("stopper, reason", [
    (Record(3, None, b"\x00", kind=b"barrier"), "a barrier"),
    (change_record(3, 3, view="w"), "another view's event"),
    (change_record(3, 3, row_key=4), "a key that is not its row's"),
    (change_record(3, 3, op="u"), "an op its images do not fit"),
    (Record(3, b"k", b"\x00\x01"), "malformed bytes"),
    (Record(3, None, None, error="broker error"), "an error"),
    (change_record(3, 3, view="v" * 300), "a record over the size limit"),
])
def test_a_run_of_change_events_stops_before_any_other_record(stopper: Record, reason: str) -> None:
    records: list[Any] = [change_record(1, 1), change_record(2, 2, op="d"), stopper, change_record(4, 4)]
    epoch, txn, run, end = native.decode_change_run(records, 0, ("id",), "v", 400, [(codec.HEADER_TYPE, b"change")])
    assert end == 2, reason
    assert (epoch, txn) == (7, "t")
    assert run == [(1, records[0].key(), None, {"id": 1, "x": "a"}), (2, records[1].key(), {"id": 2, "x": "aa"}, None)]
    assert native.decode_change_run(records, 2, ("id",), "v", 400, [(codec.HEADER_TYPE, b"change")])[2:] == ([], 2)


@pytest.mark.parametrize("epoch, txn", [(8, "t"), (7, "other")])
def test_a_run_holds_one_epoch_of_one_transaction(epoch: int, txn: str) -> None:
    records: list[Any] = [change_record(1, 1), change_record(2, 2, epoch=epoch, txn=txn), change_record(3, 3)]
    headers = [(codec.HEADER_TYPE, b"change")]
    assert [native.decode_change_run(records, i, ("id",), "v", 400, headers)[::3] for i in range(3)] == [
        (7, 1), (epoch, 2), (7, 3)]


key_values = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1),
                       st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20))


@given(st.integers(0, 255), st.lists(key_values, min_size=1, max_size=3), st.binary(max_size=40))
def test_order_members_are_the_python_encoding(vnode: int, key: list[Any], avro_key: bytes) -> None:
    expected = bytes((vnode,)) + ordered_key(key) + avro_key + len(avro_key).to_bytes(2, "big")
    assert native.order_member(vnode, tuple(key), avro_key) == expected == order_member(vnode, tuple(key), avro_key)


@given(st.lists(st.tuples(st.lists(key_values, min_size=1, max_size=2).map(tuple), st.binary(max_size=30)),
                max_size=20))
def test_many_order_members_are_each_ones(pairs: list[tuple[tuple[Any, ...], bytes]]) -> None:
    keys, avro_keys = [p[0] for p in pairs], [p[1] for p in pairs]
    expected = [order_member(vnode_of(avro_key), key, avro_key) for key, avro_key in pairs]
    assert native.order_members(keys, avro_keys, order_member) == expected == order_members(keys, avro_keys)


def test_order_members_it_does_not_handle_are_left_to_python() -> None:
    assert native.order_member(0, (1 << 63,), b"k") is None
    assert native.order_member(0, (bytearray(b"x"),), b"k") is None
    assert native.order_member(256, (1,), b"k") is None
    assert native.order_member(0, (1,), b"k" * 0x10000) is None


@given(st.binary(max_size=64))
def test_vnodes_are_mvlogs(key: bytes) -> None:
    assert native.vnode_of(key) == vnode_of(key)


table_changes = st.lists(st.tuples(
    st.lists(key_values, min_size=1, max_size=2).map(tuple),
    st.sampled_from(["c", "u", "d"]),
    rows, rows,
), max_size=30)


@given(table_changes, st.integers(0, 35), st.integers(0, 35))
def test_a_table_writers_records_are_the_python_encoding(changes: list[Any], start: int, stop: int) -> None:
    """Each change event, Redis row and order member is what the table writer's Python loop makes."""
    encoded = [(codec.encode_key(("k", "l")[:len(key)], key), op, None if op == "c" else codec.encode_row(before),
                None if op == "d" else codec.encode_row(after), key) for key, op, before, after in changes]
    row_kv: list[bytes] = []
    members: list[bytes] = []
    deleted: list[tuple[int, bytes, bytes | None]] = []
    out: list[tuple[bytes, int, bytes]] = []
    tails: list[bytes | None] = [None] * 768
    native.encode_table_changes(
        encoded, start, stop, tails, lambda vnode, op: codec.change_tail("v", 7, vnode, op, 11, "t"),
        row_kv, members, lambda vnode, kb, before: deleted.append((vnode, kb, before)), order_member, out)

    expected_kv: list[bytes] = []
    expected_members: list[bytes] = []
    expected_deleted: list[tuple[int, bytes, bytes | None]] = []
    expected_out: list[tuple[bytes, int, bytes]] = []
    for kb, op, before, after, key in encoded[start:stop]:
        vnode = vnode_of(kb)
        if after is None:
            expected_deleted.append((vnode, kb, before))
        else:
            expected_kv += [kb, after]
            expected_members.append(order_member(vnode, key, kb))
        expected_out.append((kb, vnode, codec.encode_change_rows("v", 7, vnode, op, before, after, 11, "t")))
    assert (out, row_kv, members, deleted) == (expected_out, expected_kv, expected_members, expected_deleted)


@given(st.dictionaries(st.tuples(key_values, key_values), st.one_of(st.none(), rows), max_size=20))
def test_a_first_loads_changes_are_the_python_encoding(pending: dict[tuple[Any, ...], Any]) -> None:
    columns = ("k", "l")
    out: list[Any] = []
    native.encode_created(pending, columns, "c", out, codec.encode_key, codec.encode_row)
    assert out == [(codec.encode_key(columns, key), "c", None, codec.encode_row(row), key)
                   for key, row in pending.items() if row is not None]


def test_a_key_the_compiled_member_does_not_take_goes_to_the_python_one() -> None:
    kb = codec.encode_key(("k",), (1 << 63,))
    members: list[bytes] = []
    out: list[tuple[bytes, int, bytes]] = []
    native.encode_table_changes([(kb, "c", None, codec.encode_row({"k": 1}), (1 << 63,))], 0, 1, [None] * 768,
                                lambda vnode, op: b"", [], members, None, lambda *args: b"python", out)
    assert members == [b"python"]


TABLE = RowSchema.of({"id": "int", "name": "string", "x": "float", "ok": "boolean", "blob": "bytes"}, ["id", "name"])
NATIVE_COLUMNS = tuple((c.name, ["int", "float", "string", "boolean", "bytes"].index(c.type.value), c.nullable)
                       for c in TABLE.columns)
any_value = st.one_of(scalars, st.floats(), st.integers(), st.builds(bytearray, st.binary(max_size=4)),
                      st.lists(st.integers(), max_size=2))
loose_rows = st.dictionaries(st.sampled_from(["id", "name", "x", "ok", "blob", "other"]), any_value, max_size=6)


@settings(max_examples=400)
@given(loose_rows)
def test_normalize_row_is_the_schemas_validate_and_normalize(row: dict[str, Any]) -> None:
    plain = native.normalize_row(row, NATIVE_COLUMNS, (0, 1))
    if plain is None:  # left to the schema: only rows it refuses or normalizes otherwise
        assert TABLE.validate(row) or any(type(v) not in (type(None), int, float, str, bool, bytes, bytearray)
                                          or (type(v) is float and v != v) for v in row.values())
        return
    assert TABLE.validate(row) == []
    normalized = TABLE.normalize(row)
    assert plain[0] == normalized and list(plain[0]) == TABLE.names
    assert plain[1] == TABLE.key_of(normalized)
    assert plain[2] == sum(len(v) for k, v in normalized.items() if k in ("name", "blob") and v is not None)


@given(st.fixed_dictionaries({"id": st.integers(-(1 << 63), (1 << 63) - 1), "name": st.text()},
                             optional={"x": st.one_of(st.none(), st.integers(-10, 10), st.floats(allow_nan=False)),
                                       "ok": st.booleans(), "blob": st.binary()}))
def test_valid_plain_rows_are_normalized_in_one_call(row: dict[str, Any]) -> None:
    assert native.normalize_row(row, NATIVE_COLUMNS, (0, 1)) is not None


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.binary(max_size=40), max_size=30), data=st.data())
def test_pack_items_packs_as_hiredis_does(items: list[bytes], data: st.DataObject) -> None:
    """An epoch's Redis chunks (mvlog.connectors.redis.streamed_commit): the compiled packing and the Python
    one both give hiredis' bytes, for HSET-like commands and ZADD's score before each member."""
    from hiredis import pack_command

    from mvlog.connectors.redis.streamed_commit import _pack_items_python

    start = data.draw(st.integers(0, len(items)))
    stop = data.draw(st.integers(start, len(items)))
    head: tuple[str | bytes, ...] = data.draw(st.sampled_from([("HSET", "p:{t}:rows"), ("ZADD", b"p:{\xc3\xa9}:k"),
                                                               ("HDEL", "p:{é}:rows\r\n")]))
    for each_before in (b"", b"0"):
        args: list[Any] = []
        for item in items[start:stop]:
            args += [each_before, item] if each_before else [item]
        expected = bytes(pack_command((*head, *args)))
        assert native.pack_items(head, items, start, stop, each_before) == expected
        assert _pack_items_python(head, items, start, stop, each_before) == expected


def test_pack_items_refuses_what_it_cannot_pack() -> None:
    with pytest.raises(IndexError):
        native.pack_items(("HSET", "k"), [b"a"], 0, 2, b"")
    with pytest.raises(TypeError):
        native.pack_items(("HSET", 1), [b"a"], 0, 1, b"")
    with pytest.raises(TypeError):
        native.pack_items(("HSET", "k"), ["text"], 0, 1, b"")
