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

A branch that joins views (an inner or outer equi-join of two, a chain of them on one key, or a semi or
anti join whose subquery filters and projects a view: :mod:`mvlog.views.join_routing`) is a side per
source it reads (a semi or anti join's second: its subquery's view), each routed by the branch's join key, so
the task of a join key holds that branch's buckets of it (``($(branch<i>))j0[...]``) and runs its join
there, as a join view's task would; its input names are ``<view>#b<branch>.<source>``.

A windowed GROUP BY branch sends a row once to each partition holding one of its windows, a global one
every row to its one row's partition; each task's branch keeps only its share of the groups
(:meth:`UnionRouting.first_step`: a global branch's row is emitted by its partition's task alone).

A branch may read through a subquery in FROM (or a WITH query) where the same shape without a union
would run in tasks: a filter/project or a GROUP BY over a filter/project subquery of one view (routed as
the branch without it: a filter's rows by their own key, a GROUP BY's by the group the subquery's row falls
in, none when its WHERE drops the row), and a join of subqueries whose groups hold the join key (Nexmark
q8's shape, :mod:`mvlog.views.subquery_join_routing`: a side per source, each routed by the join key its
rows' groups will have, the task's branch keeping the groups of its join keys).

A branch of another shape (a GROUP BY or a top-N over a join, a top-N, a GROUP BY over a GROUP BY, another
subquery) keeps the union on the driver.

Pure: Arrow in, partitions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from mvlog.views.evaluate import arrow_type
from mvlog.views.join_routing import (
    JoinRouting,
    join_chain_on_one_key,
    read_sides_as,
    subquery_of,
    two_source_equi_join,
)
from mvlog.views.operator import ViewOperator
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import (
    GroupRouting,
    each_row_once,
    filter_of_one_view,
    grouped_by_key,
    partitions_table,
    view_key_partitions,
)
from mvlog.views.state import inner_prefix
from mvlog.views.subquery_join_routing import SubqueryJoinRouting, join_of_subqueries

#: A branch's side's input name: ``<view>#b<branch>`` (``#`` is not allowed in a view name).
BRANCH_SIDE = "#b"


def routed_union(plan: ViewPlan) -> bool:
    """A ``UNION ALL`` whose every branch reads one view, and filters and projects it (through a subquery
    too: :func:`~mvlog.views.routing.filter_of_one_view`) or groups it by key (:func:`_grouped_branch`), or
    joins views or subqueries (:func:`_joined_branch`, :func:`~mvlog.views.subquery_join_routing.join_of_subqueries`):
    the views :class:`UnionRouting` partitions."""
    return plan.union and all(filter_of_one_view(branch, through_subquery=True) or _grouped_branch(branch)
                              or _joined_branch(branch) or join_of_subqueries(branch) for _, branch in plan.inner)


def _joined_branch(branch: ViewPlan) -> bool:
    """An inner or outer equi-join of two views or a chain of them on one key, or a semi or anti join whose
    subquery filters and projects one view (:func:`~mvlog.views.join_routing.subquery_of`), filtered and
    projected: no other subquery, no aggregate or top-N over it."""
    if branch.inner and subquery_of(branch) is None:
        return False
    return two_source_equi_join(branch) or join_chain_on_one_key(branch)


def _grouped_branch(branch: ViewPlan) -> bool:
    """A GROUP BY of one view keyed by its groups (a windowed or a global one too: the task's branch keeps
    only its share, :meth:`UnionRouting.first_step`), directly or over a filter/project subquery of it."""
    return grouped_by_key(branch)


def _routing_of(branch: ViewPlan, partitions: int) -> GroupRouting | JoinRouting | SubqueryJoinRouting | None:
    """The routing of a branch's rows: its GROUP BY's, its join's, or None for a filter/project."""
    if branch.query.is_aggregate:
        return GroupRouting(branch, partitions)
    if _joined_branch(branch):
        return JoinRouting(branch, partitions)
    if join_of_subqueries(branch):
        return SubqueryJoinRouting(branch, partitions)
    return None


