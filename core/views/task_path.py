"""Which way a view's operator runs in Spark's tasks (``MVLOG_OPERATORS_IN_TASKS``), decided in one place:
the task path of the view consumer takes it, and ``mvlog create-view`` tells the user in one phrase
whether the view scales out over executors or stays on the driver, and why.

The order matters: a view an operator-key routing takes (a join, a top-N, a union, a GROUP BY over a
GROUP BY: :mod:`mvlog.views.keyed_routing`) goes that way; a one-upstream view keyed like its upstream
needs no shuffle (:mod:`mvlog.views.partitioning`); a one-upstream view passing its key through under
other names, or grouped by key, is shuffled once (:mod:`mvlog.views.key_routing`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mvlog.views.join_groups_routing import JoinGroupsRouting
from mvlog.views.join_routing import JoinRouting, top_n_over_join
from mvlog.views.key_routing import KeyRouting, one_upstream_routing
from mvlog.views.keyed_routing import OperatorKeyRouting, operator_key_routing
from mvlog.views.nested_routing import NestedAggregateRouting
from mvlog.views.partitioning import runs_in_tasks
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import GroupRouting
from mvlog.views.subquery_join_routing import SubqueryJoinRouting
from mvlog.views.topn_routing import TopNRouting
from mvlog.views.union_routing import UnionRouting


@dataclass(frozen=True)
class Upstream:
    """What the choice needs of an upstream: its key columns and its changelog's partition count."""

    key: tuple[str, ...]
    partitions: int


@dataclass(frozen=True)
class TaskPath:
    """The view's task path: ``routing`` None is a task per partition with no shuffle."""

    routing: GroupRouting | KeyRouting | OperatorKeyRouting | None


def task_path(plan: ViewPlan, upstreams: Sequence[Upstream], partitions: int) -> TaskPath | None:
    """How the view's operator runs in tasks over ``partitions`` partitions (``upstreams``: the views it
    reads, in its sources' order), or None when it runs on the driver."""
    if (keyed := operator_key_routing(plan, partitions)) is not None:
        return TaskPath(keyed)
    if len(upstreams) != 1:
        return None
    upstream = upstreams[0]
    if runs_in_tasks(plan, upstream.key, upstream.partitions, partitions):
        return TaskPath(None)
    if (routing := one_upstream_routing(plan, upstream.key, partitions)) is not None:
        return TaskPath(routing)
    return None


def describe(path: TaskPath | None, plan: ViewPlan | None = None) -> str:
    """One phrase for people: where the operator runs and how its rows are spread over the tasks; for a view
    on the driver, what in ``plan`` keeps it there when it is one of the known shapes."""
    if path is None:
        why = _why_on_driver(plan) if plan is not None else None
        shape = f"its {why}" if why else "its operator's shape is not one the tasks run yet"
        return (f"on the driver: {shape} (docs/scaling.md lists the shapes); it still reads through Spark and "
                "commits its epochs as any view")
    routing = path.routing
    if routing is None:
        return "in Spark's tasks, a task per changelog partition, no shuffle (keyed like its upstream)"
    how = _shuffles(routing)
    return f"in Spark's tasks, a task per changelog partition, {how}"


def _why_on_driver(plan: ViewPlan) -> str | None:
    """What keeps a view's operator on the driver, for the shapes docs/scaling.md lists as not run in tasks
    yet (each needs one more keyed step in the task jobs); None for another shape."""
    query = plan.query
    inner = dict(plan.inner)
    if len(query.sources) == 2 and query.joins and any(s.view in inner and inner[s.view].query.is_aggregate
                                                       for s in query.sources):
        return ("join compares a GROUP BY subquery's column that its groups do not fix (an aggregate's result, "
                "or a group compared as another type): the groups would be folded in a step before the join")
    if len(query.sources) > 2 and query.joins:
        return "joins compare other columns from one step to the next: a shuffle per step"
    if query.top_n is not None and query.joins:
        return "top-N ranks joined rows by other columns than one side's join key: a ranking step after the join"
    if plan.union:
        return "UNION ALL has a branch of a shape the tasks do not run in a union yet"
    return None


def _shuffles(routing: GroupRouting | KeyRouting | OperatorKeyRouting) -> str:
    if isinstance(routing, KeyRouting):
        return "its rows shuffled by the partition of the key they will have"
    if isinstance(routing, GroupRouting):
        return "its rows shuffled by group, each group's state read and staged by its task"
    if isinstance(routing, TopNRouting):
        return "its rows shuffled by ranking group, then its changes by view key"
    if isinstance(routing, UnionRouting):
        return "each branch's rows shuffled to where its state is kept, then the changes by view key"
    if isinstance(routing, JoinGroupsRouting):
        return ("its rows shuffled by join key, where the join and the subquery's groups run, the subquery's "
                "changes by the outer groups, then by view key")
    if isinstance(routing, SubqueryJoinRouting):
        return ("its rows shuffled by the join key they will have, where its subqueries (their groups) and the "
                "join run, then its changes by view key")
    if isinstance(routing, NestedAggregateRouting):
        return "its rows shuffled by the inner groups, the subquery's changes by the outer groups, then by view key"
    assert isinstance(routing, JoinRouting)
    if routing.groups is not None:  # a GROUP BY over the join
        return "its rows shuffled by join key, the joined rows by group, then the changes by view key"
    if top_n_over_join(routing.plan):
        return "its rows shuffled by join key (joined and ranked there), then its changes by view key"
    return "its rows shuffled by join key, then its changes by view key"
