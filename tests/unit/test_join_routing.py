"""The pure parts of a two-view equi-join's operator (inner, outer, semi, anti) in Spark's tasks (issue
19, item 2, joins): which views take it, which join-key partition each input row and state key belongs
to, that one operator per join-key partition followed by a consolidation per view partition gives the
single operator's changes, each in the partition the changelog writer puts it in, and what the first
shuffle's ``mapInArrow`` makes of the data source's rows. No broker, no Spark: the shuffles themselves run in
``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op, apply_changes
from mvlog.connectors.kafka.changelog_writer import encode_batch
from mvlog.connectors.spark.change_rows import BARRIER, SignedRowBuilder
from mvlog.connectors.spark.hash_partitioning import partition_tokens
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.services.pipeline.join_tasks import SIDE, RouteJoinRows, shuffled_schema, side_column, side_epochs
from mvlog.services.pipeline.partition_tasks import ROUTE_TOKEN, VIEW_PARTITION
from mvlog.services.pipeline.reading import EpochBatches
from mvlog.views import ChangeBatch, ViewOperator, ViewPlan, plan_view
from mvlog.views.change_batch import consolidate_signed
from mvlog.views.join_routing import (
    JoinRouting,
    aggregate_over_join,
    join_chain_on_one_key,
    routed_by_join_key,
    top_n_over_join,
    two_source_equi_join,
)
from mvlog.views.keyed_routing import OperatorKeyRouting, operator_key_routing
from mvlog.views.routing import partitions_table, view_key_partitions
from mvlog.views.state import InMemoryState
from mvlog.vnode import partition_of_vnode

A = RowSchema.of({"id": "int", "k": "int", "x": "float", "s": "string"}, ["id"])
B = RowSchema.of({"bid": "int", "k2": "float", "w": "int"}, ["bid"])
C = RowSchema.of({"cid": "int", "k3": "int", "v": "int"}, ["cid"])  # a chain's third source
JOIN = "SELECT a.id, b.bid, a.s, b.w, a.x + b.w AS t FROM a JOIN b ON a.k = b.k2"


@pytest.mark.parametrize(("sql", "taken"), [
    (JOIN, True),
    ("SELECT a.s, b.w FROM a JOIN b ON a.k = b.k2 AND a.id > b.w WHERE b.w > 0", True),  # residual, WHERE
    ("SELECT a.s, b.w FROM a LEFT JOIN b ON a.k = b.k2", True),
    ("SELECT a.s, b.w FROM a RIGHT JOIN b ON a.k = b.k2 AND a.x < b.w", True),
    ("SELECT a.id, b.bid FROM a FULL JOIN b ON a.k = b.k2", True),
    ("SELECT a.s FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w > 0)", True),  # semi
    ("SELECT a.s FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k)", True),  # anti
    ("SELECT a.s FROM a WHERE a.k IN (SELECT k2 FROM b WHERE w > 0)", True),
    ("SELECT a.s FROM a WHERE a.k IN (SELECT k2 + 1 FROM b)", False),  # a computed join key: not b's column
    ("SELECT x.s FROM a x WHERE EXISTS (SELECT 1 FROM a y WHERE y.k = x.id)", True),  # over one upstream
    ("SELECT a.s FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k) AND a.id IN (SELECT w FROM b)",
     False),  # two subqueries: a chain
    ("SELECT a.s, count(*) AS n FROM a JOIN b ON a.k = b.k2 GROUP BY a.s", False),  # an aggregate over it
    ("SELECT a.s, count(*) AS n FROM a LEFT JOIN b ON a.k = b.k2 GROUP BY a.s", False),
    ("SELECT x.id, y.id AS id2 FROM a x JOIN a y ON x.k = y.k", True),  # a self-join: its rows routed twice
    ("SELECT x.id, y.id AS id2 FROM a x LEFT JOIN a y ON x.k = y.k", True),
    ("SELECT x.id, count(*) AS n FROM a x JOIN a y ON x.k = y.id GROUP BY x.id", False),
    ("SELECT * FROM a WHERE k > 0", False),
])
def test_which_views_the_join_routing_takes(sql: str, taken: bool) -> None:
    assert two_source_equi_join(plan_view("v", sql, {"a": A, "b": B})) is taken


def _a(rng: random.Random, i: int) -> Row:
    return {"id": i, "k": rng.choice([0, 1, 2, 3, None]), "x": rng.choice([0.5, -0.0, None]), "s": f"s{i % 3}"}


def _b(rng: random.Random, i: int) -> Row:
    return {"bid": i, "k2": rng.choice([0.0, -0.0, 1.0, 2.0, 5.0, None]), "w": rng.randrange(-3, 4)}


def _c(rng: random.Random, i: int) -> Row:
    return {"cid": i, "k3": rng.choice([0, 1, 2, 4, None]), "v": rng.randrange(-2, 3)}


def _changes(rng: random.Random, rows: dict[int, Row], ids: int,
             make: Callable[[random.Random, int], Row]) -> list[Change]:
    """Inserts, updates (some moving the row to another join key) and deletes, one per key."""
    ops = [(i, None if rng.random() < 0.35 else make(rng, i)) for i in rng.sample(range(ids), ids // 2)]
    return _apply_ops(rows, ops)


def _apply_ops(rows: dict[int, Row], ops: Sequence[tuple[int, Row | None]]) -> list[Change]:
    """The changes that bring row ``i`` of ``rows`` to each op's row (None: deleted), the first op of a
    key only (a change per key and epoch, as the data source's netted epochs have); ``rows`` updated."""
    out = []
    for i, new in {i: new for i, new in reversed(ops)}.items():
        old = rows.get(i)
        if old is None and new is None:
            continue
        out.append(Change(Op.CREATE if old is None else Op.DELETE if new is None else Op.UPDATE, (i,), old, new))
        if new is None:
            rows.pop(i)
        else:
            rows[i] = new
    return out


def routed_to(routing: OperatorKeyRouting, side: int, batch: ChangeBatch, partition: int) -> ChangeBatch:
    """The changes of side ``side``'s ``batch`` that ``routing`` sends to ``partition`` (its fan-out: a
    windowed inner GROUP BY's row to each partition of its windows)."""
    indices, parts = routing.fan_out(side, batch.signed()[0])
    owners: list[set[int]] = [set() for _ in range(len(batch.signed()[1]))]
    for index, part in zip(indices.to_pylist(), parts.to_pylist(), strict=True):
        owners[index].add(part)
    return _split(batch, owners, partition)


def _split(batch: ChangeBatch, owners: list[set[int]], partition: int) -> ChangeBatch:
    """The changes of ``batch`` whose signed rows the routing sends to ``partition`` (``owners``: each
    signed row's partitions), as the data source's signed rows after the shuffle."""
    rows, weights = batch.signed()
    change_of = []  # signed row -> its change's position (a change's rows are adjacent: -1 then +1)
    position = -1
    signs = weights.to_pylist()
    for weight, prev in zip(signs, [1, *signs][:len(signs)], strict=True):
        position += 1 if weight < 0 or prev > 0 else 0
        change_of.append(position)
    mask = pa.array([partition in o for o in owners], pa.bool_())
    return ChangeBatch.from_signed(batch.schema, rows.filter(mask), weights.filter(mask),
                                   pa.array(change_of, pa.int64()).filter(mask))


@dataclass
class SplitJoin:
    """One join view run two ways over the same epochs: the single operator over all its state, and one
    operator per join-key partition over its own rows of both sides and its own state (stage 1), whose
    signed output rows are routed by the view key's partition (where the changelog writer puts them) and
    consolidated per view partition (stage 2). :meth:`epoch` checks that the view summed over the epochs
    and the union of the state are the single operator's, epoch by epoch, and that every state key and
    output change is in the partition that owns it."""

    plan: ViewPlan
    partitions: int
    whole: InMemoryState = field(default_factory=InMemoryState)
    view: dict[Key, Row] = field(default_factory=dict)
    split_view: dict[Key, Row] = field(default_factory=dict)
    emptied: int = 0  # buckets deleted: a join key lost its last row on a side
    extended: Counter[int] = field(default_factory=Counter)  # null-extended rows asserted (+1) and retracted (-1)

    def __post_init__(self) -> None:
        routing = operator_key_routing(self.plan, self.partitions)  # a join's, or a top-N's
        assert routing is not None
        self.routing = routing
        self.operator = ViewOperator(self.plan)
        self.parts = [InMemoryState() for _ in range(self.partitions)]
        self.of_vnode = partitions_table(self.partitions)
        key = self.plan.schema.primary_key
        self.key_of = [[name for name in key if name in side_keys] for side_keys in (("id",), ("bid",))]

    def epoch(self, inputs: dict[str, ChangeBatch]) -> None:
        output = self.operator.apply_epoch(inputs, self.whole)
        self.whole.apply(output.state_writes)
        self.emptied += sum(value is None for value in output.state_writes.values())
        for change in output.changes.to_changes():
            for weight, row in ((-1, change.before), (1, change.after)):
                if row is not None and any(row[c] is None for names in self.key_of for c in names):
                    self.extended[weight] += 1
        self.view = apply_changes(self.view, output.changes.to_changes())
        signed: list[pa.Table] = []
        for j in range(self.partitions):
            mine = {}  # each side's rows of join-key partition j, under the side's input name
            for side, (upstream, name) in enumerate(zip(self.routing.upstreams(), self.routing.inputs(), strict=True)):
                mine[name] = routed_to(self.routing, side, inputs[upstream], j)
            out = self.routing.first_step(j).apply_epoch(mine, self.parts[j])
            self.parts[j].apply(out.state_writes)
            assert set(self.routing.partitions_of_state_keys(list(out.state_writes))) <= {j}
            rows, weights = out.changes.signed()
            signed.append(rows.append_column("_weight", weights))
        everything = pa.concat_tables(signed)
        targets = view_key_partitions(self.plan.schema, everything, self.of_vnode).to_pylist()
        for p in range(self.partitions):
            mine_rows = everything.filter(pa.array([t == p for t in targets], pa.bool_()))
            changes = consolidate_signed(mine_rows.select(list(self.plan.schema.names)),
                                         mine_rows.column("_weight").to_pylist(), self.plan.schema)
            encoded = encode_batch(self.plan.schema.primary_key, changes)
            assert {partition_of_vnode(v, self.partitions) for v in encoded.vnodes} <= {p}
            self.split_view = apply_changes(self.split_view, changes.to_changes())
        assert self.split_view == self.view
        merged: dict[bytes, bytes] = {}
        for j, state in enumerate(self.parts):
            assert not set(state.data) & set(merged)
            assert set(self.routing.partitions_of_state_keys(list(state.data))) <= {j}
            merged.update(state.data)
        assert merged == self.whole.data


KINDS = ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]
RESIDUALS = ["", " AND a.id > b.w"]


