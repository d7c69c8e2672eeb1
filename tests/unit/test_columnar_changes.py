"""The Spark consumer's columnar output: rows encoded column-wise, byte for byte as row by row, and a
batch of changes encoded as encode_epoch encodes the same changes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.changes import Change, Op
from mvlog.connectors.changelog_writer import change_values, encode_batch, encode_epoch
from mvlog.key_order import order_member, order_members
from mvlog.row_schema import RowSchema
from mvlog.schemas.arrow_rows import encode_rows
from mvlog.schemas.codec import encode_change_rows, encode_key, encode_row
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


def test_signed_rows_consolidate_into_one_change_per_key_and_encode_as_encode_epoch_does() -> None:
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
    encoded, by_rows = encode_batch(["id"], batch), encode_epoch(["id"], expected)
    assert (encoded.row_puts, encoded.row_deletes) == (by_rows.row_puts, by_rows.row_deletes)
    assert encoded.keys == [c.key for c in by_rows.changes]
    assert encoded.vnodes == [vnode_of(c.key) for c in by_rows.changes]
    assert change_values("v", 7, encoded, 1234, "t-1") == [
        encode_change_rows("v", 7, vnode_of(c.key), c.op, c.before, c.after, 1234, "t-1") for c in by_rows.changes]
    empty = encode_batch(["id"], consolidate_signed(pa.Table.from_pylist([], ARROW), [], VIEW))
    assert (empty.keys, empty.row_puts, empty.row_deletes, change_values("v", 7, empty, 1, "")) == ([], {}, [], [])


def test_a_view_key_with_two_rows_of_one_sign_is_refused() -> None:
    signed = [(1, {"id": 1, "v": 1, "s": "a"}), (1, {"id": 1, "v": 2, "s": "a"})]
    with pytest.raises(InconsistentChanges, match="view key"):
        consolidate_signed(pa.Table.from_pylist([row for _, row in signed], ARROW), [w for w, _ in signed], VIEW)
