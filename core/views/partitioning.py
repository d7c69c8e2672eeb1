"""Whether a view's operator can run in Spark's tasks, one per changelog partition, without a shuffle.

A task holds one partition of the upstream's epoch and writes one partition of the view's (issue 19,
first slice). That needs an operator that keeps no state (a filter/project: each output row comes from
one input row of the same epoch, so any task computes it alone, and recomputing it gives the same
changes) and an output key that is the upstream's key, column for column (the encoded key, so its vnode
and partition, are the upstream's): upstream partition ``p`` then holds exactly the changes of view
partition ``p`` when both changelogs have as many partitions.

The names matter: a changelog key is an Avro map, column name -> value (``schemas/key.avsc``), so the
same values under another name (``SELECT id AS order_id``) are other bytes, another vnode, another
partition. A view that passes its upstream's key through under other names, or has another partition
count, is still stateless but needs a shuffle by the partition of its own key
(:mod:`mvlog.views.key_routing`, :func:`passes_key_through`). Anything else (but the GROUP BYs and joins
with their own routing) runs on the driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from mvlog.views.expr import ColumnRef
from mvlog.views.plan import ViewPlan


def passes_key_through(plan: ViewPlan, upstream_key: Sequence[str]) -> bool:
    """A filter/project over one upstream whose key is the upstream's key columns, in order, each passed
    through unchanged (a column reference: the same values of the same type), under any names."""
    query = plan.query
    if (plan.inner or plan.union or len(query.sources) != 1 or query.is_aggregate or query.top_n is not None
            or query.window is not None or query.joins):
        return False
    if len(plan.schema.primary_key) != len(upstream_key):
        return False
    outputs = {o.name: o.expr for o in query.outputs}
    return all(isinstance(e := outputs.get(name), ColumnRef) and e.side == 0 and e.column == column
               for name, column in zip(plan.schema.primary_key, upstream_key, strict=True))


def stateless_key_preserving(plan: ViewPlan, upstream_key: Sequence[str]) -> bool:
    """A filter/project over one upstream whose key columns are the upstream's, passed through under the
    same names: the same encoded keys, so the same vnodes."""
    return tuple(plan.schema.primary_key) == tuple(upstream_key) and passes_key_through(plan, upstream_key)


def runs_in_tasks(plan: ViewPlan, upstream_key: Sequence[str], upstream_partitions: int,
                  view_partitions: int) -> bool:
    """The view's epochs can be computed and written by one task per partition, with no shuffle."""
    return upstream_partitions == view_partitions and stateless_key_preserving(plan, upstream_key)
