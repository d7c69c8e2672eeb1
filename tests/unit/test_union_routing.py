"""The pure parts of a ``UNION ALL`` in Spark's tasks (issue 19, item 2): which views take the union's
routing, that one operator per partition (each branch's rows routed by its group, its windows', its global
row's or their own key)
followed by a consolidation per view partition gives the single operator's changes and state (the join's
two steps, :class:`SplitJoin`), and how each branch is a side of its own. No broker, no Spark: the
shuffles run in ``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.views import ChangeBatch, plan_view
from mvlog.views.join_routing import JoinRouting
from mvlog.views.keyed_routing import operator_key_routing, routed_by_operator_key
from mvlog.views.routing import partitions_table, view_key_partitions
from mvlog.views.subquery_join_routing import SubqueryJoinRouting
from mvlog.views.union_routing import UnionRouting, routed_union

from .test_join_routing import A, B, SplitJoin, _a, _b, _changes

UNIONS = [
    # Two views, WHERE in each branch, a column whose types combine (int and float).
    "SELECT id, k FROM a WHERE x IS NOT NULL UNION ALL SELECT bid, k2 FROM b WHERE w > 0",
    # One view read by both branches (a row in both, most often in two view partitions).
    "SELECT id, s FROM a WHERE k > 1 UNION ALL SELECT id, s FROM a WHERE k <= 2",
    # Three branches, a computed column, one view twice.
    "SELECT id, k + 1 AS v FROM a UNION ALL SELECT bid, w FROM b UNION ALL SELECT id, k FROM a WHERE s = 's1'",
    # GROUP BY branches (state per group, under each branch's prefix), beside a filter of the same view.
    "SELECT k, count(*) AS n FROM a GROUP BY k UNION ALL SELECT w, sum(bid) AS n FROM b GROUP BY w",
    "SELECT s, max(k) AS n FROM a WHERE x IS NOT NULL GROUP BY s HAVING count(*) > 1 "
    "UNION ALL SELECT s, k FROM a WHERE k > 1 UNION ALL SELECT s, min(id) AS n FROM a GROUP BY s",
    # Join branches: a side per source, routed by the branch's join key (its buckets there): an inner join
    # beside a filter of one of its views, an outer join and a self-join beside a GROUP BY, a chain of a.
    "SELECT a.id, b.w FROM a JOIN b ON a.k = b.k2 UNION ALL SELECT bid, w FROM b WHERE w > 0",
    "SELECT a.id, b.bid FROM a LEFT JOIN b ON a.k = b.k2 UNION ALL SELECT k, count(*) AS n FROM a GROUP BY k "
    "UNION ALL SELECT x.id, y.id AS yid FROM a x FULL JOIN a y ON x.k = y.id",
    "SELECT x.id, z.id AS zid FROM a x JOIN a y ON x.k = y.k LEFT JOIN a z ON y.k = z.k AND z.id > y.id "
    "UNION ALL SELECT id, k FROM a",
    # A global aggregate branch (its one row kept by its partition's task alone) and a hopping window's (a
    # row to each partition of its windows, each task's branch keeping its own windows).
    "SELECT count(*) AS n, sum(k) AS t FROM a UNION ALL SELECT bid, w FROM b "
    "UNION ALL SELECT window.start, count(*) AS n FROM a GROUP BY window(id, '4 milliseconds', '2 milliseconds')",
    "SELECT k, window.start AS ws, max(id) AS hi FROM a GROUP BY k, window(id, '6 milliseconds', '3 milliseconds') "
    "UNION ALL SELECT k, id, id AS i2 FROM a WHERE k > 1",
    # Semi and anti join branches: a side for the FROM view, one for the view the subquery reads (routed by
    # the columns it passes through); the same view in a filter branch, and the subquery over the FROM view.
    "SELECT id, k FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w > -2) UNION ALL SELECT bid, w FROM b",
    "SELECT a.id, a.s FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k2 = a.k AND b.w <> 0) "
    "UNION ALL SELECT id, s FROM a WHERE k > 1 UNION ALL SELECT a.id, a.s FROM a WHERE a.k IN (SELECT k2 FROM b)",
    "SELECT x.id, x.k FROM a x WHERE EXISTS (SELECT 1 FROM a y WHERE y.k = x.id) "
    "UNION ALL SELECT k, count(*) AS n FROM a GROUP BY k",
    # Branches through a filter/project subquery: a filter's rows by their own key, a GROUP BY's by the group
    # of the subquery's row (none when its WHERE drops it); a WITH query read by two branches.
    "SELECT id, s FROM (SELECT id, s FROM a WHERE k > 0) t UNION ALL SELECT bid, 'b' FROM b",
    "SELECT k, count(*) AS n FROM (SELECT k % 3 AS k, id FROM a WHERE x > 0) u GROUP BY k "
    "UNION ALL SELECT id, k FROM a WHERE k > 1",
    "WITH f AS (SELECT id, k, x FROM a WHERE s <> 's0') SELECT id, k FROM f WHERE x > 0 "
    "UNION ALL SELECT k, sum(id) AS n FROM f GROUP BY k",
    # Joins of subqueries grouped by the join key (Nexmark q8's shape): a side per source, each routed by
    # the join key of its rows' groups; two GROUP BYs, a LEFT JOIN of a filter with a GROUP BY, and the
    # hopping windows of one view on both sides (a row to each partition of its windows, per side).
    "SELECT p.k, q.n FROM (SELECT k, count(*) AS n FROM a GROUP BY k) p "
    "JOIN (SELECT w, count(*) AS n FROM b GROUP BY w) q ON p.k = q.w UNION ALL SELECT bid, w FROM b",
    "SELECT x.id, q.n FROM (SELECT id, k FROM a WHERE s <> 's0') x LEFT JOIN "
    "(SELECT w, count(*) AS n FROM b GROUP BY w) q ON x.k = q.w UNION ALL SELECT id, k FROM a",
    "SELECT p.k, p.n, q.m FROM (SELECT k, window.start AS ws, count(*) AS n FROM a "
    "GROUP BY k, window(id, '4 milliseconds', '2 milliseconds')) p JOIN (SELECT k, window.start AS ws, "
    "max(id) AS m FROM a WHERE x IS NOT NULL GROUP BY k, window(id, '4 milliseconds', '2 milliseconds')) q "
    "ON p.k = q.k AND p.ws = q.ws UNION ALL SELECT k, count(*) AS n, sum(id) AS m FROM a GROUP BY k",
]


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in UNIONS),
    ("SELECT a.k, count(*) AS n FROM a JOIN b ON a.k = b.k2 GROUP BY a.k UNION ALL SELECT bid, w FROM b",
     False),  # an aggregate over a join: a third step
    ("SELECT id, k FROM a WHERE k IN (SELECT k2 + 1 FROM b) UNION ALL SELECT bid, w FROM b",
     False),  # a semi join whose subquery computes its join key: not a column of b
    ("SELECT a.id, b.w FROM a JOIN b ON a.k = b.k2 JOIN a c ON b.w = c.id UNION ALL SELECT bid, w FROM b",
     False),  # a chain on two keys
    ("SELECT n, count(*) AS c FROM (SELECT k, count(*) AS n FROM a GROUP BY k) s GROUP BY n "
     "UNION ALL SELECT bid, w FROM b", False),  # a GROUP BY over a GROUP BY: a step by the outer groups
    ("SELECT a.id FROM a JOIN (SELECT w, max(bid) AS hi FROM b GROUP BY w) q ON a.id = q.hi "
     "UNION ALL SELECT bid FROM b", False),  # a join on an aggregate's result: a step before the join
    ("SELECT id, k FROM a WHERE k > 0", False),  # not a union
])
def test_which_views_the_union_routing_takes(sql: str, taken: bool) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B})
    assert routed_union(plan) is taken
    assert isinstance(operator_key_routing(plan, 3), UnionRouting) is taken
    if taken:
        assert routed_by_operator_key(plan)


def _epochs(split: SplitJoin, rng: random.Random, count: int) -> None:
    rows_a: dict[int, dict[str, object]] = {}
    rows_b: dict[int, dict[str, object]] = {}
    for _ in range(count):
        inputs = {"a": ChangeBatch.from_changes(A, _changes(rng, rows_a, 14, _a))}
        if "b" in split.plan.sources:
            inputs["b"] = ChangeBatch.from_changes(B, _changes(rng, rows_b, 14, _b))
        split.epoch(inputs)


@pytest.mark.parametrize("sql", UNIONS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_input_keys_computed_apart_then_consolidated_per_view_partition_give_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """Each task runs every branch over the input rows of its keys, no state; the view rows it emits are
    routed to their view partitions and consolidated there; the union is the single operator's."""
    split = SplitJoin(plan_view("v", sql, {"a": A, "b": B}), partitions)
    _epochs(split, random.Random(partitions * 13 + len(sql)), 10)
    assert split.view, "the union ended empty: nothing passed its branches"
    grouped = any(word in sql for word in ("GROUP BY", "JOIN", "EXISTS", " IN ("))
    assert bool(split.whole.data) is grouped, "a GROUP BY or join branch keeps state per key, a filter none"
    if "GROUP BY w" in sql:  # b's groups of a few rows each
        assert split.emptied > 0, "no group emptied: its state delete went untested"


