"""Which way a view's operator runs in Spark's tasks (:mod:`mvlog.views.task_path`), the one decision the
view consumer's task path and ``mvlog create-view``'s last line share."""

from __future__ import annotations

import pytest

from mvlog.row_schema import RowSchema
from mvlog.views import plan_view
from mvlog.views.join_groups_routing import JoinGroupsRouting
from mvlog.views.join_routing import JoinRouting
from mvlog.views.key_routing import KeyRouting
from mvlog.views.nested_routing import NestedAggregateRouting
from mvlog.views.routing import GroupRouting
from mvlog.views.subquery_join_routing import SubqueryJoinRouting
from mvlog.views.task_path import Upstream, describe, task_path
from mvlog.views.topn_routing import TopNRouting
from mvlog.views.union_routing import UnionRouting

T = RowSchema.of({"id": "int", "k": "int", "v": "int"}, ["id"])
U = RowSchema.of({"uid": "int", "k": "int"}, ["uid"])
LAYOUT = {"t": Upstream(("id",), 3), "u": Upstream(("uid",), 3)}


@pytest.mark.parametrize(("sql", "partitions", "kind", "phrase"), [
    ("SELECT id, v FROM t WHERE v > 0", 3, None, "no shuffle"),
    ("SELECT id, v FROM t WHERE v > 0", 2, KeyRouting, "by the partition of the key they will have"),
    ("SELECT id AS tid, v FROM t", 3, KeyRouting, "by the partition of the key they will have"),
    ("SELECT k, count(*) AS n FROM t GROUP BY k", 3, GroupRouting, "shuffled by group"),
    ("SELECT t.id, u.uid FROM t JOIN u ON t.k = u.k", 3, JoinRouting, "by join key, then its changes by view key"),
    ("SELECT t.k, count(*) AS n FROM t JOIN u ON t.k = u.k GROUP BY t.k", 3, JoinRouting, "the joined rows by group"),
    ("SELECT id, uid FROM (SELECT t.id, u.uid, ROW_NUMBER() OVER (PARTITION BY t.k ORDER BY u.uid) AS rn "
     "FROM t JOIN u ON t.k = u.k) r WHERE rn = 1", 3, JoinRouting, "joined and ranked there"),
    ("SELECT id, k, rn FROM (SELECT id, k, ROW_NUMBER() OVER (PARTITION BY k ORDER BY id) AS rn FROM t) r "
     "WHERE rn <= 2", 3, TopNRouting, "by ranking group"),
    ("SELECT id, v FROM t UNION ALL SELECT uid, k FROM u", 3, UnionRouting, "each branch's rows"),
    ("SELECT n, count(*) AS c FROM (SELECT k, count(*) AS n FROM t GROUP BY k) s GROUP BY n", 3,
     NestedAggregateRouting, "by the inner groups"),
    ("SELECT n, count(*) AS c FROM (SELECT t.k, max(u.uid) AS n FROM t JOIN u ON t.k = u.k GROUP BY t.k) s "
     "GROUP BY n", 3, JoinGroupsRouting, "where the join and the subquery's groups run"),
    ("SELECT a.k, a.n, b.m FROM (SELECT k, count(*) AS n FROM t GROUP BY k) a JOIN (SELECT k, max(uid) AS m "
     "FROM u GROUP BY k) b ON a.k = b.k", 3, SubqueryJoinRouting, "by the join key they will have"),
])
def test_each_shape_takes_its_routing_and_says_how(sql: str, partitions: int, kind: type | None,
                                                   phrase: str) -> None:
    plan = plan_view("v", sql, {"t": T, "u": U})
    path = task_path(plan, [LAYOUT[s] for s in plan.sources], partitions)
    assert path is not None
    assert (path.routing is None) if kind is None else isinstance(path.routing, kind)
    text = describe(path)
    assert text.startswith("in Spark's tasks, a task per changelog partition") and phrase in text, text


@pytest.mark.parametrize(("sql", "why"), [
    # A chain of joins whose second step compares another column: a shuffle per step.
    ("SELECT t.id, u.uid, w.id AS wid FROM t JOIN u ON t.k = u.k JOIN t w ON u.uid = w.v", "a shuffle per step"),
    # Nexmark q7's shape: the join key is an aggregate's result.
    ("SELECT t.id FROM t JOIN (SELECT k, max(v) AS hi FROM t GROUP BY k) m ON t.v = m.hi", "its groups do not fix"),
    ("SELECT id, uid FROM (SELECT t.id, u.uid, ROW_NUMBER() OVER (PARTITION BY t.v ORDER BY u.uid) AS rn "
     "FROM t JOIN u ON t.k = u.k) r WHERE rn = 1", "ranks joined rows by other columns"),
])
def test_a_shape_the_tasks_do_not_run_stays_on_the_driver_and_says_why(sql: str, why: str) -> None:
    plan = plan_view("v", sql, {"t": T, "u": U})
    assert task_path(plan, [LAYOUT[s] for s in plan.sources], 3) is None
    text = describe(None, plan)
    assert text.startswith("on the driver: its ") and why in text, text
    assert describe(None).startswith("on the driver: its operator's shape is not one the tasks run yet")
