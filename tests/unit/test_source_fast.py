"""The fast path of the JSON source decoders (mvlog.source_fast): for every message it accepts, its change
equals the reference decoder's (mvlog.source_formats) with the row normalized as Table.upsert does;
everything else (bad records, lenient mappings, oversized text) it leaves to the reference decoder."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mvlog.row_schema import Column, ColumnType, RowSchema
from mvlog.schemas.codec import native_module
from mvlog.source_fast import fast_debezium_decoder_for, fast_decoder_for
from mvlog.source_formats import decoder_for
from mvlog.source_records import BadRecordError, SourceMessage
from mvlog.source_spec import SourceFormat, SourceSpec

SCHEMA = RowSchema.of({"id": "int", "name": "string", "price": "float", "active": "boolean", "blob": "bytes"},
                      ["id"])
TEXT_LIMIT = 1000


class Record:
    def __init__(self, key: bytes | None, value: bytes | None, partition: int = 1, offset: int = 42) -> None:
        self._key, self._value, self._partition, self._offset = key, value, partition, offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def raw(data: Any) -> bytes | None:
    return None if data is None else data if isinstance(data, bytes) else json.dumps(data).encode()


def normalized(schema: RowSchema, row: dict[str, Any]) -> dict[str, Any]:
    """What Table.upsert queues for a row the reference decoder typed."""
    native = native_module()
    if native is None:
        return schema.normalize(row)
    kinds = {"int": 0, "float": 1, "string": 2, "boolean": 3, "bytes": 4}
    columns = tuple((c.name, kinds[c.type.value], c.nullable) for c in schema.columns)
    out = native.normalize_row(row, columns, tuple(schema.names.index(k) for k in schema.primary_key))
    assert out is not None
    normalized: dict[str, Any] = out[0]
    return normalized


def agree(fast: Any, spec: SourceSpec, schema: RowSchema, key: Any, value: Any, *,
          fast_expected: bool) -> tuple[Any, Any] | None:
    """``fast`` accepts the message exactly when expected, and then gives the reference's one change's key
    and normalized row (every column, in schema order, of the same types); returns (fast's, reference's)."""
    record = Record(raw(key), raw(value))
    got = fast(record)
    assert (got is not None) == fast_expected, got
    if got is None:
        return None
    [reference] = decoder_for(spec, schema)(SourceMessage("t", 1, 42, record.key(), record.value()))
    assert got[0] == reference.key
    if reference.row is None:
        assert got[1] is None
    else:
        assert got[1] == normalized(schema, reference.row)
        assert list(got[1]) == schema.names
        assert [type(v) for v in got[1].values()] == [type(v) for v in normalized(schema, reference.row).values()]
    return got, reference


def check(spec: SourceSpec, schema: RowSchema, key: Any, value: Any, *, fast_expected: bool) -> None:
    """The fast decoder accepts the message exactly when expected, and then agrees with the reference."""
    fast = fast_decoder_for(spec, schema, TEXT_LIMIT)
    assert fast is not None
    agree(fast, spec, schema, key, value, fast_expected=fast_expected)


UPSERT = SourceSpec("t", SourceFormat.UPSERT_JSON)
APPEND = SourceSpec("t", SourceFormat.APPEND_JSON)
B64 = base64.b64encode(b"\x00\xff").decode()


@pytest.mark.parametrize(("key", "value"), [
    ({"id": 7}, {"id": 7, "name": "x", "price": 2, "active": False, "blob": B64}),
    (7, {"id": 7, "name": "x", "price": 2.5, "active": True, "blob": None}),
    (3, {"name": "n", "unrelated": [1, {"a": 2}]}),  # key fills the value; unknown fields skipped
    ({"id": 3, "other": 1}, {"price": -0.0}),
    ({"id": 9}, None),  # tombstone
    (2**63 - 1, {"id": 2**63 - 1}),
    (-(2**63), {}),
    (5, {"price": 2**70}),
])
def test_upsert_plain_messages_agree_with_the_reference(key: Any, value: Any) -> None:
    check(UPSERT, SCHEMA, key, value, fast_expected=True)


@pytest.mark.parametrize(("key", "value"), [
    (None, {"id": 1}),  # no key
    (b"{oops", {"id": 1}),
    (1, {"id": 2}),  # the value's key differs
    (1, {"id": 1.0}),  # a float for an int column: the reference maps it
    (1.0, {"name": "x"}),
    (1, {"price": "1.5"}),  # numeric text for a float column: the reference maps it
    (1, {"price": "cheap"}),
    (1, {"active": 1}),
    (1, {"blob": "***"}),
    ("one", {"name": "x"}),
    (1, [1, 2]),
    (1, {"id": None}),
    (2**63, {}),
    (1, {"name": "x" * 600}),  # above the text column's share of the limit: the table measures it
    (1, b'{"price": 1e400}'),
    (1, b'{"name": "\\ud800"}'),
    (True, {}),
    (None, None),
    ([1], {}),
])
def test_upsert_anything_else_goes_the_reference_way(key: Any, value: Any) -> None:
    check(UPSERT, SCHEMA, key, value, fast_expected=False)


def test_upsert_composite_key() -> None:
    schema = RowSchema.of({"a": "int", "b": "string", "v": "int"}, ["a", "b"])
    check(UPSERT, schema, {"b": "x", "a": 1}, {"v": 5}, fast_expected=True)
    check(UPSERT, schema, {"b": "x", "a": 1}, {"v": 5, "a": 1, "b": "x"}, fast_expected=True)
    check(UPSERT, schema, 1, {"v": 5}, fast_expected=False)  # a bare key for two columns
    check(UPSERT, schema, {"b": "x", "a": 1}, {"b": "y"}, fast_expected=False)


def test_non_nullable_columns_are_required() -> None:
    schema = RowSchema((SCHEMA.columns[0], Column("name", ColumnType.STRING, False)), ("id",))
    check(UPSERT, schema, 1, {"name": "n"}, fast_expected=True)
    check(UPSERT, schema, 1, {}, fast_expected=False)
    check(UPSERT, schema, 1, {"name": None}, fast_expected=False)


def test_append_key_from_the_value_or_generated() -> None:
    check(APPEND, SCHEMA, "ignored", {"id": 5, "name": "e"}, fast_expected=True)
    check(APPEND, SCHEMA, None, {"name": "e"}, fast_expected=False)
    check(APPEND, SCHEMA, None, None, fast_expected=False)
    schema = RowSchema.of({"event_id": "string", "user": "string", "amount": "int"}, ["event_id"])
    generated = SourceSpec("t", SourceFormat.APPEND_JSON, "event_id")
    check(generated, schema, None, {"user": "u", "amount": 3}, fast_expected=True)
    check(generated, schema, None, {"user": "u", "amount": 3, "event_id": [1]}, fast_expected=True)  # overwritten
    fast = fast_decoder_for(generated, schema, TEXT_LIMIT)
    assert fast is not None
    assert fast(Record(None, raw({"user": "u"}), 2, 10)) == (("2-10",), {"event_id": "2-10", "user": "u",
                                                                         "amount": None})


def test_each_format_has_its_own_fast_path_or_none_without_text_room() -> None:
    assert fast_decoder_for(DEBEZIUM, SCHEMA, TEXT_LIMIT) is None  # (its own: fast_debezium_decoder_for)
    assert fast_debezium_decoder_for(UPSERT, SCHEMA, TEXT_LIMIT) is None
    assert fast_decoder_for(UPSERT, SCHEMA, 1) is None
    assert fast_debezium_decoder_for(DEBEZIUM, SCHEMA, 1) is None


def test_the_reference_names_what_the_fast_path_left() -> None:
    with pytest.raises(BadRecordError, match="differs from the message key"):
        decoder_for(UPSERT, SCHEMA)(SourceMessage("t", 1, 42, raw(1), raw({"id": 2})))


# --- debezium-json ----------------------------------------------------------------------------------------

DEBEZIUM = SourceSpec("t", SourceFormat.DEBEZIUM_JSON)
PG = {"version": "3.3.2.Final", "connector": "postgresql", "name": "db", "ts_ms": 1, "snapshot": "false",
      "db": "shop", "schema": "public", "table": "t", "txId": 771, "lsn": 24023128, "xmin": None}
ROW = {"id": 7, "name": "x", "price": 2, "active": False, "blob": B64}


def check_debezium(schema: RowSchema, key: Any, value: Any, *, fast_expected: bool) -> None:
    """As :func:`check`, for a Debezium envelope: the same key, normalized row and source position as the
    reference's one change; a message the fast path leaves is the reference's (whatever it maps it to)."""
    fast = fast_debezium_decoder_for(DEBEZIUM, schema, TEXT_LIMIT)
    assert fast is not None
    if (both := agree(fast, DEBEZIUM, schema, key, value, fast_expected=fast_expected)) is not None:
        got, reference = both
        assert got[2] == reference.position


def wrapped(envelope: Any) -> dict[str, Any]:
    """The JSON converter's form with schemas.enable=true (the schema's content is never read)."""
    return {"schema": {"type": "struct", "fields": [{"field": "op", "type": "string"}], "name": "env"},
            "payload": envelope}


@pytest.mark.parametrize("value", [
    {"op": "c", "before": None, "after": ROW, "source": PG, "ts_ms": 5},
    {"op": "r", "after": {**ROW, "price": 2.5, "blob": None}, "source": {**PG, "snapshot": "true"}},
    {"op": "r", "after": ROW, "source": {**PG, "snapshot": "last"}},
    {"op": "u", "before": {**ROW, "name": "old"}, "after": {**ROW, "name": "new"}, "source": PG},
    {"op": "u", "before": None, "after": ROW, "source": PG},  # REPLICA IDENTITY DEFAULT: no before
    {"op": "u", "before": {"name": "no key"}, "after": ROW, "source": PG},
    {"op": "u", "before": {"id": None}, "after": ROW, "source": PG},
    {"op": "d", "before": ROW, "after": None, "source": PG},
    {"op": "d", "before": {"id": 7}, "source": {**PG, "lsn": "24023999"}},  # lsn as text
    {"op": "c", "after": ROW, "source": {**PG, "lsn": True}},  # no position: applied as it comes
    {"op": "c", "after": ROW, "source": {**PG, "lsn": None}},
    {"op": "c", "after": ROW, "source": {**PG, "lsn": "not a number"}},
    {"op": "c", "after": ROW, "source": {"connector": "mysql", "file": "binlog.1", "pos": 4}},
    {"op": "c", "after": ROW, "source": {"connector": "postgresql", "lsn": 5}},  # snapshot absent: streamed
    {"op": "c", "after": ROW, "source": {"connector": "postgresql", "lsn": 5, "snapshot": None}},
    {"op": "c", "after": ROW, "source": None},
    {"op": "c", "after": ROW},
    {"op": "c", "after": {"id": 1, "unknown": {"nested": [1, 2]}}, "source": PG},  # nullable columns NULL
    wrapped({"op": "c", "after": ROW, "source": PG}),
    wrapped({"op": "d", "before": {"id": 3}, "source": PG}),
    {"op": "c", "after": ROW, "schema": "x", "payload": None},  # not the wrapper (three fields): the envelope
])
def test_debezium_plain_envelopes_agree_with_the_reference(value: Any) -> None:
    check_debezium(SCHEMA, {"id": 7}, value, fast_expected=True)


@pytest.mark.parametrize(("key", "value"), [
    ({"id": 7}, None),  # the tombstone after a delete: no change
    ({"id": 7}, {"op": "u", "before": {"id": 6}, "after": ROW, "source": PG}),  # the key changed: two changes
    ({"id": 7}, {"op": "d", "before": None, "source": PG}),  # keyed by the message key
    (None, {"op": "d", "source": PG}),  # no key at all
    ({"id": 7}, {"op": "d", "before": {"name": "x"}, "source": PG}),
    ({"id": 7}, {"op": "d", "before": {"id": None}, "source": PG}),
    ({"id": 7}, {"op": "d", "before": {"id": "7"}, "source": PG}),
    ({"id": 7}, {"op": "c", "after": None, "source": PG}),
    ({"id": 7}, {"op": "c", "source": PG}),
    ({"id": 7}, {"op": "c", "after": {"name": "no id"}, "source": PG}),
    ({"id": 7}, {"op": "c", "after": {**ROW, "id": 7.0}, "source": PG}),  # the reference maps it
    ({"id": 7}, {"op": "c", "after": {**ROW, "price": "2.50"}, "source": PG}),  # decimal.handling.mode=string
    ({"id": 7}, {"op": "c", "after": {**ROW, "blob": "***"}, "source": PG}),
    ({"id": 7}, {"op": "c", "after": {**ROW, "name": "x" * 600}, "source": PG}),  # the table measures it
    ({"id": 7}, {"op": "c", "after": [1, 2], "source": PG}),
    ({"id": 7}, {"op": "c", "after": ROW, "source": "postgresql"}),
    ({"id": 7}, {"op": "t", "source": PG}),
    ({"id": 7}, {"op": "x", "after": ROW}),
    ({"id": 7}, {"op": 1, "after": ROW}),
    ({"id": 7}, {"after": ROW}),
    ({"id": 7}, [1, 2]),
    ({"id": 7}, "text"),
    ({"id": 7}, b"{oops"),
    ({"id": 7}, b"null"),
    ({"id": 7}, wrapped(None)),  # a null payload: no change
    ({"id": 7}, wrapped(wrapped({"op": "c", "after": ROW}))),  # unwrapped once only, as the reference does
    ({"id": 7}, {"schema": {}, "payload": {"op": "c", "after": ROW}, "op": "c"}),  # not the wrapper: no after
])
def test_debezium_anything_else_goes_the_reference_way(key: Any, value: Any) -> None:
    check_debezium(SCHEMA, key, value, fast_expected=False)


def test_debezium_composite_key_and_required_columns() -> None:
    schema = RowSchema((Column("a", ColumnType.INT, False), Column("b", ColumnType.STRING, False),
                        Column("v", ColumnType.FLOAT, True)), ("a", "b"))
    after = {"a": 1, "b": "x", "v": 3}
    check_debezium(schema, None, {"op": "c", "after": after, "source": PG}, fast_expected=True)
    check_debezium(schema, None, {"op": "u", "before": {"a": 1, "b": "x"}, "after": after, "source": PG},
                   fast_expected=True)
    check_debezium(schema, None, {"op": "u", "before": {"a": 1}, "after": after, "source": PG}, fast_expected=True)
    check_debezium(schema, None, {"op": "u", "before": {"a": 1, "b": "y"}, "after": after, "source": PG},
                   fast_expected=False)
    check_debezium(schema, None, {"op": "d", "before": {"b": "x", "a": 1, "v": "any"}, "source": PG},
                   fast_expected=True)
    check_debezium(schema, None, {"op": "d", "before": {"a": 1}, "source": PG}, fast_expected=False)
    check_debezium(schema, None, {"op": "c", "after": {"a": 1, "v": 3}, "source": PG}, fast_expected=False)
    check_debezium(schema, None, {"op": "c", "after": {"a": 1, "b": None}, "source": PG}, fast_expected=False)


def test_debezium_messages_the_fast_path_leaves_keep_their_reference_errors() -> None:
    reference = decoder_for(DEBEZIUM, SCHEMA)
    for value, problem in [({"op": "t", "source": PG}, "truncate"), ({"op": "c", "source": PG}, "without an 'after'"),
                           ({"op": "d", "before": {"id": None}}, "missing or null in the before"),
                           ([1], "not a Debezium change event")]:
        with pytest.raises(BadRecordError, match=problem):
            reference(SourceMessage("t", 1, 42, raw({"id": 7}), raw(value)))
