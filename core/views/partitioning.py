"""Whether a view's operator can run in Spark's tasks, one per changelog partition, without a shuffle.

A task holds one partition of the upstream's epoch and writes one partition of the view's (issue 19,
first slice). That needs an operator that keeps no state (a filter/project: each output row comes from
one input row of the same epoch, so any task computes it alone, and recomputing it gives the same
changes) and an output key that is the upstream's key, column for column (the encoded key, so its vnode
and partition, are the upstream's): upstream partition ``p`` then holds exactly the changes of view
partition ``p`` when both changelogs have as many partitions. Anything else runs on the driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from mvlog.views.expr import ColumnRef
from mvlog.views.plan import ViewPlan


def stateless_key_preserving(plan: ViewPlan, upstream_key: Sequence[str]) -> bool:
    """A filter/project over one upstream whose key columns are the upstream's, passed through."""
    query = plan.query
    if (plan.inner or plan.union or len(query.sources) != 1 or query.is_aggregate or query.top_n is not None
            or query.window is not None or query.joins):
        return False
    if tuple(plan.schema.primary_key) != tuple(upstream_key):
        return False
    outputs = {o.name: o.expr for o in query.outputs}
    return all(isinstance(e := outputs.get(name), ColumnRef) and e.side == 0 and e.column == name
               for name in upstream_key)


def runs_in_tasks(plan: ViewPlan, upstream_key: Sequence[str], upstream_partitions: int,
                  view_partitions: int) -> bool:
    """The view's epochs can be computed and written by one task per partition, with no shuffle."""
    return upstream_partitions == view_partitions and stateless_key_preserving(plan, upstream_key)