def _sql(kind: str, residual: str) -> str:
    return f"SELECT a.id, b.bid, a.s, b.w, a.x + b.w AS t FROM a {kind} b ON a.k = b.k2{residual}"


#: Semi and anti joins: a subquery over b (a filter/project), the left rows with (without) a match.
SEMI_ANTI = ["SELECT a.id, a.s FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w > -2)",
             "SELECT a.id, a.x FROM a WHERE a.k IN (SELECT k2 FROM b)",
             "SELECT a.id, a.s FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w <> 0)"]


def _random_epochs(split: SplitJoin, rng: random.Random) -> None:
    """Ten epochs of random changes to both sides through ``split``, which must empty a bucket."""
    rows_a: dict[int, Row] = {}
    rows_b: dict[int, Row] = {}
    for _ in range(10):
        split.epoch({"a": ChangeBatch.from_changes(A, _changes(rng, rows_a, 12, _a)),
                     "b": ChangeBatch.from_changes(B, _changes(rng, rows_b, 12, _b))})
    assert split.emptied > 0, "no bucket emptied: its delete went untested"


@pytest.mark.parametrize("residual", RESIDUALS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_join_keys_computed_apart_then_consolidated_per_view_partition_give_the_single_operators_changes(
        kind: str, residual: str, partitions: int) -> None:
    """:class:`SplitJoin` over random epochs; they are known to empty buckets and, for an outer join, to
    assert and retract null-extended rows (a join key's first match arriving and its last leaving)."""
    split = SplitJoin(plan_view("v", _sql(kind, residual), {"a": A, "b": B}), partitions)
    _random_epochs(split, random.Random(partitions * 31 + len(kind) * 7 + len(residual)))
    if kind != "JOIN":
        assert split.extended[1] > 0 and split.extended[-1] > 0, "null-extended rows never asserted and retracted"


@pytest.mark.parametrize("sql", SEMI_ANTI)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_semi_and_anti_joins_split_by_join_key_give_the_single_operators_changes(sql: str, partitions: int) -> None:
    """:class:`SplitJoin` over random epochs, b's rows routed by the column its subquery passes through."""
    split = SplitJoin(plan_view("v", sql, {"a": A, "b": B}), partitions)
    assert isinstance(split.routing, JoinRouting)
    assert split.routing.upstreams() == ("a", "b") and split.routing.columns(1) == ["k2"]
    _random_epochs(split, random.Random(partitions * 31 + len(sql)))


#: Self-joins: one view's rows, each routed once per side by that side's join key (``k`` and ``id`` are
#: other columns: a row is in two partitions, as a parent and as a child).
SELF_JOINS = ["SELECT x.id, y.id AS yid, x.s, y.x FROM a x JOIN a y ON x.k = y.id",
              "SELECT x.id, y.id AS yid FROM a x LEFT JOIN a y ON x.k = y.k AND x.id < y.id",
              "SELECT x.id, y.id AS yid, y.s FROM a x FULL JOIN a y ON x.k = y.id",
              # Semi and anti: the subquery reads the FROM view itself (rows with a child, without one).
              "SELECT x.id, x.s FROM a x WHERE EXISTS (SELECT 1 FROM a y WHERE y.k = x.id AND y.s <> 's0')",
              "SELECT x.id FROM a x WHERE NOT EXISTS (SELECT 1 FROM a y WHERE y.k = x.id)"]


@pytest.mark.parametrize("sql", SELF_JOINS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_a_self_join_routed_once_per_side_gives_the_single_operators_changes(sql: str, partitions: int) -> None:
    """:class:`SplitJoin` of a view joined with itself: the second side's rows go to the operator apart
    (:meth:`JoinRouting.inputs`), its state and output the single operator's, which reads the one view's
    changes for both sides."""
    split = SplitJoin(plan_view("v", sql, {"a": A}), partitions)
    assert split.routing.upstreams() == ("a", "a") and split.routing.inputs() == ("a", "a#1")
    assert split.routing.operator_plan().sources == ("a", "a#1") and split.plan.sources == ("a",)
    assert split.routing.operator_plan().upstream_schemas == {"a": A, "a#1": A}
    rng = random.Random(partitions * 17 + len(sql))
    rows: dict[int, Row] = {}
    for _ in range(10):
        split.epoch({"a": ChangeBatch.from_changes(A, _changes(rng, rows, 12, _a))})
    assert split.emptied > 0, "no bucket emptied: its delete went untested"
    assert split.view, "the join never matched"


join_keys_a = st.sampled_from([0, 1, 2, None])
join_keys_b = st.sampled_from([0.0, -0.0, 1.0, 2.0, None])
rows_of_a = st.builds(lambda k, x, s: {"k": k, "x": x, "s": s}, join_keys_a, st.sampled_from([0.5, None]),
                      st.sampled_from(["p", "q"]))
rows_of_b = st.builds(lambda k2, w: {"k2": k2, "w": w}, join_keys_b, st.integers(-2, 2))
ids = st.integers(0, 5)
epochs = st.lists(st.tuples(st.lists(st.tuples(ids, st.one_of(st.none(), rows_of_a)), max_size=6),
                            st.lists(st.tuples(ids, st.one_of(st.none(), rows_of_b)), max_size=6)),
                  min_size=1, max_size=6)


@pytest.mark.parametrize("sql", [_sql(kind, residual) for kind in KINDS for residual in RESIDUALS] + SEMI_ANTI)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(partitions=st.sampled_from([2, 3, 4]), epochs=epochs)
def test_any_changes_of_either_side_split_by_join_key_give_the_single_operators_changes(
        sql: str, partitions: int,
        epochs: list[tuple[list[tuple[int, dict[str, Any] | None]], list[tuple[int, dict[str, Any] | None]]]]
) -> None:
    """:class:`SplitJoin` over generated inserts, updates and deletes of both sides: join keys with few
    values (so a key gains and loses its last match on either side), NULL join keys on both sides (many
    rows at once: each an outer join's null-extended row, all from partition 0), rows moving between
    join keys and to and from NULL."""
    split = SplitJoin(plan_view("v", sql, {"a": A, "b": B}), partitions)
    rows_a: dict[int, Row] = {}
    rows_b: dict[int, Row] = {}
    for ops_a, ops_b in epochs:
        changes_a = _apply_ops(rows_a, [(i, None if r is None else {"id": i, **r}) for i, r in ops_a])
        changes_b = _apply_ops(rows_b, [(i, None if r is None else {"bid": i, **r}) for i, r in ops_b])
        split.epoch({"a": ChangeBatch.from_changes(A, changes_a), "b": ChangeBatch.from_changes(B, changes_b)})


@pytest.mark.parametrize("kind", ["LEFT JOIN", "FULL JOIN"])
def test_an_outer_joins_rows_with_a_null_join_key_are_null_extended_by_partition_0(kind: str) -> None:
    """Several rows of the preserved side with a NULL join key at once: partition 0 holds them all and
    emits each null-extended, storing nothing; a row moving from NULL to a matched key is retracted there
    and paired in its key's partition, and the consolidation per view partition makes it one update."""
    plan = plan_view("v", _sql(kind, ""), {"a": A, "b": B})
    split = SplitJoin(plan, 4)
    rows_a: dict[int, Row] = {}
    rows_b: dict[int, Row] = {}
    nulls = [(i, {"id": i, "k": None, "x": 0.5, "s": "p"}) for i in range(5)]
    batch = ChangeBatch.from_changes(A, _apply_ops(rows_a, nulls))
    assert set(split.routing.partitions_of(0, batch.signed()[0]).to_pylist()) == {0}
    split.epoch({"a": batch, "b": ChangeBatch.from_changes(B, [])})
    assert not split.whole.data and not any(part.data for part in split.parts)
    assert sorted(key[0] for key in split.view) == list(range(5))
    assert all(row["bid"] is None for row in split.view.values())
    owner = split.routing.partitions_of(1, pa.table({"k2": [3.0]})).to_pylist()[0]
    assert owner != 0  # the move crosses partitions (checked for this key and 4 partitions)
    split.epoch({"a": ChangeBatch.from_changes(A, _apply_ops(rows_a, [(2, {**rows_a[2], "k": 3})])),
                 "b": ChangeBatch.from_changes(B, _apply_ops(rows_b, [(9, {"bid": 9, "k2": 3.0, "w": 1})]))})
    assert split.view[(2, 9)]["w"] == 1 and (2, None) not in split.view
    assert split.extended == Counter({1: 5, -1: 1})


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
    with pytest.raises(ValueError, match="not an equi-join of two views"):
        JoinRouting(plan_view("v", "SELECT a.id FROM a JOIN b ON a.k = b.k2 JOIN a c ON c.id = b.w",
                              {"a": A, "b": B}), 4)  # a chain of joins


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
    out = pa.Table.from_batches(list(RouteJoinRows(routing, (1,), schema).run(iter([builder.flush()]))))
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


def test_a_self_joins_rows_are_routed_once_per_side_by_that_sides_join_key() -> None:
    """One read of the view, routed as both sides: a row goes to the partition of ``k`` as side 0 and of
    ``id`` as side 1 (``x.k = y.id``), each barrier to every partition once per side, and a join-key task's
    rows split back under the sides' input names (:func:`side_epochs`) for the operator that tells them
    apart."""
    routing = JoinRouting(plan_view("v", SELF_JOINS[0], {"a": A}), 3)
    upstreams = [_entry("a", A), _entry("a", A)]
    schema = shuffled_schema(upstreams)
    builder = SignedRowBuilder(A, 1)
    rows: list[Row] = [{"id": i, "k": k, "x": 0.5, "s": "p"} for i, k in ((1, 2), (2, 7), (3, None))]
    for offset, row in enumerate(rows):
        builder.add_images(5, offset, b"k%d" % offset, None, row)
    builder.add_barrier(5, 3)
    out = pa.Table.from_batches(list(RouteJoinRows(routing, (0, 1), schema).run(iter([builder.flush()]))))
    changes = out.filter(pc.not_equal(out.column("_change_type"), BARRIER))
    by_side = {side: changes.filter(pc.equal(changes.column(SIDE), side)) for side in (0, 1)}
    assert by_side[0].column(side_column(0, "id")).to_pylist() == [1, 2, 3]
    assert by_side[1].column(side_column(1, "id")).to_pylist() == [1, 2, 3]
    assert by_side[0].column(VIEW_PARTITION).to_pylist() == routing.partitions_of(
        0, pa.table({"k": pa.array([2, 7, None], pa.int64())})).to_pylist()
    assert by_side[1].column(VIEW_PARTITION).to_pylist() == routing.partitions_of(
        1, pa.table({"id": pa.array([1, 2, 3], pa.int64())})).to_pylist()
    barriers = out.filter(pc.equal(out.column("_change_type"), BARRIER))
    assert sorted(zip(barriers.column(SIDE).to_pylist(), barriers.column(VIEW_PARTITION).to_pylist(),
                      strict=True)) == [(s, p) for s in (0, 1) for p in range(3)]
    epochs: EpochBatches = {}
    side_epochs(out, upstreams, routing, epochs)
    assert set(epochs[5]) == {"a", "a#1"}
    assert sorted(k[0] for k in epochs[5]["a"].keys) == sorted(k[0] for k in epochs[5]["a#1"].keys) == [1, 2, 3]


#: Aggregates over joins: the join per join key, then the joined rows to their groups' partitions.
AGGREGATES_OVER_JOINS = [
    "SELECT a.s, count(*) AS n, sum(b.w) AS t, min(b.w) AS lo, max(a.x) AS hi FROM a JOIN b ON a.k = b.k2 "
    "WHERE b.w <> 0 GROUP BY a.s",
    "SELECT b.w, count(*) AS n, avg(a.x) AS m FROM a LEFT JOIN b ON a.k = b.k2 GROUP BY b.w",
    "SELECT x.s, count(*) AS n, sum(y.id) AS t FROM a x JOIN a y ON x.k = y.id GROUP BY x.s",  # a self-join
    # Over a semi and an anti join (their subquery a filter of b, run in the join step), and a self anti join.
    "SELECT a.s, count(*) AS n, max(a.x) AS hi FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w > -2) "
    "GROUP BY a.s",
    "SELECT a.k, count(*) AS n FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w <> 0) GROUP BY a.k",
    "SELECT x.s, count(*) AS n FROM a x WHERE NOT EXISTS (SELECT 1 FROM a y WHERE y.k = x.id) GROUP BY x.s",
    # Global: every joined row to the one row's partition, whose task alone folds it.
    "SELECT count(*) AS n, sum(b.w) AS t, max(a.x) AS hi FROM a LEFT JOIN b ON a.k = b.k2",
    # Windowed: a joined row to each partition holding one of its windows, whose task keeps its own.
    "SELECT window.start, a.s, count(*) AS n, sum(b.w) AS t FROM a JOIN b ON a.k = b.k2 "
    "GROUP BY window(a.id, '4 milliseconds', '1 millisecond'), a.s",
    "SELECT window.end, count(*) AS n, min(b.w) AS lo FROM a LEFT JOIN b ON a.k = b.k2 GROUP BY window(a.k, '3 ms')",
    # Over chains of joins on one key: every step in the join key's task, then the joined rows to their groups.
    "SELECT a.s, count(*) AS n, sum(c.v) AS t, max(b.w) AS hi FROM a JOIN b ON a.k = b.k2 LEFT JOIN c ON "
    "b.k2 = c.k3 GROUP BY a.s",
    "SELECT c.v, count(*) AS n, min(a.id) AS lo FROM a FULL JOIN c ON a.k = c.k3 JOIN a y ON c.k3 = y.k GROUP BY c.v",
]


@pytest.mark.parametrize("sql", AGGREGATES_OVER_JOINS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_an_aggregate_over_a_join_split_by_join_key_then_by_group_gives_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """Per epoch: one join step per join-key partition (:meth:`ViewOperator.joined`, its own join state),
    its joined rows routed to the partition of their group (:meth:`GroupRouting.fan_out_batch`),
    one aggregate step per view partition (:meth:`ViewOperator.aggregate_joined`, its own groups' state):
    the changes and the state are the single operator's, each change and state key in its partition."""
    schemas = {"a": A, "b": B, "c": C}
    plan = plan_view("v", sql, {name: schemas[name] for name in schemas if f" {name} " in sql + " "})
    assert aggregate_over_join(plan) and not two_source_equi_join(plan)
    split_aggregate(plan, JoinRouting(plan, partitions), partitions, random.Random(partitions * 13 + len(sql)))


def split_aggregate(plan: ViewPlan, routing: OperatorKeyRouting, partitions: int, rng: random.Random) -> None:
    """Ten epochs of random changes to the plan's sources (of ``a``, ``b``, ``c``), through the single
    operator and split in two steps: the first (a join, or a GROUP BY's subquery) per partition of
    ``routing``, its rows routed to their groups' partitions, the aggregate there. Asserts that the
    changes and the state are the single operator's, each change and state key in its partition."""
    groups = routing.groups
    assert groups is not None
    whole, operator = InMemoryState(), ViewOperator(plan)
    joins = [InMemoryState() for _ in range(partitions)]
    aggregates = [InMemoryState() for _ in range(partitions)]
    view: dict[Key, Row] = {}
    split_view: dict[Key, Row] = {}
    rows_a: dict[int, Row] = {}
    rows_b: dict[int, Row] = {}
    rows_c: dict[int, Row] = {}
    for _ in range(10):
        inputs = {"a": ChangeBatch.from_changes(A, _changes(rng, rows_a, 12, _a)),
                  "b": ChangeBatch.from_changes(B, _changes(rng, rows_b, 12, _b))}
        if "c" in plan.sources:
            inputs["c"] = ChangeBatch.from_changes(C, _changes(rng, rows_c, 12, _c))
        inputs = {name: batch for name, batch in inputs.items() if name in plan.sources}
        output = operator.apply_epoch(inputs, whole)
        whole.apply(output.state_writes)
        view = apply_changes(view, output.changes.to_changes())
        joined: list[pa.Table] = []
        for j in range(partitions):
            mine = {}
            for side, (upstream, name) in enumerate(zip(routing.upstreams(), routing.inputs(), strict=True)):
                mine[name] = routed_to(routing, side, inputs[upstream], j)
            writes: dict[bytes, bytes | None] = {}
            joined.append(routing.first_step(j).joined(mine, joins[j], writes))
            assert set(routing.partitions_of_state_keys(list(writes))) <= {j}
            joins[j].apply(writes)
        rows = pa.concat_tables(joined)
        indices, owners = groups.fan_out_batch(rows)  # a windowed one's rows: once to each of their partitions
        assert len(set(zip(indices.to_pylist(), owners.to_pylist(), strict=True))) == len(indices)
        for p in range(partitions):  # a global aggregate's other partitions: no joined row, no change
            aggregate = ViewOperator(routing.operator_plan(), share=groups.share(p))
            out = aggregate.aggregate_joined(rows.take(indices.filter(pc.equal(owners, p))), aggregates[p])
            assert set(groups.partitions_of_state_keys(list(out.state_writes))) <= {p}
            aggregates[p].apply(out.state_writes)
            encoded = encode_batch(plan.schema.primary_key, out.changes)
            assert {partition_of_vnode(v, partitions) for v in encoded.vnodes} <= {p}
            split_view = apply_changes(split_view, out.changes.to_changes())
        assert split_view == view
        merged: dict[bytes, bytes] = {}
        for state in (*joins, *aggregates):
            assert not set(state.data) & set(merged)
            merged.update(state.data)
        assert merged == whole.data
    assert view, "no group ever had a row"


#: Top-N over inner joins ranked per join key (Nexmark q9's shape): the join and the ranking in one task.
TOP_N_OVER_JOINS = [
    "SELECT * FROM (SELECT a.id, b.bid, a.s, b.k2, ROW_NUMBER() OVER (PARTITION BY b.w ORDER BY b.k2 DESC) AS rn "
    "FROM a JOIN b ON a.id = b.w) AS t WHERE rn <= 2",
    "SELECT id, bid FROM (SELECT a.id, b.bid, ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.k2) AS rn "
    "FROM a JOIN b ON a.id = b.w AND a.x IS NOT NULL WHERE b.bid > 1) AS t WHERE rn = 1",  # residual, WHERE
    "SELECT * FROM (SELECT x.id, y.id AS yid, y.x, ROW_NUMBER() OVER (PARTITION BY x.k ORDER BY y.x DESC) AS rn "
    "FROM a AS x JOIN a AS y ON x.k = y.k) AS t WHERE rn <= 2",  # a self-join
]


def _ranked(partition: str, join: str = "JOIN", on: str = "a.id = b.w") -> str:
    return (f"SELECT * FROM (SELECT a.id, b.bid, ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY b.k2) AS rn "
            f"FROM a {join} b ON {on}) AS t WHERE rn <= 2")


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in TOP_N_OVER_JOINS),
    (_ranked("a.s"), False),  # ranked per another column: a group's rows are in every join key
    (_ranked("a.id, b.bid"), False),
    (_ranked("a.id", join="LEFT JOIN"), False),  # null-extended rows: a group of NULL, not partition 0's
    (_ranked("a.k", on="a.k = b.k2"), False),  # compared as FLOAT, ranked as INT: other bytes, other owners
    (_ranked("b.k2", on="a.k = b.k2"), True),
    (_ranked("b.w", on="a.id = b.w AND a.k = b.k2"), False),  # half of the join key
])
def test_which_top_n_over_a_join_the_join_routing_takes(sql: str, taken: bool) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B})
    assert top_n_over_join(plan) is taken and routed_by_join_key(plan) is taken
    assert not two_source_equi_join(plan) and not aggregate_over_join(plan)