@settings(max_examples=30, deadline=None)
@given(sql=st.sampled_from(UNIONS), partitions=st.sampled_from([2, 3, 5]), seed=st.integers(0, 2**16))
def test_any_changes_split_by_input_key_give_the_single_operators_changes(sql: str, partitions: int,
                                                                            seed: int) -> None:
    _epochs(SplitJoin(plan_view("v", sql, {"a": A, "b": B}), partitions), random.Random(seed), 6)


def test_each_branch_is_a_side_routed_by_its_group_or_its_rows_own_key() -> None:
    """A view two branches read is a side per branch, each under its own input name, so each branch's
    operator gets the rows routed for it: a GROUP BY branch's by group (its state keys' owner), a filter
    branch's by the row's own key, where ``a``'s own changelog would put it over as many partitions."""
    routing = UnionRouting(plan_view("v", UNIONS[4], {"a": A, "b": B}), 4)
    assert routing.upstreams() == ("a", "a", "a")
    assert routing.inputs() == ("a#b0", "a#b1", "a#b2")
    assert routing.operator_plan().sources == routing.inputs()
    rows = pa.Table.from_pylist([_a(random.Random(i), i) for i in range(40)])
    assert routing.partitions_of(1, rows) == view_key_partitions(A, rows.select(["id"]), partitions_table(4))
    assert len(set(routing.partitions_of(1, rows).to_pylist())) == 4
    by_group = routing.partitions_of(0, rows).to_pylist()
    for s in {row["s"] for row in rows.to_pylist()}:  # one partition per group of s, in both GROUP BY branches
        assert len({p for p, row in zip(by_group, rows.to_pylist(), strict=True) if row["s"] == s}) == 1
    assert routing.partitions_of(2, rows).to_pylist() == by_group
    with pytest.raises(ValueError, match="not a GROUP BY or join branch's state key"):
        routing.partitions_of_state_keys([b"g[1]"])


