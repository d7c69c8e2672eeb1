"""Where a join of subqueries runs when its operator runs in Spark's tasks: GROUP BY subqueries whose groups
hold the join key (Nexmark's q8, "monitor new users": persons and auctions, each grouped per id and
tumbling window, joined on the id and the window; q5, "hot items": bids counted per auction and hopping
window, joined on the window with each window's highest count; issue 19 item 2).

A GROUP BY subquery's rows are its groups. When every join-key column of a side passes one of its GROUP BY
values through (a column, a computed group, a window's start or end: an output that is a ``GroupRef``), each
row the subquery emits for a group has that group's join key. So the join-key task that holds the join's
buckets of that key (:mod:`mvlog.views.join_routing`) can hold the whole group as well, and run the subquery
right before the join, as the join and the inner groups of Nexmark's q4 share a task
(:mod:`mvlog.views.join_groups_routing`).
The view then runs in a join's two steps:

1. each side's upstream rows go to the partition of the join key they will have: a view's by its own
   columns, as a join's; a grouped side's by the join key of each group the row falls in (its subquery's
   WHERE applied, its windows expanded: a hopping window's row goes once to each partition holding one of
   its windows, and that task's subquery keeps only its own windows, :meth:`SubqueryJoinRouting.first_step`).
   The task reads and stages the subqueries' groups (``($(P))g[...]``, owned by the partition of the join
   key among their values) and the join's buckets (``j0[...]`` / ``j1[...]``), and runs the whole operator;
2. its output (the view's changes as signed rows) goes by the view's key, as any join's.

A side may be a GROUP BY over a GROUP BY of one view (q5's per-window maximum of per-auction counts) when
its groups pass the join key through from the inner groups' values: every inner group of a window is then
in the window's task too, so both levels run there (``($(t))g[...]``, ``($(t))($(m))g[...]``).

A side may also be a filter/project subquery of one view (``FROM (SELECT ... FROM orders WHERE open) o JOIN
...``): each upstream row gives at most one row of it, whose join key the routing evaluates on the row
itself (a row its WHERE drops goes nowhere); it keeps no state, and the task runs it before the join.

A group whose join key has a NULL never matches: its rows go to partition 0, as a join's NULL keys do, and
that task owns the group. Inner and outer joins (a null-extended row is made where its key's buckets are,
as for two views); two subqueries over one view too (its rows routed once per side, as a self-join's). Not
a semi or anti join, an aggregate or top-N over the join, nor a side whose join key is an aggregate's
result (Nexmark's q7 joins bids with each window's highest price: a group's key is known only after it
is folded, so it needs a shuffle between the aggregate and the join). A join-key column grouped as another
type than it is compared as is refused: its key bytes would differ. Pure: Arrow in, partitions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pyarrow as pa

from mvlog.row_schema import ColumnType
from mvlog.views.evaluate import evaluate
from mvlog.views.expr import ColumnRef, GroupRef
from mvlog.views.join_routing import join_key_partitions, partition_of_bucket, reading_as
from mvlog.views.nested_routing import aggregate_over_aggregate
from mvlog.views.operator import ViewOperator
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import (
    GroupRouting,
    each_row_once,
    filter_of_one_view,
    grouped_by_key,
    keyed_by_groups,
    partitions_table,
    rows_kept_by,
)
from mvlog.views.share import OperatorShare
from mvlog.views.state import inner_prefix


def join_of_subqueries(plan: ViewPlan) -> bool:
    """An inner or outer equi-join of two sources, filtered and projected only, at least one of them a
    subquery (or WITH query) of one view: a GROUP BY, or a GROUP BY over a GROUP BY, whose join-key columns
    are among its groups (:func:`_levels`), or a filter/project (:func:`_FilterSide`); the other one too or
    a view."""
    return _sides_of(plan, 1) is not None


def _sides_of(plan: ViewPlan, partitions: int) -> tuple[_ViewSide | _FilterSide | _GroupedSide, ...] | None:
    """The two sides of ``plan`` as the routing over ``partitions`` places them, or None when ``plan`` is not
    a join of subqueries it routes (:func:`join_of_subqueries`)."""
    query = plan.query
    if plan.union or query.is_aggregate or query.top_n is not None or query.window is not None:
        return None
    if len(query.sources) != 2 or len(query.joins) != 1 or query.joins[0].kind.filters or not plan.inner:
        return None
    inner = dict(plan.inner)
    if set(inner) - {s.view for s in query.sources} or query.sources[0].view == query.sources[1].view:
        return None  # a subquery elsewhere (in WHERE, in the SELECT list), or one WITH query on both sides
    first, second = (_side_of(plan, side, partitions) for side in (0, 1))
    return None if first is None or second is None else (first, second)


@dataclass(frozen=True)
class _GroupsByJoinKey(GroupRouting):
    """A grouped side's groups placed by the join key among their GROUP BY values (``positions``, compared
    as ``kinds``), not by the view key: the join-key task that holds the group's rows."""

    positions: tuple[int, ...] = ()
    kinds: tuple[ColumnType | None, ...] = ()

    def partitions_of_batch(self, batch: pa.Table) -> pa.Array:
        group_by = self.plan.query.group_by
        return join_key_partitions([evaluate(group_by[i], batch) for i in self.positions], self.kinds,
                                   batch.num_rows, self._of_vnode)

    def partitions_of_groups(self, groups: Sequence[Sequence[Any]]) -> list[int]:
        columns = [pa.array([g[i] for g in groups]) for i in self.positions]
        owners: list[int] = join_key_partitions(columns, self.kinds, len(groups), self._of_vnode).to_pylist()
        return owners


