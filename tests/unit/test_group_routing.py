"""The pure parts of a GROUP BY view's operator in Spark's tasks (issue 19, item 2): which rows each view
partition's task gets (the partition of the group a row falls in), that a partition's operator state
keys are its own, that Spark's hash partitioning sends each routing token to its partition, what the
routing ``mapInArrow`` makes of the data source's rows, and the state a task layers its epochs' writes
on. No broker, no Spark: the shuffle itself runs in ``tests/integration/test_operators_in_tasks.py`` on a
local-cluster."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mvlog.changes import Change, Op, apply_changes
from mvlog.connectors.kafka.changelog_writer import encode_batch
from mvlog.connectors.spark.change_rows import BARRIER, SignedRowBuilder
from mvlog.connectors.spark.hash_partitioning import murmur3_hash_int, partition_tokens, spark_partition_of_int
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.services.pipeline.partition_tasks import ROUTE_TOKEN, VIEW_PARTITION, RouteRows, own_partition
from mvlog.views import ChangeBatch, ViewOperator, plan_view
from mvlog.views.routing import GroupRouting, grouped_by_key
from mvlog.views.state import InMemoryState, LayeredState
from mvlog.vnode import partition_of_vnode

T1 = RowSchema.of({"id": "int", "g": "string", "x": "float", "v": "int", "ok": "boolean"}, ["id"])
T2 = RowSchema.of({"id": "int", "w": "int"}, ["id"])
TOP_N = "SELECT id, g FROM (SELECT id, g, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v) AS rn FROM t1) s WHERE rn <= 2"


# Spark 4's own figures (``SELECT hash(CAST(i AS INT))`` for i in -3..11, and the partition
# ``repartition(4, col)`` gave each i in 0..11), read once from a local session.
SPARK_HASHES = [-1573329414, -1160545675, -1604776387, 933211791, -559580957, 1765031574, -1823081949,
                -397064898, 1023896466, -331964951, 1079293707, -132918897, -1731921111, -1401210078, 944065163]
SPARK_REPARTITION_4 = [3, 3, 2, 3, 2, 2, 1, 3, 3, 1, 2, 3]


def test_murmur3_is_sparks_hash_and_the_tokens_route_to_their_partitions() -> None:
    assert [murmur3_hash_int(i) for i in range(-3, 12)] == SPARK_HASHES
    assert [spark_partition_of_int(i, 4) for i in range(12)] == SPARK_REPARTITION_4
    for partitions in (1, 3, 4, 16):
        tokens = partition_tokens(partitions)
        assert [spark_partition_of_int(t, partitions) for t in tokens] == list(range(partitions))
    with pytest.raises(ValueError):
        partition_tokens(0)


@pytest.mark.parametrize(("sql", "routed"), [
    ("SELECT g, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi, avg(v) AS a FROM t1 WHERE ok GROUP BY g",
     True),
    ("SELECT g, x, count(*) AS n FROM t1 GROUP BY g, x", True),
    ("SELECT count(*) AS n FROM t1 GROUP BY v % 3", True),  # the key is a hidden column
    ("SELECT DISTINCT g FROM t1", True),
    ("SELECT count(*) AS n FROM t1", True),  # global: every row to its one row's partition
    ("SELECT count(*) AS n FROM t1 GROUP BY window(v, '10 seconds')", True),  # to its windows' partitions
    (TOP_N, False),  # per PARTITION BY group, rows keyed by the source's key
    ("SELECT * FROM t1 WHERE v > 0", False),  # no state: the no-shuffle path
    ("SELECT t1.g, count(*) AS n FROM t1 JOIN t2 ON t1.v = t2.id GROUP BY t1.g", False),
    ("SELECT g, n FROM (SELECT g, count(*) AS n FROM t1 GROUP BY g) s", False),  # a subquery's state
])
def test_which_views_the_group_routing_takes(sql: str, routed: bool) -> None:
    assert grouped_by_key(plan_view("v", sql, {"t1": T1, "t2": T2})) is routed


def _rows(rng: random.Random, ids: int) -> dict[int, Row]:
    return {i: _row(rng, i) for i in rng.sample(range(ids), ids // 2)}


def _row(rng: random.Random, i: int) -> Row:
    return {"id": i, "g": rng.choice(["a", "b", "c", "dé", None]), "x": rng.choice([0.0, -0.0, 1.5, None]),
            "v": rng.choice([-3, 0, 2, 7, None]), "ok": rng.random() < 0.8}


def _epoch_changes(rng: random.Random, rows: dict[int, Row], ids: int) -> list[Change]:
    """Inserts, updates (some moving the row to another group) and deletes, one per key."""
    changes = []
    for i in rng.sample(range(ids), ids // 3):
        old, new = rows.get(i), None if rng.random() < 0.3 else _row(rng, i)
        if old is None and new is None:
            continue
        op = Op.CREATE if old is None else Op.DELETE if new is None else Op.UPDATE
        changes.append(Change(op, (i,), old, new))
    for change in changes:
        if change.after is None:
            rows.pop(change.key[0])
        else:
            rows[change.key[0]] = change.after
    return changes


def _signed(changes: list[Change]) -> tuple[pa.Table, pa.Array, pa.Array]:
    """The data source's shape: per change its -1 and +1 rows, with a change id each."""
    rows, weights, ids = [], [], []
    for position, change in enumerate(changes):
        for weight, row in change.signed_rows():
            rows.append(row)
            weights.append(weight)
            ids.append(position)
    table = pa.Table.from_pylist(rows, pa.schema([("id", pa.int64()), ("g", pa.string()), ("x", pa.float64()),
                                                  ("v", pa.int64()), ("ok", pa.bool_())]))
    return table, pa.array(weights, pa.int32()), pa.array(ids, pa.int64())