@dataclass(frozen=True)
class UnionRouting:
    """Routes a union's input rows (each branch's view's columns, by name) to the partitions of their state."""

    plan: ViewPlan
    partitions: int
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: Per branch: its GROUP BY's routing, its join's (of views or of subqueries), or None for a filter/project.
    _routings: tuple[GroupRouting | JoinRouting | SubqueryJoinRouting | None, ...] = field(
        init=False, repr=False, compare=False)
    #: Per side: its branch, and the source of that branch it reads (a join branch has a side per source).
    _sides: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    #: A join's GROUP BY step: a union has none (:class:`~mvlog.views.join_routing.JoinRouting`'s interface).
    groups: GroupRouting | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not routed_union(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a UNION ALL of filter/project, GROUP BY or join "
                             "branches")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))
        routings = tuple(_routing_of(branch, self.partitions) for _, branch in self.plan.inner)
        object.__setattr__(self, "_routings", routings)
        sides = tuple((i, source) for i, (_, branch) in enumerate(self.plan.inner)
                      for source in range(len(branch.query.sources)))
        object.__setattr__(self, "_sides", sides)

    def upstreams(self) -> tuple[str, ...]:
        """The view each side reads: a branch's, or each of a join branch's sources (a semi or anti join's
        second: the view its subquery reads; a view several branches or sources read: once per side)."""
        return tuple(routing.upstreams()[source]
                     if isinstance(routing := self._routings[i], JoinRouting | SubqueryJoinRouting)
                     else self.plan.inner[i][1].sources[0] for i, source in self._sides)

    def self_join(self) -> bool:
        return False

    def inputs(self) -> tuple[str, ...]:
        """The name each side's rows go under in :meth:`operator_plan`'s input: ``<view>#b<branch>``, or
        ``<view>#b<branch>.<source>`` for a join branch's sources."""
        return tuple(f"{view}{BRANCH_SIDE}{i}" if len(self.plan.inner[i][1].query.sources) == 1
                     else f"{view}{BRANCH_SIDE}{i}.{source}"
                     for view, (i, source) in zip(self.upstreams(), self._sides, strict=True))

    def operator_plan(self) -> ViewPlan:
        """The plan a task's operator runs: the view's, each branch's sources reading their sides' inputs
        (only the rows routed for them). The state and the output do not change: each branch's state is
        under its own prefix, and a single operator gives every branch its views' changes."""
        reads: dict[int, list[str]] = {}
        for read, (i, _) in zip(self.inputs(), self._sides, strict=True):
            reads.setdefault(i, []).append(read)
        inner = tuple((name, read_sides_as(branch, reads[i])) for i, (name, branch) in enumerate(self.plan.inner))
        return replace(self.plan, sources=self.inputs(), inner=inner)

    def fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of side ``side``'s view goes: (row index, partition) pairs, one per row but for a
        windowed GROUP BY branch's, once to each partition holding one of its windows
        (:meth:`GroupRouting.fan_out`)."""
        branch, source = self._sides[side]
        routing = self._routings[branch]
        if isinstance(routing, GroupRouting):
            return routing.fan_out(rows)
        if isinstance(routing, SubqueryJoinRouting):
            return routing.fan_out(source, rows)
        return each_row_once(self.partitions_of(side, rows))

    def first_step(self, partition: int) -> ViewOperator:
        """The operator of the task of ``partition``: each GROUP BY branch keeps only its groups there (a
        windowed one's windows; a global one's row, if it is there), a join of subqueries the groups of its
        join keys there."""
        shares = {name: routing.share(partition) for (name, _), routing in zip(self.plan.inner, self._routings,
                                                                                strict=True)
                  if isinstance(routing, GroupRouting | SubqueryJoinRouting)}
        return ViewOperator(self.operator_plan(), inner_shares=shares)

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The partition (int32) of each row of side ``side``'s view (its columns, by name): its group's (a
        GROUP BY branch; not a windowed one's nor one over a subquery, :meth:`fan_out`), its join key's (a
        join branch's source; a view side of a join of subqueries), else its own key's, as that view's
        changelog writer would place it over the union's partition count."""
        branch, source = self._sides[side]
        routing = self._routings[branch]
        if isinstance(routing, GroupRouting):
            return routing.partitions_of(rows)
        if isinstance(routing, JoinRouting | SubqueryJoinRouting):
            return routing.partitions_of(source, rows)
        plan = self.plan.inner[branch][1]
        schema = (plan.inner[0][1] if plan.inner else plan).query.sources[0].schema  # the view the branch reads
        key = pa.table({name: rows.column(name).cast(arrow_type(schema.column(name).type))
                        for name in schema.primary_key})
        return view_key_partitions(schema, key, self._of_vnode)

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose task owns each state key: a GROUP BY branch's group (``($(branch<i>))g[...]``),
        a join branch's bucket (``($(branch<i>))j0[...]``) or its grouped subqueries' groups."""
        owners = []
        for key in keys:
            for (name, _), routing in zip(self.plan.inner, self._routings, strict=True):
                prefix = inner_prefix(name)
                if routing is not None and key.startswith(prefix):
                    owners += routing.partitions_of_state_keys([key[len(prefix):]])
                    break
            else:
                raise ValueError(f"view {self.plan.name!r}: {key!r} is not a GROUP BY or join branch's state key")
        return owners