def test_a_join_branch_is_a_side_per_source_routed_by_its_join_key() -> None:
    """A join branch's sources are sides of their own (``<view>#b<branch>.<source>``), each routed by the
    branch's join key, and its buckets' owner is that key's, under the branch's prefix."""
    plan = plan_view("v", UNIONS[6], {"a": A, "b": B})
    routing = UnionRouting(plan, 4)
    assert routing.upstreams() == ("a", "b", "a", "a", "a")
    assert routing.inputs() == ("a#b0.0", "b#b0.1", "a#b1", "a#b2.0", "a#b2.1")
    branch = routing.operator_plan().inner[0][1]
    assert branch.sources == ("a#b0.0", "b#b0.1")
    assert [source.view for source in branch.query.sources] == ["a#b0.0", "b#b0.1"]
    rows = pa.Table.from_pylist([_a(random.Random(i), i) for i in range(40)])
    join = JoinRouting(plan.inner[0][1], 4)
    assert routing.partitions_of(0, rows) == join.partitions_of(0, rows)
    self_join = JoinRouting(plan.inner[2][1], 4)
    assert routing.partitions_of(4, rows) == self_join.partitions_of(1, rows)  # by y.id: a row's own id
    assert routing.partitions_of(3, rows) != routing.partitions_of(4, rows)
    prefix = b"(" + plan.inner[0][0].encode() + b")"
    assert routing.partitions_of_state_keys([prefix + b"j1[1.0]"]) == join.partitions_of_state_keys([b"j1[1.0]"])