@pytest.mark.parametrize("sql", [
    "SELECT g, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi, avg(v) AS a FROM t1 WHERE ok GROUP BY g",
    "SELECT g, x, count(v) AS n, max(x) AS top FROM t1 GROUP BY g, x HAVING count(*) > 1",
    "SELECT count(*) AS n, min(g) AS first FROM t1 GROUP BY v % 3",
    "SELECT count(*) AS n, sum(v) AS s, min(g) AS first, avg(x) AS a FROM t1 WHERE ok",  # global: one partition
    # Windows over ``v`` as the time (ms): tumbling (a row in one window), hopping (in four, maybe in as
    # many partitions: the row goes to each, whose operator keeps its own windows).
    "SELECT count(*) AS n, max(g) AS top FROM t1 GROUP BY window(v, '3 milliseconds')",
    "SELECT window.start, g, count(*) AS n, sum(x) AS s FROM t1 WHERE ok "
    "GROUP BY window(v, '4 milliseconds', '1 millisecond'), g",
    # Over a filter/project subquery: the groups read off the subquery's rows, the rows its WHERE drops
    # (or turns NULL) sent nowhere; a WITH query the same, a global aggregate too.
    "SELECT b, count(*) AS n, sum(x) AS s, max(g) AS top FROM (SELECT v % 3 AS b, x, g FROM t1 WHERE ok) s "
    "GROUP BY b HAVING count(*) > 0",
    "WITH s AS (SELECT g, x * 2 AS y FROM t1 WHERE x > 0) SELECT g, count(*) AS n, min(y) AS lo FROM s GROUP BY g",
    "SELECT count(*) AS n, sum(y) AS t FROM (SELECT id, v + 1 AS y FROM t1 WHERE NOT ok) q",
])
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_partitions_computed_apart_give_the_whole_view_each_change_in_its_partition(sql: str,
                                                                                     partitions: int) -> None:
    """Routed rows, one operator per partition over several epochs with its own state: the changes each
    land in their task's partition, their union is the single operator's, and the state keys of the
    partitions are disjoint, each owned by the partition that wrote it."""
    plan = plan_view("v", sql, {"t1": T1})
    routing = GroupRouting(plan, partitions)
    operator = ViewOperator(plan)
    whole = InMemoryState()
    parts = [InMemoryState() for _ in range(partitions)]
    rng = random.Random(partitions * 1000 + len(sql))
    upstream: dict[int, Row] = {}
    view: dict[Key, Row] = {}
    split_view: dict[Key, Row] = {}
    for _ in range(6):
        changes = _epoch_changes(rng, upstream, 60)
        output = operator.apply_epoch({"t1": ChangeBatch.from_changes(T1, changes)}, whole)
        whole.apply(output.state_writes)
        view = apply_changes(view, output.changes.to_changes())
        rows, weights, ids = _signed(changes)
        indices, routed = (column.to_pylist() for column in routing.fan_out(rows))
        if plan.query.window is None and not plan.inner:
            assert indices == list(range(rows.num_rows)) and routed == routing.partitions_of(rows).to_pylist()
        else:
            assert len(set(zip(indices, routed, strict=True))) == len(indices), "a row twice in one partition"
        for p in range(partitions):  # a global aggregate's other partitions: no row, and no change
            mine = pa.array([i for i, r in zip(indices, routed, strict=True) if r == p], pa.int64())
            batch = ChangeBatch.from_signed(T1, rows.take(mine), weights.take(mine), ids.take(mine))
            out = ViewOperator(plan, share=routing.share(p)).apply_epoch({"t1": batch}, parts[p])
            parts[p].apply(out.state_writes)
            encoded = encode_batch(plan.schema.primary_key, out.changes)
            assert {partition_of_vnode(v, partitions) for v in encoded.vnodes} <= {p}
            assert set(routing.partitions_of_state_keys(list(out.state_writes))) <= {p}
            split_view = apply_changes(split_view, out.changes.to_changes())
        assert split_view == view
        merged: dict[bytes, bytes] = {}
        for p, state in enumerate(parts):
            assert not set(state.data) & set(merged), "two partitions hold state of one group"
            assert set(routing.partitions_of_state_keys(list(state.data))) <= {p}
            merged.update(state.data)
        assert merged == whole.data


