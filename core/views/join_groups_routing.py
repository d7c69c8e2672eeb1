"""Where a GROUP BY over a join's GROUP BY runs when its operator runs in Spark's tasks, when the inner groups
include one side's join key (Nexmark's q4: the highest bid of each auction, ``GROUP BY A.id, A.category``
over ``auction JOIN bid ON A.id = B.auction``, then the average of those per category; issue 19 item 2).

Every joined row of an inner group has the group's join-key columns as its join key, so the join-key task
that makes those rows (:mod:`mvlog.views.join_routing`) holds the whole group: it can run the inner
aggregate right after the join, as a join-key task ranks a top-N over a join per join key. So the operator
runs in the two steps of a GROUP BY over a join, the subquery (join and inner aggregate) in the join's place:

1. both sides' signed rows are shuffled by the partition of their join key (the inner join's
   :class:`~mvlog.views.join_routing.JoinRouting`); that task reads and stages the inner join's buckets
   (``($(q))j0[...]``, ``($(q))j1[...]``) and the inner groups' state (``($(q))g[...]``, owned by the
   partition of the join key inside the group), runs the subquery, and emits its changes as signed rows
   in the outer query's layout (:meth:`~mvlog.views.operator.ViewOperator.joined`);
2. those rows are shuffled by the partition of their outer group (:attr:`JoinGroupsRouting.groups`), whose
   task folds them into its groups (``g[...]``) and writes the view's changes, as for a GROUP BY over a join.

The inner join is an equi-join of two views, or of one with itself (its sides then read inputs of their
own, as a self-join view's do), grouped by columns, maybe by windows too: a joined row's windows are all
groups of its join key, so the task that makes the row keeps them all. An outer join's groups must
include its preserved side's key (a LEFT JOIN's left, a RIGHT JOIN's right): its null-extended rows carry
that side's key, made in that key's task, and a NULL one's rows all in partition 0's, whose group it owns
(:meth:`~mvlog.views.join_routing.JoinRouting.partition_of_key`); grouped by the other side's key, they
would carry a NULL there, in a group whose rows other tasks made. Not a FULL join. Pure: Arrow in,
partitions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from mvlog.views.expr import ColumnRef
from mvlog.views.join_routing import JoinRouting, aggregate_over_join, read_sides_as, source_key_columns
from mvlog.views.operator import ViewOperator
from mvlog.views.plan import ViewPlan
from mvlog.views.query import JoinKind
from mvlog.views.routing import GroupRouting, keyed_by_groups
from mvlog.views.state import inner_prefix
from mvlog.views.state_codec import GROUP_TAG


def aggregate_over_join_groups(plan: ViewPlan) -> bool:
    """A GROUP BY keyed by its groups whose one source is a subquery (or WITH query) grouping an inner or
    outer equi-join of two views (or of one with itself) by columns that include the join key of a side
    every joined row has (:func:`_join_key_in_groups`)."""
    query = plan.query
    if not keyed_by_groups(plan) or len(query.sources) != 1 or query.joins or len(plan.inner) != 1:
        return False
    name, inner = plan.inner[0]
    if query.sources[0].view != name or inner.inner or inner.union or not aggregate_over_join(inner):
        return False
    if len(inner.query.sources) != 2:
        return False
    return _join_key_in_groups(inner) is not None


#: The sides whose join key may stand for a joined row's: both for an inner join, the preserved side for an
#: outer join (its null-extended rows have the other side's NULL), none for a FULL one.
_KEYED_SIDES = {JoinKind.INNER: (0, 1), JoinKind.LEFT: (0,), JoinKind.RIGHT: (1,)}


def _join_key_in_groups(inner: ViewPlan) -> list[int] | None:
    """The positions, in the inner query's GROUP BY, of the join-key columns of one side whose key every
    joined row has (:data:`_KEYED_SIDES`; in the ON clause's order, each a plain column of the type it is
    compared as), or None when no such side's are all there."""
    query = inner.query
    kinds = [c.type for c in query.joins[0].on]
    sides = _KEYED_SIDES.get(query.joins[0].kind, ())
    for side, names in enumerate(source_key_columns(inner)):
        if side not in sides:
            continue
        positions = [next((i for i, g in enumerate(query.group_by)
                           if isinstance(g, ColumnRef) and (g.side, g.column, g.type) == (side, column, kind)), -1)
                     for column, kind in zip(names, kinds, strict=True)]
        if -1 not in positions:
            return positions
    return None


