"""The pure parts of a GROUP BY over a GROUP BY in Spark's tasks (issue 19, item 2): which views take the
nested routing, and that the inner aggregate per partition of its groups (a windowed one's rows fanned out
to their windows' partitions, a global one's to its row's), its rows routed to the outer groups' partitions
and folded there, gives the single operator's changes and state
(:func:`~tests.unit.test_join_routing.split_aggregate`). No broker, no Spark: the shuffles run in
``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from mvlog.views import plan_view
from mvlog.views.join_groups_routing import JoinGroupsRouting, aggregate_over_join_groups
from mvlog.views.join_routing import JoinRouting
from mvlog.views.keyed_routing import operator_key_routing, routed_by_operator_key
from mvlog.views.nested_routing import NestedAggregateRouting, aggregate_over_aggregate
from mvlog.views.routing import GroupRouting

from .test_join_routing import A, B, C, split_aggregate

NESTED = [
    # A histogram of per-key counts: a change of one k moves its row from one n to another.
    "SELECT n, count(*) AS c, sum(k) AS t FROM (SELECT k, count(*) AS n FROM a GROUP BY k) s GROUP BY n",
    # The same through a WITH query, the outer grouped by a computed value, WHERE and HAVING on both levels.
    "WITH per AS (SELECT s, k, max(x) AS hi, count(*) AS n FROM a WHERE id > 1 GROUP BY s, k HAVING count(*) > 0) "
    "SELECT n % 2 AS odd, count(*) AS c, max(hi) AS top FROM per WHERE k IS NOT NULL GROUP BY n % 2",
    # A global aggregate over per-group sums (its one row folded by one partition's task).
    "SELECT count(*) AS groups, sum(t) AS total, max(t) AS hi FROM (SELECT w, sum(bid) AS t FROM b GROUP BY w) q",
    # Nexmark q5's inner shape: counts per key and hopping window (a row in two windows, often of two
    # partitions; each task's subquery keeps its own windows), then the most per window.
    "SELECT ws, max(n) AS top, count(*) AS c FROM (SELECT k, window.start AS ws, count(*) AS n FROM a "
    "GROUP BY k, window(id, '4 milliseconds', '2 milliseconds')) s GROUP BY ws",
    # Windows only under a GROUP BY of their counts.
    "SELECT n, count(*) AS c FROM (SELECT window.start AS ws, count(*) AS n FROM a "
    "GROUP BY window(id, '4 milliseconds')) s GROUP BY n",
    # A global inner one: its one row kept by its partition's task alone.
    "SELECT n, count(*) AS c FROM (SELECT count(*) AS n, sum(w) AS t FROM b WHERE w > 0) s GROUP BY n",
]


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in NESTED),
    ("SELECT k, count(*) AS c FROM (SELECT k, s FROM a WHERE k > 0) t GROUP BY k", False),  # a stateless one
    ("SELECT n, count(*) AS c FROM (SELECT a.k, count(*) AS n FROM a JOIN b ON a.k = b.k2 GROUP BY a.k) s "
     "GROUP BY n", False),  # over a join: a third step
])
def test_which_views_the_nested_routing_takes(sql: str, taken: bool) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B})
    assert aggregate_over_aggregate(plan) is taken
    assert isinstance(operator_key_routing(plan, 3), NestedAggregateRouting) is taken
    if taken:
        assert routed_by_operator_key(plan)


@pytest.mark.parametrize("sql", NESTED)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_the_inner_groups_apart_then_the_outer_groups_give_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B})
    routing = NestedAggregateRouting(plan, partitions)
    assert routing.upstreams() == routing.inputs() == plan.sources
    split_aggregate(plan, routing, partitions, random.Random(partitions * 5 + len(sql)))


def test_state_keys_of_the_subquery_are_owned_by_its_groups_partitions() -> None:
    plan = plan_view("v", NESTED[0], {"a": A})
    routing = NestedAggregateRouting(plan, 4)
    inner = GroupRouting(plan.inner[0][1], 4)
    assert routing.partitions_of_state_keys([b"($(s))g[3]", b"($(s))g[null]"]) == \
        inner.partitions_of_state_keys([b"g[3]", b"g[null]"])
    with pytest.raises(ValueError, match="not its subquery's state key"):
        routing.partitions_of_state_keys([b"g[3]"])  # the outer groups' state is the second step's


#: A GROUP BY over a join's GROUP BY by one side's join key (Nexmark q4's shape): the join and the inner
#: groups in the join key's task, the outer groups after.
OVER_JOIN_GROUPS = [
    # The highest of each a's b rows (a.id is the join key, a.s rides along), then per s.
    "SELECT s, avg(hi) AS a, count(*) AS n, max(hi) AS top FROM (SELECT a.id, a.s, max(b.k2) AS hi FROM a "
    "JOIN b ON a.id = b.w WHERE b.bid > a.k GROUP BY a.id, a.s) q GROUP BY s",
    # Grouped by the other side's key column, and a computed column, under a global aggregate.
    "SELECT count(*) AS groups, sum(n) AS total FROM (SELECT b.w, a.k % 2 AS odd, count(*) AS n FROM a "
    "JOIN b ON a.id = b.w GROUP BY b.w, a.k % 2) q",
    # Windowed inner groups (a joined row in two hopping windows, both groups of its join key's task).
    "SELECT ws, max(n) AS top, count(*) AS c FROM (SELECT a.id, window.start AS ws, count(*) AS n FROM a "
    "JOIN b ON a.id = b.w GROUP BY a.id, window(b.bid, '4 milliseconds', '2 milliseconds')) q GROUP BY ws",
    # Outer joins grouped by their preserved side's key: a LEFT JOIN's null-extended rows counted 0 (each
    # in its left key's task); a RIGHT JOIN's right rows of a NULL key all in partition 0, whose group it is.
    # (a.k and c.k3 are NULL in some rows: those rows and their group in partition 0's task).
    "SELECT n, count(*) AS c FROM (SELECT a.k, count(c.cid) AS n FROM a LEFT JOIN c ON a.k = c.k3 "
    "GROUP BY a.k) q GROUP BY n",
    "SELECT hi, count(*) AS c, sum(n) AS t FROM (SELECT c.k3, max(a.s) AS hi, count(*) AS n FROM a "
    "RIGHT JOIN c ON a.id = c.k3 GROUP BY c.k3) q GROUP BY hi",
    # A self-join, grouped by its second side's join key (each side reads an input of its own in the task).
    "SELECT n, count(*) AS c, max(hi) AS top FROM (SELECT y.k, count(*) AS n, max(x.s) AS hi FROM a x "
    "JOIN a y ON x.id = y.k GROUP BY y.k) q GROUP BY n",
]


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in OVER_JOIN_GROUPS),
    ("SELECT n, count(*) AS c FROM (SELECT a.s, count(*) AS n FROM a JOIN b ON a.id = b.w GROUP BY a.s) q "
     "GROUP BY n", False),  # no join key among the inner groups
    ("SELECT n, count(*) AS c FROM (SELECT b.w, count(*) AS n FROM a LEFT JOIN b ON a.id = b.w GROUP BY b.w) q "
     "GROUP BY n", False),  # an outer join grouped by the key its null-extended rows lack
    ("SELECT n, count(*) AS c FROM (SELECT a.id, count(*) AS n FROM a FULL JOIN b ON a.id = b.w GROUP BY a.id) q "
     "GROUP BY n", False),  # a FULL join: each side's rows may lack the other's key
    ("SELECT n, count(*) AS c FROM (SELECT a.k, count(*) AS n FROM a JOIN b ON a.k = b.k2 GROUP BY a.k) q "
     "GROUP BY n", False),  # the key grouped as int, compared as float
])
def test_which_views_the_join_groups_routing_takes(sql: str, taken: bool) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B, "c": C})
    assert aggregate_over_join_groups(plan) is taken
    assert isinstance(operator_key_routing(plan, 3), JoinGroupsRouting) is taken


@pytest.mark.parametrize("sql", OVER_JOIN_GROUPS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_the_join_and_its_groups_per_join_key_then_the_outer_groups_give_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B, "c": C})
    routing = JoinGroupsRouting(plan, partitions)
    other = "a" if " JOIN a " in sql else "c" if " JOIN c " in sql else "b"
    assert routing.upstreams() == ("a", other)
    assert routing.inputs() == ("a", "a#1" if other == "a" else other)
    split_aggregate(plan, routing, partitions, random.Random(partitions * 7 + len(sql)))


def test_the_inner_groups_state_is_owned_by_the_partition_of_their_join_key() -> None:
    plan = plan_view("v", OVER_JOIN_GROUPS[0], {"a": A, "b": B})
    routing = JoinGroupsRouting(plan, 4)
    join = JoinRouting(plan.inner[0][1], 4)
    for id_ in range(20):
        owner = join.partitions_of(0, pa.table({"id": [id_]})).to_pylist()[0]
        assert routing.partitions_of_state_keys([b'($(q))g[%d,"s1"]' % id_, b"($(q))j0[%d]" % id_]) == [owner, owner]
    with pytest.raises(ValueError, match="not its subquery's state key"):
        routing.partitions_of_state_keys([b"g[3]"])  # the outer groups' state is the second step's
