"""Where a ``UNION ALL`` runs when its operator runs in Spark's tasks: each branch's input rows where that
branch keeps their state, its output by the view's key (issue 19 item 2, unions).

A union's view key is its branch number and that branch's key (:mod:`mvlog.views.union`), so the
partition of an output row depends on the branch it came from: a row of a view two branches read makes
two output rows, most often in two partitions, and no single placement of the input row is each output
row's partition. So a union takes a join's two steps (:mod:`mvlog.views.keyed_routing`), one *side* per
branch (a view two branches read is read once and routed once per branch, as a self-join's is):

1. each branch's input rows are shuffled to the partition that keeps their state: a GROUP BY branch's
   by its group (:class:`~mvlog.views.routing.GroupRouting` over the branch, so a group's state key,
   ``($(branch<i>))g[...]``, has one owner), a filter/project branch's, which keeps none, by the row's own
   key (a key's retraction and assertion in one task). Each task runs the union's operator with every
   branch reading only the rows routed for it (:meth:`UnionRouting.operator_plan`: branch ``i`` reads
   its side's input, ``<view>#b<i>``);
2. its output (the view's changes as signed rows) is shuffled by the partition of the view's key, where
   each partition's changes are consolidated and written.

A branch of another shape (a join, a top-N, a subquery, a window or a global aggregate, whose one row
every task's operator would emit) keeps the union on the driver.

Pure: Arrow in, partitions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from mvlog.views.evaluate import arrow_type
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import (
    GroupRouting,
    filter_of_one_view,
    grouped_by_key,
    partitions_table,
    view_key_partitions,
)

#: A branch's side's input name: ``<view>#b<branch>`` (``#`` is not allowed in a view name).
BRANCH_SIDE = "#b"


def routed_union(plan: ViewPlan) -> bool:
    """A ``UNION ALL`` whose every branch reads one view, and filters and projects it or groups it by
    key (:func:`_grouped_branch`): the views :class:`UnionRouting` partitions."""
    return plan.union and all(filter_of_one_view(branch) or _grouped_branch(branch) for _, branch in plan.inner)


def _grouped_branch(branch: ViewPlan) -> bool:
    """A GROUP BY of one view keyed by its groups, read directly: not a global aggregate (its one row
    would be every task's), nor windowed or over a subquery (a row in several partitions, or none)."""
    query = branch.query
    return grouped_by_key(branch) and not branch.inner and query.window is None and bool(query.group_by)


@dataclass(frozen=True)
class UnionRouting:
    """Routes a union's input rows (each branch's view's columns, by name) to the partitions of their state."""

    plan: ViewPlan
    partitions: int
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: Per branch (side): its GROUP BY's routing, or None for a filter/project.
    _groups: tuple[GroupRouting | None, ...] = field(init=False, repr=False, compare=False)
    #: A join's GROUP BY step: a union has none (:class:`~mvlog.views.join_routing.JoinRouting`'s interface).
    groups: GroupRouting | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not routed_union(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a UNION ALL of filter/project or GROUP BY branches")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))
        groups = tuple(GroupRouting(branch, self.partitions) if branch.query.is_aggregate else None
                       for _, branch in self.plan.inner)
        object.__setattr__(self, "_groups", groups)

    def upstreams(self) -> tuple[str, ...]:
        """The view each branch reads, by side (a view several branches read: once per branch)."""
        return tuple(branch.query.sources[0].view for _, branch in self.plan.inner)

    def self_join(self) -> bool:
        return False

    def inputs(self) -> tuple[str, ...]:
        """The name each branch's rows go under in :meth:`operator_plan`'s input: ``<view>#b<branch>``."""
        return tuple(f"{view}{BRANCH_SIDE}{i}" for i, view in enumerate(self.upstreams()))

    def operator_plan(self) -> ViewPlan:
        """The plan a task's operator runs: the view's, branch ``i`` reading its side's input (only the rows
        routed for it). The state and the output do not change: each branch's state is under its own prefix,
        and a single operator gives every branch its view's changes."""
        inner = []
        for (name, branch), read in zip(self.plan.inner, self.inputs(), strict=True):
            source = replace(branch.query.sources[0], view=read)
            inner.append((name, replace(branch, sources=(read,), query=replace(branch.query, sources=(source,)))))
        return replace(self.plan, sources=self.inputs(), inner=tuple(inner))

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The partition (int32) of each row of branch ``side``'s view (its columns, by name): its group's (a
        GROUP BY branch), else its own key's, as that view's changelog writer would place it over the
        union's partition count."""
        if (groups := self._groups[side]) is not None:
            return groups.partitions_of(rows)
        schema = self.plan.inner[side][1].query.sources[0].schema
        key = pa.table({name: rows.column(name).cast(arrow_type(schema.column(name).type))
                        for name in schema.primary_key})
        return view_key_partitions(schema, key, self._of_vnode)

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose task owns each state key: a GROUP BY branch's group (``($(branch<i>))g[...]``)."""
        owners = []
        for key in keys:
            for (name, _), groups in zip(self.plan.inner, self._groups, strict=True):
                prefix = b"(" + name.encode() + b")"
                if groups is not None and key.startswith(prefix):
                    owners += groups.partitions_of_state_keys([key[len(prefix):]])
                    break
            else:
                raise ValueError(f"view {self.plan.name!r}: {key!r} is not a GROUP BY branch's state key")
        return owners