@pytest.mark.parametrize("sql", TOP_N_OVER_JOINS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_a_top_n_over_a_join_ranked_in_its_join_keys_tasks_gives_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """:class:`SplitJoin`: each join-key task joins and ranks its own groups, whose state keys
    (``t[...]``) it owns beside its buckets; the view partitions consolidate the ranks that moved."""
    schemas = {"a": A, "b": B} if " b " in sql else {"a": A}
    split = SplitJoin(plan_view("v", sql, schemas), partitions)
    assert isinstance(split.routing, JoinRouting) and split.routing.groups is None
    rng = random.Random(partitions * 7 + len(sql))
    rows: dict[str, dict[int, Row]] = {"a": {}, "b": {}}
    for _ in range(12):
        split.epoch({name: ChangeBatch.from_changes(schema, _changes(rng, rows[name], 12, _a if name == "a" else _b))
                     for name, schema in schemas.items()})
    assert split.emptied > 0, "no bucket emptied: its delete went untested"
    assert any(key.startswith(b"t[") for key in split.whole.data), "no ranking group kept"
    assert split.view, "nothing ranked"


#: Chains of joins on one key: every step compares each source's same columns (a combo's key is its rows'),
#: so one task per join key runs them all. Compared as FLOAT (b.k2), or as INT (a.k, c.k3).
CHAINS = [
    "SELECT a.id, b.bid, c.cid, a.s, c.v FROM a JOIN b ON a.k = b.k2 JOIN c ON b.k2 = c.k3",
    "SELECT a.id, c.cid, y.id AS yid, c.v FROM a LEFT JOIN c ON a.k = c.k3 LEFT JOIN a y ON a.k = y.k",  # a's key
    "SELECT a.id, b.bid, c.cid FROM a FULL JOIN b ON a.k = b.k2 RIGHT JOIN c ON b.k2 = c.k3",
    "SELECT a.id, b.bid, c.cid FROM a JOIN b ON a.k = b.k2 FULL JOIN c ON b.k2 = c.k3 AND c.v > b.w WHERE c.v <> 1",
    "SELECT x.id, y.id AS yid, c.cid FROM a x JOIN a y ON x.k = y.k LEFT JOIN c ON y.k = c.k3",  # a read twice
    # Four sources, a and c each read twice (their second sides' inputs a#2 and c#3).
    "SELECT a.id, c.cid, y.id AS yid, d.cid AS did FROM a JOIN c ON a.k = c.k3 LEFT JOIN a y ON c.k3 = y.k "
    "JOIN c d ON y.k = d.k3",
]
_SCHEMAS = {"a": A, "b": B, "c": C}
_MAKE = {"a": _a, "b": _b, "c": _c}


def _chain(sql: str) -> ViewPlan:
    return plan_view("v", sql, {name: schema for name, schema in _SCHEMAS.items() if f" {name} " in sql + " "})


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in CHAINS),
    ("SELECT a.id, c.cid FROM a JOIN b ON a.k = b.k2 JOIN c ON b.w = c.k3", False),  # another column
    ("SELECT a.id, c.cid FROM a JOIN c ON a.k = c.k3 JOIN b ON a.id = b.w", False),
    ("SELECT a.id, c.cid FROM a JOIN c ON a.k = c.k3 JOIN b ON c.k3 = b.k2", False),  # INT, then FLOAT
    ("SELECT a.id, c.cid FROM a LEFT JOIN b ON a.k = b.k2 LEFT JOIN c ON a.k = c.k3", False),  # FLOAT, then INT
    ("SELECT a.id, c.cid FROM a JOIN c ON a.k = c.k3 AND a.id = c.v JOIN a y ON c.v = y.id AND c.k3 = y.k",
     False),  # the same columns in another order: another key's bytes
    ("SELECT a.id FROM a JOIN c ON a.k = c.k3 WHERE EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k)", False),
])
def test_which_chains_of_joins_the_join_routing_takes(sql: str, taken: bool) -> None:
    plan = _chain(sql)
    assert join_chain_on_one_key(plan) is taken and routed_by_join_key(plan) is taken
    assert not two_source_equi_join(plan)


