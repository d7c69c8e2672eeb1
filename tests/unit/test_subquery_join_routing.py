"""The pure parts of a join of GROUP BY subqueries in Spark's tasks (issue 19 item 2, Nexmark q8's shape):
which views take the routing, and that each side's rows routed by the join key of their groups, the
subqueries and the join run per join-key partition, then consolidated per view partition, give the single
operator's changes and state (:class:`~tests.unit.test_join_routing.SplitJoin`). No broker, no Spark: the
shuffles run in ``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.row_schema import Row
from mvlog.views import ChangeBatch, plan_view
from mvlog.views.join_routing import JoinRouting
from mvlog.views.keyed_routing import operator_key_routing
from mvlog.views.subquery_join_routing import SubqueryJoinRouting, join_of_subqueries

from .test_join_routing import A, B, SplitJoin, _a, _apply_ops, _b, _changes

Q5 = ("SELECT c.k, c.n, c.ws FROM (SELECT k, count(*) AS n, window.start AS ws, window.end AS we FROM a "
      "GROUP BY k, window(id, '4 milliseconds', '2 milliseconds')) c JOIN (SELECT max(m.n) AS top, m.ws, m.we FROM "
      "(SELECT count(*) AS n, window.start AS ws, window.end AS we FROM a "
      "GROUP BY k, window(id, '4 milliseconds', '2 milliseconds')) m GROUP BY m.ws, m.we) t "
      "ON c.ws = t.ws AND c.we = t.we AND c.n >= t.top")
JOINS_OF_GROUPS = [
    # Nexmark q8's shape: both sides grouped per key and tumbling window, joined on the key and the window.
    "SELECT p.k, p.s, p.n, p.ws FROM (SELECT k, s, window.start AS ws, window.end AS we, count(*) AS n FROM a "
    "GROUP BY k, s, window(id, '4 milliseconds')) p JOIN (SELECT w, window.start AS ws, window.end AS we FROM b "
    "GROUP BY w, window(bid, '4 milliseconds')) q ON p.k = q.w AND p.ws = q.ws AND p.we = q.we",
    # A view joined with hopping windows on the window's start: a b row is in two windows, often of two
    # partitions, and each task's subquery keeps only its own.
    "SELECT a.id, q.ws, q.n FROM a JOIN (SELECT window.start AS ws, count(*) AS n, max(k2) AS hi FROM b "
    "GROUP BY window(bid, '4 milliseconds', '2 milliseconds')) q ON a.k = q.ws",
    # An outer join (null-extended rows as a group appears and empties), the subquery filtered.
    "SELECT a.id, a.s, q.n, q.t FROM a LEFT JOIN (SELECT w, count(*) AS n, sum(bid) AS t FROM b "
    "WHERE k2 IS NOT NULL GROUP BY w) q ON a.k = q.w",
    # A WITH query grouped by a computed value, a RIGHT join with a residual condition.
    "WITH per AS (SELECT w % 2 AS odd, count(*) AS n FROM b GROUP BY w % 2) "
    "SELECT a.id, per.odd, per.n FROM a RIGHT JOIN per ON a.k = per.odd AND a.id > per.n",
    # Two subqueries over one view (its rows routed once per side), a FULL join: a NULL k is a group of
    # both, a join key that matches nothing, in partition 0's task.
    "SELECT x.k, x.n, y.m FROM (SELECT k, count(*) AS n FROM a GROUP BY k) x "
    "FULL JOIN (SELECT k, max(x) AS m FROM a WHERE s <> 's0' GROUP BY k) y ON x.k = y.k",
    # Nexmark q5's shape, "hot items": counts per key and hopping window, joined with each window's highest
    # count (a GROUP BY over the same counts) on the window, kept where the count is the highest. Every
    # group of both sides, at both levels, is in the task of its window.
    Q5,
    # Filter/project subqueries: beside a GROUP BY (its join key computed), LEFT; two of them, FULL; one over
    # the view the other side reads.
    "SELECT p.k, p.n, q.bid FROM (SELECT k, count(*) AS n FROM a GROUP BY k) p LEFT JOIN "
    "(SELECT bid, w + 1 AS w1 FROM b WHERE k2 IS NOT NULL) q ON p.k = q.w1",
    "SELECT x.id, q.bid, q.w FROM (SELECT id, k FROM a WHERE s <> 's0') x FULL JOIN (SELECT bid, w FROM b "
    "WHERE w > -2) q ON x.k = q.w",
    "SELECT x.id, y.id AS id2, y.s FROM (SELECT id, k FROM a WHERE x IS NOT NULL) x JOIN a y ON x.k = y.id",
]


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in JOINS_OF_GROUPS),
    ("SELECT a.id FROM a JOIN (SELECT w, max(bid) AS hi FROM b GROUP BY w) q ON a.id = q.hi",
     False),  # Nexmark q7's shape: the key is an aggregate's result, known only after the groups are folded
    ("SELECT a.id FROM a JOIN (SELECT w, count(*) AS n FROM b GROUP BY w) q ON a.x = q.w",
     False),  # grouped as int, compared as float: other key bytes
    ("SELECT q.w, count(*) AS c FROM a JOIN (SELECT w, count(*) AS n FROM b GROUP BY w) q ON a.k = q.w GROUP BY q.w",
     False),  # an aggregate over the join
    ("SELECT a.id FROM a JOIN (SELECT k2, w FROM b WHERE w > 0) q ON a.k = q.w", True),  # a filter/project side
    ("SELECT a.id, b.bid FROM a JOIN b ON a.k = b.w", False),  # two views: the join routing's
    ("WITH per AS (SELECT k, count(*) AS n FROM a GROUP BY k) SELECT x.k, y.n FROM per x JOIN per y ON x.k = y.k",
     False),  # one WITH query on both sides: one operator, whose groups each side would place
    ("SELECT a.id FROM a JOIN (SELECT k, max(s) AS m FROM a GROUP BY k HAVING count(*) > 1) q ON a.k = q.k "
     "JOIN b ON a.id = b.w", False),  # three sources: a chain
    ("SELECT a.id, t.c FROM a JOIN (SELECT n, count(*) AS c FROM (SELECT k, count(*) AS n FROM a GROUP BY k) s "
     "GROUP BY n) t ON a.k = t.n", False),  # a GROUP BY over a GROUP BY by a count: not a group's value below
])
def test_which_views_the_subquery_join_routing_takes(sql: str, taken: bool) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B})
    assert join_of_subqueries(plan) is taken
    assert isinstance(operator_key_routing(plan, 3), SubqueryJoinRouting) is taken


@pytest.mark.parametrize("sql", JOINS_OF_GROUPS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_groups_and_join_per_join_key_then_consolidated_per_view_partition_give_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """:class:`SplitJoin` over twelve epochs of random changes: every state key (the join's buckets, the
    subqueries' groups) in the partition that owns it, the view and the state the single operator's."""
    plan = plan_view("v", sql, {"a": A, "b": B})
    split = SplitJoin(plan, partitions)
    routing = split.routing
    assert isinstance(routing, SubqueryJoinRouting)
    rng = random.Random(partitions * 11 + len(sql))
    rows: dict[str, dict[int, Row]] = {"a": {}, "b": {}}
    matched = 0
    for _ in range(12):
        split.epoch({name: ChangeBatch.from_changes(schema, _changes(rng, rows[name], 12, make))
                     for name, schema, make in (("a", A, _a), ("b", B, _b)) if name in plan.sources})
        matched += bool(split.view)
    assert split.emptied > 0, "no bucket emptied: its delete went untested"
    assert matched, "the join never matched"
    if partitions > 1:  # the groups' state was spread, not all in one task
        assert sum(bool(part.data) for part in split.parts) > 1


def test_a_self_reads_second_side_goes_under_its_own_input() -> None:
    plan = plan_view("v", JOINS_OF_GROUPS[4], {"a": A})
    routing = SubqueryJoinRouting(plan, 3)
    assert routing.upstreams() == ("a", "a") and routing.inputs() == ("a", "a#1")
    assert routing.operator_plan().sources == ("a", "a#1") and plan.sources == ("a",)
    assert routing.operator_plan().upstream_schemas == {"a": A, "a#1": A}


def test_state_keys_are_owned_by_the_partition_of_their_join_key() -> None:
    """A group's state key by the join key among its values (here its window's start), a bucket by its
    key's bytes, as the two-view join routes them; anything else refused."""
    plan = plan_view("v", JOINS_OF_GROUPS[1], {"a": A, "b": B})
    routing = SubqueryJoinRouting(plan, 4)
    two_views = JoinRouting(plan_view("j", "SELECT a.id, b.bid FROM a JOIN b ON a.k = b.w", {"a": A, "b": B}), 4)
    for start in range(-2, 12, 2):
        owner = two_views.partition_of_key([start])
        assert routing.partitions_of_state_keys([b"($(q))g[%d,%d]" % (start, start + 4), b"j0[%d]" % start,
                                                 b"j1[%d]" % start]) == [owner] * 3
    with pytest.raises(ValueError, match="neither a join bucket nor a subquery's group"):
        routing.partitions_of_state_keys([b"g[3]"])