def test_a_row_moving_to_another_group_is_retracted_in_one_partition_and_asserted_in_the_other() -> None:
    plan = plan_view("v", "SELECT g, count(*) AS n FROM t1 GROUP BY g", {"t1": T1})
    routing = GroupRouting(plan, 4)
    groups = [f"k{i}" for i in range(40)]
    owners = routing.partitions_of_groups([[g] for g in groups])
    a = groups[0]
    b = next(g for g, p in zip(groups, owners, strict=True) if p != owners[0])
    before: dict[str, Any] = {"id": 1, "g": a, "x": None, "v": 1, "ok": True}
    rows, _, _ = _signed([Change(Op.UPDATE, (1,), before, {**before, "g": b})])
    assert routing.partitions_of(rows).to_pylist() == [owners[0], owners[groups.index(b)]]


def test_state_keys_of_another_shape_are_refused() -> None:
    routing = GroupRouting(plan_view("v", "SELECT g, count(*) AS n FROM t1 GROUP BY g", {"t1": T1}), 4)
    with pytest.raises(ValueError, match="not a group's state key"):
        routing.partitions_of_state_keys([b"j0[1]"])
    with pytest.raises(ValueError, match="not a GROUP BY"):
        GroupRouting(plan_view("v", TOP_N, {"t1": T1}), 4)


