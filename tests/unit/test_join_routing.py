"""The pure parts of a two-view inner join's operator in Spark's tasks (issue 19, item 2, joins): which
views take it, which join-key partition each input row and state key belongs to, that one operator per
join-key partition followed by a consolidation per view partition gives the single operator's changes,
each in the partition the changelog writer puts it in, and what the first shuffle's ``mapInArrow``
makes of the data source's rows. No broker, no Spark: the shuffles themselves run in
``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

import random
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op, apply_changes
from mvlog.connectors.kafka.changelog_writer import encode_batch
from mvlog.connectors.spark.change_rows import BARRIER, SignedRowBuilder
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.services.pipeline.join_tasks import SIDE, RouteJoinRows, shuffled_schema, side_column
from mvlog.services.pipeline.partition_tasks import ROUTE_TOKEN, VIEW_PARTITION
from mvlog.views import ChangeBatch, ViewOperator, plan_view
from mvlog.views.change_batch import consolidate_signed
from mvlog.views.join_routing import JoinRouting, two_view_inner_join
from mvlog.views.routing import partitions_table, view_key_partitions
from mvlog.views.state import InMemoryState
from mvlog.vnode import partition_of_vnode

A = RowSchema.of({"id": "int", "k": "int", "x": "float", "s": "string"}, ["id"])
B = RowSchema.of({"bid": "int", "k2": "float", "w": "int"}, ["bid"])
JOIN = "SELECT a.id, b.bid, a.s, b.w, a.x + b.w AS t FROM a JOIN b ON a.k = b.k2"


@pytest.mark.parametrize(("sql", "taken"), [
    (JOIN, True),
    ("SELECT a.s, b.w FROM a JOIN b ON a.k = b.k2 AND a.id > b.w WHERE b.w > 0", True),  # residual, WHERE
    ("SELECT a.s, b.w FROM a LEFT JOIN b ON a.k = b.k2", False),  # outer: not this path (yet)
    ("SELECT a.s, count(*) AS n FROM a JOIN b ON a.k = b.k2 GROUP BY a.s", False),  # an aggregate over it
    ("SELECT x.id, y.id AS id2 FROM a x JOIN a y ON x.k = y.k", False),  # a self-join: one upstream
    ("SELECT * FROM a WHERE k > 0", False),
])
def test_which_views_the_join_routing_takes(sql: str, taken: bool) -> None:
    assert two_view_inner_join(plan_view("v", sql, {"a": A, "b": B})) is taken


def _a(rng: random.Random, i: int) -> Row:
    return {"id": i, "k": rng.choice([0, 1, 2, 3, None]), "x": rng.choice([0.5, -0.0, None]), "s": f"s{i % 3}"}


def _b(rng: random.Random, i: int) -> Row:
    return {"bid": i, "k2": rng.choice([0.0, -0.0, 1.0, 2.0, 5.0, None]), "w": rng.randrange(-3, 4)}


def _changes(rng: random.Random, rows: dict[int, Row], ids: int,
             make: Callable[[random.Random, int], Row]) -> list[Change]:
    """Inserts, updates (some moving the row to another join key) and deletes, one per key."""
    out = []
    for i in rng.sample(range(ids), ids // 2):
        old, new = rows.get(i), None if rng.random() < 0.35 else make(rng, i)
        if old is None and new is None:
            continue
        out.append(Change(Op.CREATE if old is None else Op.DELETE if new is None else Op.UPDATE, (i,), old, new))
    for change in out:
        if change.after is None:
            rows.pop(change.key[0])
        else:
            rows[change.key[0]] = change.after
    return out


def _split(batch: ChangeBatch, owners: list[int], partition: int) -> ChangeBatch:
    """The changes of ``batch`` whose signed rows the routing sends to ``partition``, as the data source's
    signed rows after the shuffle."""
    rows, weights = batch.signed()
    change_of = []  # signed row -> its change's position (a change's rows are adjacent: -1 then +1)
    position = -1
    for weight, prev in zip(weights.to_pylist(), [1, *weights.to_pylist()[:-1]], strict=True):
        position += 1 if weight < 0 or prev > 0 else 0
        change_of.append(position)
    mask = pa.array([o == partition for o in owners])
    return ChangeBatch.from_signed(batch.schema, rows.filter(mask), weights.filter(mask),
                                   pa.array(change_of, pa.int64()).filter(mask))


@pytest.mark.parametrize("sql", [JOIN, "SELECT a.s, b.w FROM a JOIN b ON a.k = b.k2 AND a.id > b.w WHERE b.w > 0"])
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_join_keys_computed_apart_then_consolidated_per_view_partition_give_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """Stage 1: one operator per join-key partition, over its own rows of both sides and its own state,
    every state key it writes its own. Stage 2: their signed output rows routed by the view key's
    partition (where the changelog writer puts them) and consolidated per view partition. The view
    summed over the epochs is the single operator's, epoch by epoch, and so is the union of the state."""
    plan = plan_view("v", sql, {"a": A, "b": B})
    routing = JoinRouting(plan, partitions)
    operator = ViewOperator(plan)
    whole, parts = InMemoryState(), [InMemoryState() for _ in range(partitions)]
    of_vnode = partitions_table(partitions)
    rng = random.Random(partitions * 31 + len(sql))
    rows_a: dict[int, Row] = {}
    rows_b: dict[int, Row] = {}
    view: dict[Key, Row] = {}
    split_view: dict[Key, Row] = {}
    emptied = 0
    for _ in range(8):
        inputs = {"a": ChangeBatch.from_changes(A, _changes(rng, rows_a, 24, _a)),
                  "b": ChangeBatch.from_changes(B, _changes(rng, rows_b, 24, _b))}
        output = operator.apply_epoch(inputs, whole)
        whole.apply(output.state_writes)
        emptied += sum(value is None for value in output.state_writes.values())
        view = apply_changes(view, output.changes.to_changes())
        signed: list[pa.Table] = []
        for j in range(partitions):
            mine = {}
            for side, name in enumerate(("a", "b")):
                owners = routing.partitions_of(side, inputs[name].signed()[0]).to_pylist()
                mine[name] = _split(inputs[name], owners, j)
            out = operator.apply_epoch(mine, parts[j])
            parts[j].apply(out.state_writes)
            assert set(routing.partitions_of_state_keys(list(out.state_writes))) <= {j}
            rows, weights = out.changes.signed()
            signed.append(rows.append_column("_weight", weights))
        everything = pa.concat_tables(signed)
        targets = view_key_partitions(plan.schema, everything, of_vnode).to_pylist()
        for p in range(partitions):
            mine_rows = everything.filter(pa.array([t == p for t in targets]))
            changes = consolidate_signed(mine_rows.select(list(plan.schema.names)),
                                         mine_rows.column("_weight").to_pylist(), plan.schema)
            encoded = encode_batch(plan.schema.primary_key, changes)
            assert {partition_of_vnode(v, partitions) for v in encoded.vnodes} <= {p}
            split_view = apply_changes(split_view, changes.to_changes())
        assert split_view == view
        merged: dict[bytes, bytes] = {}
        for j, state in enumerate(parts):
            assert not set(state.data) & set(merged)
            assert set(routing.partitions_of_state_keys(list(state.data))) <= {j}
            merged.update(state.data)
        assert merged == whole.data
    assert emptied > 0, "no bucket emptied: its delete went untested"