@dataclass(frozen=True)
class _ViewSide:
    """A side that reads a view: its rows by their join-key columns."""

    view: str
    columns: tuple[str, ...]
    kinds: tuple[ColumnType | None, ...]
    of_vnode: tuple[int, ...]

    def fan_out(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        values = [rows.column(name) for name in self.columns]
        return each_row_once(join_key_partitions(values, self.kinds, rows.num_rows, self.of_vnode))


@dataclass(frozen=True)
class _FilterSide:
    """A side that is a filter/project subquery ``name`` of ``view``: each upstream row by the join key of
    the one row it gives (its join-key outputs evaluated on it, any expressions), none when its WHERE drops
    it."""

    view: str
    name: str
    sub: ViewPlan
    columns: tuple[str, ...]
    kinds: tuple[ColumnType | None, ...]
    of_vnode: tuple[int, ...]

    def fan_out(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        indices, batch = rows_kept_by(self.sub, rows)
        outputs = {o.name: o.expr for o in self.sub.query.outputs}
        values = [evaluate(outputs[column], batch) for column in self.columns]
        return indices, join_key_partitions(values, self.kinds, batch.num_rows, self.of_vnode)


@dataclass(frozen=True)
class _Level:
    """One GROUP BY of a grouped side: its name in the query above it, its state keys' prefix in the view's
    state, and its groups placed by their join key."""

    name: str
    prefix: bytes
    groups: _GroupsByJoinKey


@dataclass(frozen=True)
class _GroupedSide:
    """A side that is a GROUP BY subquery of ``view`` (``levels[0]``), maybe over a GROUP BY of it
    (``levels[1]``, Nexmark q5's per-window maximum of per-auction counts): its rows by the join key of
    their innermost groups, which every group above them shares."""

    view: str
    levels: tuple[_Level, ...]

    @property
    def name(self) -> str:
        return self.levels[0].name

    def fan_out(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        return self.levels[-1].groups.fan_out(rows)

    def share(self, partition: int) -> OperatorShare:
        """What the subquery's operator in task ``partition`` keeps: the innermost GROUP BY's groups (a
        hopping window's, only those there), and every group above them (their rows are made there)."""
        share = self.levels[-1].groups.share(partition)
        for below in reversed(self.levels[1:]):
            share = OperatorShare(inner=((below.name, share),))
        return share

    def owner(self, key: bytes) -> int | None:
        """The partition of a state key of one of its GROUP BYs (``($(P))g[...]``, ``($(P))($(C))g[...]``),
        or None when the key is none of theirs."""
        for level in reversed(self.levels):  # the innermost prefix is the longest
            if key.startswith(level.prefix):
                return level.groups.partitions_of_state_keys([key[len(level.prefix):]])[0]
        return None


def _side_of(plan: ViewPlan, side: int, partitions: int) -> _ViewSide | _FilterSide | _GroupedSide | None:
    """Join side ``side`` of ``plan`` as the routing places it, or None when it cannot be routed so."""
    query = plan.query
    on = query.joins[0].on
    columns = [(c.left if side == 0 else c.right).column for c in on]
    kinds = tuple(c.type for c in on)
    source = query.sources[side].view
    inner = dict(plan.inner)
    if source not in inner:
        return _ViewSide(source, tuple(columns), kinds, partitions_table(partitions))
    if filter_of_one_view(sub := inner[source]):
        return _FilterSide(sub.query.sources[0].view, source, sub, tuple(columns), kinds, partitions_table(partitions))
    levels = _levels(source, inner_prefix(source), sub, columns, kinds, partitions)
    if levels is None:
        return None
    innermost = levels[-1].groups.plan
    view = (innermost.inner[0][1] if innermost.inner else innermost).query.sources[0].view
    return _GroupedSide(view, levels)


def _levels(name: str, prefix: bytes, sub: ViewPlan, columns: Sequence[str], kinds: tuple[ColumnType | None, ...],
            partitions: int) -> tuple[_Level, ...] | None:
    """The GROUP BYs of subquery ``name`` whose outputs ``columns`` are the join key: the subquery, a GROUP BY
    of one view (:func:`~mvlog.views.routing.grouped_by_key`), or a GROUP BY (not windowed) over one whose
    groups pass the key through (its GROUP BY columns those outputs of the inner one). None for another
    shape, or a key column that is not a group's value."""
    positions = _key_positions(sub, columns, kinds)
    if positions is None:
        return None
    level = _Level(name, prefix, _GroupsByJoinKey(sub, partitions, positions=positions, kinds=kinds))
    if grouped_by_key(sub):
        return (level,)
    if not aggregate_over_aggregate(sub) or sub.query.window is not None:
        return None
    group_by = sub.query.group_by
    refs = [group_by[i] for i in positions]
    if not all(isinstance(ref, ColumnRef) for ref in refs):
        return None
    inner_name, inner = sub.inner[0]
    below = _levels(inner_name, prefix + inner_prefix(inner_name), inner,
                    [cast(ColumnRef, ref).column for ref in refs], kinds, partitions)
    return None if below is None else (level, *below)


def _key_positions(sub: ViewPlan, columns: Sequence[str], kinds: Sequence[ColumnType | None]
                   ) -> tuple[int, ...] | None:
    """The positions, in ``sub``'s GROUP BY, of the values its outputs ``columns`` (the join key's, in the ON
    clause's order) pass through, each grouped as the type it is compared as; None when one is another
    expression (an aggregate's result, a computed value) or of another type."""
    if not keyed_by_groups(sub):
        return None
    outputs = {o.name: o.expr for o in sub.query.outputs}
    positions = []
    for column, kind in zip(columns, kinds, strict=True):
        expr = outputs.get(column)
        if not isinstance(expr, GroupRef) or expr.type != kind:
            return None
        positions.append(expr.index)
    return tuple(positions)


@dataclass(frozen=True)
class SubqueryJoinRouting:
    """Routes a join of subqueries by join key: each side's upstream rows to the partitions of the join keys
    their groups (a filter's rows) have, a view side's by its columns."""

    plan: ViewPlan
    partitions: int
    _sides: tuple[_ViewSide | _FilterSide | _GroupedSide, ...] = field(init=False, repr=False, compare=False)
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: No third step: the join's output goes by the view's key (:mod:`mvlog.views.keyed_routing`).
    groups: GroupRouting | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        sides = _sides_of(self.plan, self.partitions)
        if sides is None:
            raise ValueError(f"view {self.plan.name!r} is not a join of subqueries routed by its join key "
                             "(GROUP BY subqueries grouped by it, filter/project subqueries or views)")
        object.__setattr__(self, "_sides", sides)
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))

    def upstreams(self) -> tuple[str, ...]:
        """The view each side reads: a view side's own, a subquery side's subquery's (one view twice when
        both read it)."""
        return tuple(side.view for side in self._sides)

    def self_join(self) -> bool:
        """Both sides read the same view (its rows are routed once per side)."""
        return len(set(self.upstreams())) < len(self.upstreams())

    def inputs(self) -> tuple[str, ...]:
        """The name each side's changes go under in the operator's input: its view's, but ``<view>#1`` for
        a second side reading the first one's view (as :meth:`JoinRouting.inputs`)."""
        first, second = self.upstreams()
        return (first, f"{second}#1" if second == first else second)

    def operator_plan(self) -> ViewPlan:
        """The plan a join-key task's operator runs: the view's, its second side reading its input under
        ``<view>#1`` when both read one view (the subquery's own source renamed, or the join's)."""
        if not self.self_join():
            return self.plan
        renamed = self.inputs()[1]
        side = self._sides[1]
        if isinstance(side, _ViewSide):
            query = self.plan.query
            sources = (query.sources[0], replace(query.sources[1], view=renamed))
            return replace(self.plan, sources=self.inputs(), query=replace(query, sources=sources))
        inner = tuple((name, reading_as(sub, renamed) if name == side.name else sub)
                      for name, sub in self.plan.inner)
        return replace(self.plan, sources=self.inputs(), inner=inner)

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The join-key partition (int32) of each row of a view side; not of a subquery side's rows, which may
        have several or none (:meth:`fan_out`)."""
        routed = self._sides[side]
        if not isinstance(routed, _ViewSide):
            raise ValueError(f"side {side} of view {self.plan.name!r} is a subquery: its rows may go to several "
                             "partitions or none")
        return routed.fan_out(rows)[1]

    def fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of side ``side`` goes: (row index, partition) pairs, a view side's one per row, a
        grouped side's one per partition holding one of its groups (none when its WHERE drops it)."""
        return self._sides[side].fan_out(rows)

    def first_step(self, partition: int) -> ViewOperator:
        """The operator of join-key task ``partition``: each grouped side keeps only the groups whose join key
        is there (a hopping window's row reaches several tasks, each keeping its own windows)."""
        return ViewOperator(self.operator_plan(), share=self.share(partition))

    def share(self, partition: int) -> OperatorShare:
        """What the operator of join-key task ``partition`` keeps (:meth:`first_step`; a union's task keeps
        this of a branch that is such a join): its grouped sides' shares, by subquery name."""
        return OperatorShare(inner=tuple((side.name, side.share(partition)) for side in self._sides
                                         if isinstance(side, _GroupedSide)))

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose task owns each state key: the join's buckets (``j0[...]``, ``j1[...]``) by
        their join key, a grouped side's groups (``($(P))g[...]``, a GROUP BY's below it ``($(P))($(C))g[...]``)
        by the join key among their values."""
        return [self._owner(key) for key in keys]

    def _owner(self, key: bytes) -> int:
        for side in self._sides:
            if isinstance(side, _GroupedSide) and (owner := side.owner(key)) is not None:
                return owner
        if (owner := partition_of_bucket(key, self._of_vnode)) is not None:
            return owner
        raise ValueError(f"view {self.plan.name!r}: {key!r} is neither a join bucket nor a subquery's group")
