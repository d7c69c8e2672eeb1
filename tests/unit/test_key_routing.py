"""A stateless view that passes its upstream's key through under other names (``SELECT id AS order_id``)
or over another partition count, in Spark's tasks (issue 19 item 2): which views take the shuffle by
their own key, and that one operator per view partition, over the input rows :class:`KeyRouting` sends
it, writes exactly the changes the changelog writer puts in that partition, and together the single
operator's. No broker, no Spark: the shuffle runs in ``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

from itertools import accumulate

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.changes import Change, Op, apply_changes
from mvlog.connectors.kafka.changelog_writer import encode_batch
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.schemas.arrow_rows import encode_rows
from mvlog.views import ChangeBatch, ViewOperator, plan_view
from mvlog.views.key_routing import KeyRouting
from mvlog.views.partitioning import passes_key_through, stateless_key_preserving
from mvlog.views.state import InMemoryState
from mvlog.vnode import partition_of_vnode, vnode_of

T = RowSchema.of({"id": "int", "v": "int", "s": "string"}, ["id"])
T2 = RowSchema.of({"a": "int", "b": "string", "v": "int"}, ["a", "b"])  # a composite key
SCHEMAS = {"t": T, "t2": T2}


def test_a_changelog_keys_bytes_and_vnode_depend_on_the_key_columns_names() -> None:
    """Why a renamed key needs a shuffle: the key is an Avro map, name -> value."""
    values = pa.array(range(32), pa.int64())
    as_id = encode_rows([("id", values)], 32).to_pylist()
    as_order_id = encode_rows([("order_id", values)], 32).to_pylist()
    assert [vnode_of(k) for k in as_id] != [vnode_of(k) for k in as_order_id]


@pytest.mark.parametrize(("sql", "key", "through", "same_names"), [
    ("SELECT id AS order_id, v FROM t WHERE v > 0", ["id"], True, False),
    ("SELECT v, id AS k FROM t", ["id"], True, False),  # another position in the SELECT list: fine
    ("SELECT * FROM t WHERE v > 0", ["id"], True, True),
    ("SELECT b AS bb, a AS aa, v FROM t2", ["a", "b"], True, False),  # the key's order is the upstream's
    # ``id`` is taken by another value: the key is a hidden copy of the upstream's, named ``_id``
    ("SELECT id + 0 AS id, v FROM t", ["id"], True, False),
    ("SELECT v AS id, s FROM t", ["id"], True, False),
    ("SELECT id AS k, id AS k2, v FROM t", ["id"], True, False),  # the first copy is the key
    ("SELECT v, count(*) AS n FROM t GROUP BY v", ["id"], False, False),
    ("SELECT id AS k, v FROM t", ["v"], False, False),  # not the upstream's key (a wrong caller)
    ("SELECT a, v FROM t2", ["a"], False, False),  # part of it
])
def test_which_views_pass_their_upstreams_key_through(sql: str, key: list[str], through: bool,
                                                      same_names: bool) -> None:
    plan = plan_view("v", sql, SCHEMAS)
    assert passes_key_through(plan, key) is through
    assert stateless_key_preserving(plan, key) is same_names
    if not through:
        with pytest.raises(ValueError, match="does not pass its upstream's key through"):
            KeyRouting(plan, tuple(key), 4)


rows_of_t = st.builds(lambda v, s: {"v": v, "s": s}, st.integers(-2, 2), st.sampled_from(["x", None]))
ops = st.lists(st.tuples(st.integers(0, 40), st.one_of(st.none(), rows_of_t)), max_size=30)


@pytest.mark.parametrize(("sql", "partitions"), [
    ("SELECT id AS order_id, v FROM t WHERE v > 0", 3),  # renamed
    ("SELECT s, id AS k, v * 2 AS w FROM t", 4),  # renamed, not first in the SELECT list
    ("SELECT * FROM t WHERE v <> 0", 2),  # the same names over another partition count than the upstream's
    ("SELECT id AS order_id, s FROM t", 5),
    ("SELECT id + 1 AS id, v FROM t", 3),  # a hidden copy of the key, ``_id``
])
@settings(max_examples=30, deadline=None)
@given(epochs=st.lists(ops, min_size=1, max_size=4))
def test_each_partitions_operator_over_its_routed_rows_writes_that_partitions_changes(
        sql: str, partitions: int,
        epochs: list[list[tuple[int, Row | None]]]) -> None:
    """Inserts, updates (before and after go to one partition: the same key) and deletes; every change a
    partition's operator makes is placed in that partition by the changelog writer, and the partitions'
    changes summed are the single operator's. The upstream's partition count plays no part: each row
    goes by the view key it will have."""
    plan = plan_view("v", sql, {"t": T})
    routing = KeyRouting(plan, ("id",), partitions)
    operator = ViewOperator(plan)
    rows: dict[int, Row] = {}
    whole: dict[Key, Row] = {}
    split: dict[Key, Row] = {}
    for epoch_ops in epochs:
        changes: list[Change] = []
        for i, value in {i: value for i, value in reversed(epoch_ops)}.items():  # a change per key
            old, new = rows.get(i), None if value is None else {"id": i, **value}
            if old is None and new is None:
                continue
            changes.append(Change(Op.CREATE if old is None else Op.DELETE if new is None else Op.UPDATE,
                                  (i,), old, new))
            rows.pop(i) if new is None else rows.__setitem__(i, new)
        batch = ChangeBatch.from_changes(T, changes)
        whole = apply_changes(whole, operator.apply_epoch({"t": batch}, InMemoryState()).changes.to_changes())
        signed, weights = batch.signed()
        signs = weights.to_pylist()  # a change's signed rows are adjacent: -1 then +1
        ids = pa.array(list(accumulate(int(w < 0 or prev > 0) for w, prev in zip(signs, [1, *signs], strict=False))),
                       pa.int64())
        owners = routing.partitions_of(signed).to_pylist()
        for p in range(partitions):
            mask = pa.array([o == p for o in owners], pa.bool_())
            mine = ChangeBatch.from_signed(T, signed.filter(mask), weights.filter(mask), ids.filter(mask))
            output = operator.apply_epoch({"t": mine}, InMemoryState())
            assert not output.state_writes
            out = output.changes
            encoded = encode_batch(plan.schema.primary_key, out)
            assert {partition_of_vnode(v, partitions) for v in encoded.vnodes} <= {p}
            split = apply_changes(split, out.to_changes())
        assert split == whole