def test_a_global_aggregate_is_computed_by_its_one_rows_partition_only() -> None:
    """Its one row has the empty key: every input row goes to that key's partition, the only one whose
    operator maintains the row (the others' would emit it too, over no input, unless told they do not)."""
    plan = plan_view("v", "SELECT count(*) AS n FROM t1", {"t1": T1})
    for partitions in (1, 3, 4):
        routing = GroupRouting(plan, partitions)
        owner = partition_of_vnode(encode_batch((), ChangeBatch.from_changes(
            plan.schema, [Change(Op.CREATE, (), None, {"n": 0})])).vnodes[0], partitions)
        assert [p for p in range(partitions) if routing.share(p).global_row] == [owner]
        rows, _, _ = _signed([Change(Op.CREATE, (i,), None, {"id": i, "g": "a", "x": None, "v": i, "ok": True})
                              for i in range(20)])
        assert set(routing.partitions_of(rows).to_pylist()) == {owner}
        assert routing.partitions_of_state_keys(list(ViewOperator(plan).apply_epoch(
            {"t1": ChangeBatch.empty(T1)}, InMemoryState()).state_writes)) == [owner]
        for other in (p for p in range(partitions) if p != owner):  # no row over no input, and no rows
            operator = ViewOperator(plan, share=routing.share(other))
            output = operator.apply_epoch({"t1": ChangeBatch.empty(T1)}, InMemoryState())
            assert not output.changes.to_changes() and not output.state_writes
            with pytest.raises(ValueError, match="belong to the row's partition"):
                operator.apply_epoch({"t1": ChangeBatch.from_signed(T1, *_signed(
                    [Change(Op.CREATE, (1,), None, {"id": 1, "g": "a", "x": None, "v": 1, "ok": True})]))},
                    InMemoryState())


def test_layered_state_reads_its_own_writes_and_deletes_over_the_base() -> None:
    base = InMemoryState({b"a": b"1", b"b": b"2"})
    layered = LayeredState(base)
    layered.apply({b"a": b"10", b"c": b"3"})
    layered.apply({b"b": None})
    assert layered.get_many([b"a", b"b", b"c", b"d"]) == {b"a": b"10", b"c": b"3"}
    assert base.data == {b"a": b"1", b"b": b"2"}  # the committed state is never written


def test_route_rows_sends_changes_to_their_groups_and_every_barrier_to_every_partition() -> None:
    """The ``mapInArrow`` before the shuffle, on the data source's signed rows: a change row gets its
    group's partition and that partition's token; each barrier row is copied to every partition."""
    plan = plan_view("v", "SELECT g, count(*) AS n FROM t1 GROUP BY g", {"t1": T1})
    routing = GroupRouting(plan, 3)
    builder = SignedRowBuilder(T1, 1)
    row: Row = {"id": 1, "g": "a", "x": None, "v": 1, "ok": True}
    builder.add_images(7, 10, b"k1", row, {**row, "g": "zz"})  # moves to another group
    builder.add_images(7, 11, b"k2", None, {**row, "id": 2, "g": "b"})
    builder.add_barrier(7, 12)
    builder.add_barrier(8, 13)  # an epoch with no change in this upstream partition
    out = pa.Table.from_batches(list(RouteRows(routing).run(iter([builder.flush()]))))
    changes = out.filter(pc.not_equal(out.column("_change_type"), BARRIER))
    assert changes.column(VIEW_PARTITION).to_pylist() == routing.partitions_of_groups([["a"], ["zz"], ["b"]])
    tokens = partition_tokens(3)
    assert out.column(ROUTE_TOKEN).to_pylist() == [tokens[p] for p in out.column(VIEW_PARTITION).to_pylist()]
    barriers = out.filter(pc.equal(out.column("_change_type"), BARRIER))
    assert sorted(zip(barriers.column("_epoch").to_pylist(), barriers.column(VIEW_PARTITION).to_pylist(),
                      strict=True)) == [(e, p) for e in (7, 8) for p in range(3)]
    assert set(barriers.column("_partition").to_pylist()) == {1}  # the upstream partition stays


def test_a_task_holds_one_partition_and_an_empty_task_its_own_index() -> None:
    rows = pa.table({"x": [1, 2], VIEW_PARTITION: pa.array([2, 2], pa.int32())})
    found = own_partition(iter(rows.to_batches()), VIEW_PARTITION)
    assert found is not None and found[0] == 2 and found[1] is not None and found[1].num_rows == 2
    # Outside a Spark task nothing names an empty task's partition.
    assert own_partition(iter([]), VIEW_PARTITION) is None
    assert own_partition(iter(rows.slice(0, 0).to_batches()), VIEW_PARTITION) is None