def test_the_groups_of_a_group_by_over_a_group_by_are_owned_by_their_windows_join_key() -> None:
    plan = plan_view("v", Q5, {"a": A})
    routing = SubqueryJoinRouting(plan, 4)
    assert routing.upstreams() == ("a", "a") and routing.operator_plan().inner[1][1].inner[0][1].sources == ("a#1",)
    for start in range(-2, 12, 2):
        owner = routing.partitions_of_state_keys([b"j0[%d,%d]" % (start, start + 4)])[0]
        assert routing.partitions_of_state_keys([
            b'($(c))g[1,%d,%d]' % (start, start + 4),  # a count per key and window
            b'($(t))g[%d,%d]' % (start, start + 4),  # a window's highest count
            b'($(t))($(m))g[3,%d,%d]' % (start, start + 4),  # the counts it is the highest of
        ]) == [owner] * 3


def test_a_hopping_windows_row_goes_to_each_partition_of_its_windows_once() -> None:
    plan = plan_view("v", JOINS_OF_GROUPS[1], {"a": A, "b": B})
    routing = SubqueryJoinRouting(plan, 4)
    rows = pa.table({"bid": [5, 6, None], "k2": [1.0, None, 2.0], "w": [0, 1, 2]})
    indices, parts = routing.fan_out(1, rows)
    pairs = list(zip(indices.to_pylist(), parts.to_pylist(), strict=True))
    expected = {(i, routing.partitions_of_state_keys([b"($(q))g[%d,%d]" % (s, s + 4)])[0])
                for i, bid in enumerate([5, 6]) for s in (bid - bid % 2 - 2, bid - bid % 2)}
    assert set(pairs) == expected and len(pairs) == len(expected)  # the NULL time: in no window


