"""Where a ``UNION ALL`` of filter/project branches runs when its operator runs in Spark's tasks: its input
rows anywhere, its output by the view's key (issue 19 item 2, unions).

A union's view key is its branch number and that branch's key (:mod:`mvlog.views.union`), so the
partition of an output row depends on the branch it came from: a row of a view two branches read makes
two output rows, most often in two partitions, and no single placement of the input row is each output
row's partition. A branch that only filters and projects keeps no state, though, so its input rows may be
computed anywhere: the union takes a join's two steps (:mod:`mvlog.views.keyed_routing`), its first
"operator key" being each upstream row's own key, which keeps a key's retraction and assertion in one
task (:meth:`UnionRouting.partitions_of`):

1. every upstream's signed rows are shuffled by the partition of their upstream key; each task runs the
   whole union operator (every branch over the rows it holds: a view read by several branches is read
   and routed once) and writes no state;
2. its output (the view's changes as signed rows) is shuffled by the partition of the view's key, where
   each partition's changes are consolidated and written.

A union with a branch that keeps state (an aggregate, a join, a top-N, a subquery) does not run this way:
each branch's state would need its own key's routing (the state of another shape).

Pure: Arrow in, partitions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from mvlog.row_schema import RowSchema
from mvlog.views.evaluate import arrow_type
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import GroupRouting, filter_of_one_view, partitions_table, view_key_partitions


def union_of_filters(plan: ViewPlan) -> bool:
    """A ``UNION ALL`` whose every branch is a filter/project of one view (no aggregate, join, top-N,
    window or subquery): the views :class:`UnionRouting` partitions."""
    return plan.union and all(filter_of_one_view(branch) for _, branch in plan.inner)


@dataclass(frozen=True)
class UnionRouting:
    """Routes a union's input rows (each upstream's columns, by name) to the partitions of their own keys."""

    plan: ViewPlan
    partitions: int
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _schemas: dict[str, RowSchema] = field(init=False, repr=False, compare=False)
    #: A join's GROUP BY step: a union has none (:class:`~mvlog.views.join_routing.JoinRouting`'s interface).
    groups: GroupRouting | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not union_of_filters(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a UNION ALL of filter/project branches")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))
        schemas = {branch.query.sources[0].view: branch.query.sources[0].schema for _, branch in self.plan.inner}
        object.__setattr__(self, "_schemas", schemas)

    def upstreams(self) -> tuple[str, ...]:
        """The views the data source reads, each once, in the order the branches first read them."""
        return tuple(self._schemas)

    def self_join(self) -> bool:
        """False: a view read by several branches is read and routed once, and its task runs every branch."""
        return False

    def inputs(self) -> tuple[str, ...]:
        """The name each upstream's changes go under in the operator's input: its own."""
        return self.upstreams()

    def operator_plan(self) -> ViewPlan:
        """The plan a task's operator runs: the view's own."""
        return self.plan

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The partition (int32) of each row of upstream ``side`` (its columns, by name): its own key's, as
        that upstream's changelog writer would place it over the view's partition count."""
        schema = self._schemas[self.upstreams()[side]]
        key = pa.table({name: rows.column(name).cast(arrow_type(schema.column(name).type))
                        for name in schema.primary_key})
        return view_key_partitions(schema, key, self._of_vnode)

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """None: the branches keep no operator state, so any state key written is an error."""
        if keys:
            raise ValueError(f"view {self.plan.name!r} keeps no operator state, yet wrote {list(keys)[:3]!r}")
        return []