@dataclass(frozen=True)
class JoinGroupsRouting:
    """Routes a GROUP BY over a join's GROUP BY: both sides' rows by their join key (where the inner groups
    are too), the subquery's rows by their outer group."""

    plan: ViewPlan
    partitions: int
    _join: JoinRouting = field(init=False, repr=False, compare=False)
    _prefix: bytes = field(init=False, repr=False, compare=False)
    _key_positions: list[int] = field(init=False, repr=False, compare=False)
    _groups_of_inner: GroupRouting = field(init=False, repr=False, compare=False)  # decodes its groups' keys
    #: The outer GROUP BY's step: where the subquery's rows (and the outer groups' state) go.
    groups: GroupRouting = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not aggregate_over_join_groups(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a GROUP BY over a join's GROUP BY by a join key")
        name, inner = self.plan.inner[0]
        object.__setattr__(self, "_join", JoinRouting(inner, self.partitions))
        object.__setattr__(self, "_prefix", inner_prefix(name))
        object.__setattr__(self, "_key_positions", _join_key_in_groups(inner))
        object.__setattr__(self, "_groups_of_inner", GroupRouting(inner, self.partitions))
        object.__setattr__(self, "groups", GroupRouting(self.plan, self.partitions))

    @property
    def _inner(self) -> ViewPlan:
        return self.plan.inner[0][1]

    def upstreams(self) -> tuple[str, ...]:
        """The two views the inner join reads, FROM first (one view twice for a self-join)."""
        return self._join.upstreams()

    def self_join(self) -> bool:
        return self._join.self_join()

    def inputs(self) -> tuple[str, ...]:
        """The name each side's changes go under in the operator's input: its view's, a self-join's second
        side ``<view>#1`` (:meth:`JoinRouting.inputs`)."""
        return self._join.inputs()

    def operator_plan(self) -> ViewPlan:
        """The plan a task's operator runs: the view's own, or for a self-join its subquery reading each side
        under its input (:func:`~mvlog.views.join_routing.read_sides_as`)."""
        if not self.self_join():
            return self.plan
        name, inner = self.plan.inner[0]
        inputs = self.inputs()
        return replace(self.plan, sources=inputs, inner=((name, read_sides_as(inner, inputs)),))

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The join-key partition (int32) of each row of side ``side``."""
        return self._join.partitions_of(side, rows)

    def fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of side ``side`` goes: its join key's partition, one per row."""
        return self._join.fan_out(side, rows)

    def first_step(self, partition: int) -> ViewOperator:
        """The operator of join-key task ``partition``: all of what it is given (every inner group of its
        rows is its own)."""
        return ViewOperator(self.operator_plan())

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose first-step task owns each state key: the inner join's buckets
        (``($(q))j0[...]``) by their join key, the inner groups (``($(q))g[...]``) by the join key among
        their values."""
        owners = []
        for key in keys:
            if not key.startswith(self._prefix):
                raise ValueError(f"view {self.plan.name!r}: {key!r} is not its subquery's state key")
            rest = key[len(self._prefix):]
            if not rest.startswith(GROUP_TAG + b"["):
                owners += self._join.partitions_of_state_keys([rest])
                continue
            values = self._groups_of_inner.group_of_state_key(rest)
            owners.append(self._join.partition_of_key([values[i] for i in self._key_positions]))
        return owners
