"""The views whose operator runs in Spark's tasks in two shuffles: first by the key its state is kept under (an
equi-join's join key, a top-N's PARTITION BY values; a union's, each branch's: a GROUP BY's group, a filter's
input row's own key; a join of subqueries', the join key each row will have), then by the view's key for
the changelog partitions (issue 19 item 2). Their routings share one interface (the sources read, each side's
input name, the operator's plan, where each input row goes, ``fan_out``: a windowed inner GROUP BY's row to
each partition of its windows, the first step's operator of each partition, ``first_step``: its share of a
windowed or global inner GROUP BY, and the partition of each state key), so the same jobs
(:mod:`mvlog.services.pipeline.join_tasks`) run them all on every path: live, catch-up, chunked backfill,
rebuild after a wipe, ``replay derive`` and replacement hydration.
"""

from __future__ import annotations

from mvlog.views.join_groups_routing import JoinGroupsRouting, aggregate_over_join_groups
from mvlog.views.join_routing import JoinRouting, routed_by_join_key
from mvlog.views.nested_routing import NestedAggregateRouting, aggregate_over_aggregate
from mvlog.views.plan import ViewPlan
from mvlog.views.subquery_join_routing import SubqueryJoinRouting, join_of_subqueries
from mvlog.views.topn_routing import TopNRouting, top_n_of_one_view
from mvlog.views.union_routing import UnionRouting, routed_union

#: How a view of two shuffles routes its input and state.
OperatorKeyRouting = (JoinRouting | TopNRouting | UnionRouting | NestedAggregateRouting | JoinGroupsRouting
                      | SubqueryJoinRouting)


def routed_by_operator_key(plan: ViewPlan) -> bool:
    """An equi-join of two sources or a chain of them on one key (or a GROUP BY over one, or a top-N over
    one ranked per join key), a top-N of one view, a union of filter, GROUP BY (windowed and global too) and
    join branches, a GROUP BY over a GROUP BY of one view (windowed or global too), or over a join's GROUP BY
    by one side's join key (Nexmark q4), or a join of GROUP BY subqueries grouped by its key (Nexmark q8)."""
    return (routed_by_join_key(plan) or top_n_of_one_view(plan) or routed_union(plan) or aggregate_over_aggregate(plan)
            or aggregate_over_join_groups(plan) or join_of_subqueries(plan))


def operator_key_routing(plan: ViewPlan, partitions: int) -> OperatorKeyRouting | None:
    """The view's routing by operator key over ``partitions`` partitions, or None when its operator does not
    run this way (:func:`routed_by_operator_key`)."""
    if routed_by_join_key(plan):
        return JoinRouting(plan, partitions)
    if top_n_of_one_view(plan):
        return TopNRouting(plan, partitions)
    if routed_union(plan):
        return UnionRouting(plan, partitions)
    if aggregate_over_aggregate(plan):
        return NestedAggregateRouting(plan, partitions)
    if aggregate_over_join_groups(plan):
        return JoinGroupsRouting(plan, partitions)
    if join_of_subqueries(plan):
        return SubqueryJoinRouting(plan, partitions)
    return None