def test_a_grouped_sides_rows_have_no_one_partition() -> None:
    routing = SubqueryJoinRouting(plan_view("v", JOINS_OF_GROUPS[0], {"a": A, "b": B}), 3)
    with pytest.raises(ValueError, match="is a subquery"):
        routing.partitions_of(1, pa.table({"bid": [1], "k2": [1.0], "w": [1]}))


#: Generated rows: few keys and window times (groups and join keys collide, windows repeat), NULLs in both.
_keys = st.sampled_from([0, 1, 2, None])
_rows_a = st.builds(lambda k, x, s: {"k": k, "x": x, "s": s}, _keys, st.sampled_from([0.5, None]),
                    st.sampled_from(["s0", "s1"]))
_rows_b = st.builds(lambda k2, w: {"k2": k2, "w": w}, st.sampled_from([0.0, 1.0, None]),
                    st.sampled_from([0, 1, 2, None]))
_ops = st.integers(0, 7)
_epochs = st.lists(st.tuples(st.lists(st.tuples(_ops, st.one_of(st.none(), _rows_a)), max_size=6),
                             st.lists(st.tuples(_ops, st.one_of(st.none(), _rows_b)), max_size=6)),
                   min_size=1, max_size=5)


@pytest.mark.parametrize("sql", JOINS_OF_GROUPS)
@settings(max_examples=15, deadline=None)
@given(partitions=st.sampled_from([2, 3, 4]), epochs=_epochs)
def test_any_changes_split_by_their_groups_join_key_give_the_single_operators_changes(
        sql: str, partitions: int,
        epochs: list[tuple[list[tuple[int, dict[str, Any] | None]], list[tuple[int, dict[str, Any] | None]]]]
) -> None:
    """:class:`SplitJoin` over generated inserts, updates and deletes: rows moving between groups, windows and
    join keys, groups emptied and refilled, NULL keys and times (no window) on either side."""
    plan = plan_view("v", sql, {"a": A, "b": B})
    split = SplitJoin(plan, partitions)
    rows: dict[str, dict[int, Row]] = {"a": {}, "b": {}}
    for ops_a, ops_b in epochs:
        changes = {"a": _apply_ops(rows["a"], [(i, None if r is None else {"id": i, **r}) for i, r in ops_a]),
                   "b": _apply_ops(rows["b"], [(i, None if r is None else {"bid": i, **r}) for i, r in ops_b])}
        split.epoch({name: ChangeBatch.from_changes(A if name == "a" else B, changes[name])
                     for name in ("a", "b") if name in plan.sources})