def test_a_join_of_subqueries_branch_is_a_side_per_source_routed_by_its_groups_join_key() -> None:
    """A join of GROUP BY subqueries as a branch: each source a side (``<view>#b<branch>.<source>``) whose
    subquery reads it under that name, routed as the join alone routes it (by the join key of the row's
    groups), its groups and buckets owned where that join's are, under the branch's prefix."""
    plan = plan_view("v", UNIONS[16], {"a": A, "b": B})
    routing = UnionRouting(plan, 4)
    assert routing.upstreams() == ("a", "b", "b")
    assert routing.inputs() == ("a#b0.0", "b#b0.1", "b#b1")
    name, branch = routing.operator_plan().inner[0]
    assert branch.sources == ("a#b0.0", "b#b0.1")
    assert [sub.sources for _, sub in branch.inner] == [("a#b0.0",), ("b#b0.1",)]
    join = SubqueryJoinRouting(plan.inner[0][1], 4)
    rows_b = pa.Table.from_pylist([_b(random.Random(i), i) for i in range(40)])
    assert routing.fan_out(1, rows_b) == join.fan_out(1, rows_b)
    prefix = b"(" + name.encode() + b")"
    group = b"($(q))g[3]"
    assert routing.partitions_of_state_keys([prefix + group]) == join.partitions_of_state_keys([group])
    with pytest.raises(ValueError, match="a subquery"):
        routing.partitions_of(1, rows_b)  # a grouped side's rows go by fan_out: several partitions, or none


def test_a_branch_through_a_filter_subquery_routes_the_views_rows() -> None:
    """A GROUP BY branch over a filter/project subquery routes the view's rows by the group the subquery's
    row falls in, and drops the rows its WHERE drops; a filter branch over one routes by the view's key."""
    plan = plan_view("v", UNIONS[14], {"a": A, "b": B})
    routing = UnionRouting(plan, 4)
    assert routing.upstreams() == ("a", "a")
    rows = pa.Table.from_pylist([_a(random.Random(i), i) for i in range(60)])
    kept, parts = routing.fan_out(0, rows)
    positive = [i for i, row in enumerate(rows.to_pylist()) if row["x"] is not None and row["x"] > 0]
    assert kept.to_pylist() == positive and 0 < len(positive) < 60
    by_group: dict[int | None, set[int]] = {}  # k % 3, NULL for a NULL k: a group each, in one partition
    for row, part in zip(rows.take(kept).to_pylist(), parts.to_pylist(), strict=True):
        by_group.setdefault(None if row["k"] is None else row["k"] % 3, set()).add(part)
    assert len(by_group) >= 3 and all(len(owners) == 1 for owners in by_group.values()), by_group
    filtered = UnionRouting(plan_view("v", UNIONS[13], {"a": A, "b": B}), 4)
    assert filtered.partitions_of(0, rows) == view_key_partitions(A, rows.select(["id"]), partitions_table(4))
