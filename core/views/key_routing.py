"""Which changelog partition a stateless view's input row belongs to when the view passes its upstream's
key through but its rows are not where the upstream's are: key columns renamed (``SELECT id AS
order_id``), or another partition count (issue 19 item 2, filter/project views in Spark's tasks).

A changelog key is an Avro map, column name -> value (``schemas/key.avsc``): the bytes ``encode_batch``
gives a view row, so its vnode (``vnode_of``) and partition, depend on the key columns' names as well as
their values. A view keyed like its upstream under the same names writes each row to the partition its
input came from, no shuffle (:mod:`mvlog.views.partitioning`); under other names or over another
partition count it does not, so its input is shuffled by Spark as a GROUP BY's is (``RouteRows``): each
input row goes to the partition of the view key it will have, the upstream key's values (passed through
unchanged: the same values, the same types) under the view's key names. A change's retraction and
assertion carry the same key, so both go to one partition, and the operator keeps no state, so a task
needs nothing but its rows.

Pure: Arrow in, partitions out; the Spark shuffle that uses it is in ``mvlog.services.pipeline``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from mvlog.views.evaluate import arrow_type
from mvlog.views.partitioning import passes_key_through
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import GroupRouting, each_row_once, grouped_by_key, partitions_table, view_key_partitions
from mvlog.views.share import WHOLE, OperatorShare


@dataclass(frozen=True)
class KeyRouting:
    """Routes a stateless view's input rows (its upstream's columns, by name) to the view's partitions by
    its passed-through key."""

    plan: ViewPlan
    upstream_key: tuple[str, ...]  # the upstream's key columns, in order
    partitions: int  # the view's
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not passes_key_through(self.plan, self.upstream_key):
            raise ValueError(f"view {self.plan.name!r} does not pass its upstream's key through")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))

    def partitions_of(self, rows: pa.Table) -> pa.Array:
        """The view partition (int32) of each row of ``rows`` (the upstream's columns, by name)."""
        schema = self.plan.schema
        key = pa.table({name: rows.column(column).cast(arrow_type(schema.column(name).type))
                        for name, column in zip(schema.primary_key, self.upstream_key, strict=True)})
        return view_key_partitions(schema, key, self._of_vnode)

    def fan_out(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of ``rows`` goes, as :meth:`GroupRouting.fan_out` says: one partition a row."""
        return each_row_once(self.partitions_of(rows))

    def share(self, partition: int) -> OperatorShare:
        """Every row a task gets is its own (:meth:`GroupRouting.share`)."""
        return WHOLE

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """None: the view keeps no operator state, so any state key it writes is an error."""
        if keys:
            raise ValueError(f"view {self.plan.name!r} keeps no operator state, yet wrote {list(keys)[:3]!r}")
        return []


def one_upstream_routing(plan: ViewPlan, upstream_key: Sequence[str], partitions: int
                         ) -> KeyRouting | GroupRouting | None:
    """How a one-upstream view's input is shuffled to its ``partitions`` tasks: by the key it passes
    through, or by its GROUP BY values (a global aggregate's: all to its one row's partition; a windowed
    one's: each row to its windows' partitions); None when its operator does not run partitioned this way
    (a top-N: by ranking group, :mod:`mvlog.views.topn_routing`; a subquery: state of another shape).
    The one rule that says which one-upstream views the tasks compute, derive and re-derive."""
    if passes_key_through(plan, upstream_key):
        return KeyRouting(plan, tuple(upstream_key), partitions)
    if grouped_by_key(plan):
        return GroupRouting(plan, partitions)
    return None
