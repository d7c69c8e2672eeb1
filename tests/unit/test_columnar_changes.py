"""Change batches, the one shape of change data: rows encoded column-wise, byte for byte as row by row;
a batch of changes encoded as the per-row encoders encode the same changes; the data source's signed
rows paired into changes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.changes import Change, Op
from mvlog.connectors.kafka.changelog_writer import change_values, encode_batch
from mvlog.key_order import order_member, order_members
from mvlog.row_schema import RowSchema
from mvlog.schemas.arrow_rows import encode_rows
from mvlog.schemas.codec import decode_key, encode_change_rows, encode_key, encode_row
from mvlog.views import plan_view
from mvlog.views.change_batch import ChangeBatch, consolidate_signed
from mvlog.views.errors import InconsistentChanges
from mvlog.vnode import vnode_of

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
VALUES = {
    "i": (pa.int64(), st.none() | INT64 | st.integers(-300, 300)),
    "f": (pa.float64(), st.none() | st.floats(allow_nan=False)),
    "s": (pa.string(), st.none() | st.text(max_size=80)),
    "b": (pa.bool_(), st.none() | st.booleans()),
    "raw": (pa.binary(), st.none() | st.binary(max_size=150)),
}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.fixed_dictionaries({name: values for name, (_, values) in VALUES.items()}), max_size=30),
       st.integers(0, 5))
def test_rows_encoded_column_wise_are_the_bytes_of_encode_row(rows, skip):
    columns = [(name, pa.array([row[name] for row in rows], kind)) for name, (kind, _) in VALUES.items()]
    expected = [encode_row({name: row[name] for name in VALUES}) for row in rows]  # in column order
    assert encode_rows(columns, len(rows)).to_pylist() == expected
    sliced = [(name, values.slice(skip)) for name, values in columns]  # arrays with an offset
    assert encode_rows(sliced, max(0, len(rows) - skip)).to_pylist() == expected[skip:]


@given(st.lists(INT64, max_size=30) | st.lists(st.text(max_size=20), max_size=30))
def test_one_column_keys_encoded_column_wise_are_the_bytes_of_encode_key(keys):
    assert encode_rows([("id", pa.array(keys))], len(keys)).to_pylist() == [encode_key(("id",), (k,)) for k in keys]
    assert order_members([(k,) for k in keys], [encode_key(("id",), (k,)) for k in keys]) == [
        order_member(vnode_of(encode_key(("id",), (k,))), (k,), encode_key(("id",), (k,))) for k in keys]


VIEW = RowSchema.of({"id": "int", "v": "int", "s": "string"}, ["id"])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("s", pa.string())])


def test_signed_rows_consolidate_into_one_change_per_key_and_encode_as_the_row_encoders_do() -> None:
    signed = [(-1, {"id": 1, "v": 1, "s": "a"}), (1, {"id": 1, "v": 2, "s": "a"}),  # update
              (1, {"id": 2, "v": 5, "s": None}),  # create
              (-1, {"id": 3, "v": 7, "s": "c"}),  # delete
              (-1, {"id": 4, "v": 8, "s": None}), (1, {"id": 4, "v": 8, "s": None})]  # no change
    batch = consolidate_signed(pa.Table.from_pylist([row for _, row in signed], ARROW), [w for w, _ in signed], VIEW)
    expected = [Change(Op.UPDATE, (1,), {"id": 1, "v": 1, "s": "a"}, {"id": 1, "v": 2, "s": "a"}),
                Change(Op.CREATE, (2,), None, {"id": 2, "v": 5, "s": None}),
                Change(Op.DELETE, (3,), {"id": 3, "v": 7, "s": "c"}, None)]
    assert batch.to_changes() == expected
    assert ChangeBatch.from_changes(VIEW, expected).to_changes() == expected
    encoded = encode_batch(["id"], batch)
    keys = [encode_key(("id",), c.key) for c in expected]
    assert encoded.row_puts == {k: encode_row(c.after) for k, c in zip(keys, expected, strict=True)
                                if c.after is not None}
    assert encoded.row_deletes == [k for k, c in zip(keys, expected, strict=True) if c.after is None]
    assert encoded.keys == keys and encoded.vnodes == [vnode_of(k) for k in keys]
    assert change_values("v", 7, encoded, 1234, "t-1") == [
        encode_change_rows("v", 7, vnode_of(k), c.op.value, None if c.before is None else encode_row(c.before),
                           None if c.after is None else encode_row(c.after), 1234, "t-1")
        for k, c in zip(keys, expected, strict=True)]
    reads = ChangeBatch.from_changes(VIEW, [Change(Op.READ, (9,), None, {"id": 9, "v": None, "s": "r"})])
    read = encode_batch(["id"], reads)  # a snapshot load's: op r, no row before
    after = encode_row({"id": 9, "v": None, "s": "r"})
    assert change_values("v", 7, read, 1, "t") == [encode_change_rows("v", 7, read.vnodes[0], "r", None, after, 1, "t")]
    empty = encode_batch(["id"], consolidate_signed(pa.Table.from_pylist([], ARROW), [], VIEW))
    assert (empty.keys, empty.row_puts, empty.row_deletes, change_values("v", 7, empty, 1, "")) == ([], {}, [], [])


def test_a_view_key_with_two_rows_of_one_sign_is_refused() -> None:
    signed = [(1, {"id": 1, "v": 1, "s": "a"}), (1, {"id": 1, "v": 2, "s": "a"})]
    with pytest.raises(InconsistentChanges, match="view key"):
        consolidate_signed(pa.Table.from_pylist([row for _, row in signed], ARROW), [w for w, _ in signed], VIEW)


def test_the_data_sources_signed_rows_pair_into_changes_and_one_change_per_key_is_told() -> None:
    rows = pa.Table.from_pylist([{"id": 1, "v": 1, "s": "a"}, {"id": 1, "v": 2, "s": "a"},  # update
                                 {"id": 2, "v": 5, "s": None},  # create
                                 {"id": 3, "v": 7, "s": "c"},  # delete
                                 {"id": 3, "v": 8, "s": "c"}], ARROW)  # create again: another change
    once = ChangeBatch.from_signed(VIEW, rows.slice(0, 4), pa.array([-1, 1, 1, -1]), pa.array([4, 4, 5, 6]))
    assert once.to_changes() == [Change(Op.UPDATE, (1,), {"id": 1, "v": 1, "s": "a"}, {"id": 1, "v": 2, "s": "a"}),
                                 Change(Op.CREATE, (2,), None, {"id": 2, "v": 5, "s": None}),
                                 Change(Op.DELETE, (3,), {"id": 3, "v": 7, "s": "c"}, None)]
    assert once.one_change_per_key() and once.keys == [(1,), (2,), (3,)]
    twice = ChangeBatch.from_signed(VIEW, rows, pa.array([-1, 1, 1, -1, 1]), pa.array([4, 4, 5, 6, 7]))
    assert not twice.one_change_per_key()
    signed, weights = once.signed()
    assert (signed.to_pylist(), weights.to_pylist()) == (rows.slice(0, 4).to_pylist(), [-1, 1, 1, -1])
    assert len(ChangeBatch.from_signed(VIEW, rows.slice(0, 0), pa.array([], pa.int32()), pa.array([]))) == 0
    kept = once.where([True, False, True])  # a backfilling view's rebuild keeps the covered keys only
    assert kept.to_changes() == [once.to_changes()[0], once.to_changes()[2]] and kept.keys == [(1,), (3,)]
    assert len(ChangeBatch.from_signed(VIEW, rows, pa.array([-1, 1, 1, -1, 1]), pa.array([4, 4, 5, 6, 7]))
               .where([False] * 4)) == 0


def test_outer_join_keys_with_null_components_round_trip_through_the_key_codec() -> None:
    """A null-extended row's key has NULL components (and a presence column NULL or TRUE): they are
    encoded as the Avro key map's null branch, distinct from every value, and decode back to None."""
    t1 = RowSchema.of({"id": "int", "v": "int"}, ["id"])
    grouped = plan_view("g", "SELECT v, count(*) AS n FROM t1 GROUP BY v", {"t1": t1})
    plan = plan_view("j", "SELECT a.id, g.n FROM t1 a LEFT JOIN g ON a.v = g.v", {"t1": t1, "g": grouped.schema})
    columns = plan.schema.primary_key
    assert columns == ("id", "v", "g_present")
    rows: list[dict[str, Any]] = [{"id": 1, "n": None, "v": None, "g_present": None},  # null-extended
            {"id": 2, "n": 3, "v": None, "g_present": True},  # the key of a row with NULL in its key column
            {"id": 3, "n": 1, "v": 0, "g_present": True}]
    batch = ChangeBatch.from_changes(plan.schema, [Change(Op.CREATE, plan.schema.key_of(r), None, r) for r in rows])
    encoded = encode_batch(columns, batch)
    assert encoded.keys == [encode_key(columns, plan.schema.key_of(r)) for r in rows]
    assert len(set(encoded.keys)) == 3
    assert [decode_key(columns, k) for k in encoded.keys] == [(1, None, None), (2, None, True), (3, 0, True)]