@pytest.mark.parametrize("sql", CHAINS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_a_chain_of_joins_on_one_key_in_its_join_keys_tasks_gives_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """:class:`SplitJoin`: each join-key task runs every step on its share, its buckets of every step
    (``j0``/``j1``, ``j1.0``/``j1.1`` ...) its own; the view partitions consolidate."""
    plan = _chain(sql)
    split = SplitJoin(plan, partitions)
    upstreams = split.routing.upstreams()
    assert len(upstreams) == len(plan.query.sources) >= 3
    assert len(set(split.routing.inputs())) == len(upstreams)  # a view read twice: one input per side
    rng = random.Random(partitions * 11 + len(sql))
    rows: dict[str, dict[int, Row]] = {name: {} for name in plan.sources}
    for _ in range(12):
        split.epoch({name: ChangeBatch.from_changes(_SCHEMAS[name], _changes(rng, rows[name], 12, _MAKE[name]))
                     for name in plan.sources})
    assert split.emptied > 0, "no bucket emptied: its delete went untested"
    assert any(key.startswith(b"j1.") for key in split.whole.data), "no bucket of the second step kept"
    assert split.view, "the chain never matched"


def test_a_top_n_over_a_chain_ranked_per_its_key_is_routed_by_it() -> None:
    sql = ("SELECT id, cid, rn FROM (SELECT a.id, c.cid, ROW_NUMBER() OVER (PARTITION BY c.k3 ORDER BY a.id) AS rn "
           "FROM a JOIN c ON a.k = c.k3 JOIN a y ON c.k3 = y.k) AS t WHERE rn <= 2")
    assert top_n_over_join(_chain(sql))
    assert not top_n_over_join(_chain(sql.replace("JOIN a y", "LEFT JOIN a y")))
    split = SplitJoin(_chain(sql), 3)
    rng = random.Random(5)
    rows: dict[str, dict[int, Row]] = {"a": {}, "c": {}}
    for _ in range(12):
        split.epoch({name: ChangeBatch.from_changes(_SCHEMAS[name], _changes(rng, rows[name], 12, _MAKE[name]))
                     for name in ("a", "c")})
    assert any(key.startswith(b"t[") for key in split.whole.data) and split.view