def test_equal_join_keys_of_both_sides_go_to_one_partition_and_null_keys_to_partition_0() -> None:
    routing = JoinRouting(plan_view("v", JOIN, {"a": A, "b": B}), 16)
    left = pa.table({"k": pa.array([3, 0, None, 7], pa.int64())})
    right = pa.table({"k2": pa.array([3.0, -0.0, 1.0, 7.0], pa.float64())})  # compared as float; -0.0 = 0.0
    a, b = routing.partitions_of(0, left).to_pylist(), routing.partitions_of(1, right).to_pylist()
    assert a[0] == b[0] and a[1] == b[1] and a[3] == b[3]
    assert a[2] == 0
    assert len(set(routing.partitions_of(0, pa.table({"k": pa.array(range(64), pa.int64())})).to_pylist())) > 8
    assert routing.partitions_of_state_keys([b"j0[3.0]", b"j1[3.0]"]) == [a[0], a[0]]
    with pytest.raises(ValueError, match="not a join bucket"):
        routing.partitions_of_state_keys([b"g[3.0]"])
    with pytest.raises(ValueError, match="not a two-view inner equi-join"):
        JoinRouting(plan_view("v", "SELECT a.s FROM a LEFT JOIN b ON a.k = b.k2", {"a": A, "b": B}), 4)


def test_route_join_rows_puts_a_side_in_the_shared_layout_and_every_barrier_in_every_partition() -> None:
    plan = plan_view("v", JOIN, {"a": A, "b": B})
    routing = JoinRouting(plan, 3)
    upstreams = [_entry("a", A), _entry("b", B)]
    schema = shuffled_schema(upstreams)
    builder = SignedRowBuilder(B, 2)
    row: Row = {"bid": 1, "k2": 1.0, "w": 4}
    builder.add_images(7, 10, b"k1", row, {**row, "k2": 2.0})  # moves to another join key
    builder.add_barrier(7, 11)
    builder.add_barrier(9, 12)
    out = pa.Table.from_batches(list(RouteJoinRows(routing, 1, schema).run(iter([builder.flush()]))))
    assert out.schema == schema
    assert set(out.column(SIDE).to_pylist()) == {1}
    changes = out.filter(pc.not_equal(out.column("_change_type"), BARRIER))
    owners = routing.partitions_of(1, pa.table({"k2": [1.0, 2.0]})).to_pylist()
    assert changes.column(VIEW_PARTITION).to_pylist() == owners
    assert changes.column(side_column(1, "w")).to_pylist() == [4, 4]
    assert changes.column(side_column(0, "s")).null_count == 2  # the other side's columns are null
    tokens = partition_tokens(3)
    assert out.column(ROUTE_TOKEN).to_pylist() == [tokens[p] for p in out.column(VIEW_PARTITION).to_pylist()]
    barriers = out.filter(pc.equal(out.column("_change_type"), BARRIER))
    assert sorted(zip(barriers.column("_epoch").to_pylist(), barriers.column(VIEW_PARTITION).to_pylist(),
                      strict=True)) == [(e, p) for e in (7, 9) for p in range(3)]


def _entry(name: str, schema: RowSchema) -> CatalogEntry:
    return CatalogEntry(name=name, kind="table", schema=schema, partitions=3)
