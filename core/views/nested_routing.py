"""Where a GROUP BY over a GROUP BY runs when its operator runs in Spark's tasks: the inner aggregate by its
groups, the outer one by its own (issue 19 item 2, a chain of two keyed steps).

``SELECT n, count(*) FROM (SELECT k, count(*) AS n FROM t GROUP BY k) s GROUP BY n``, a histogram of
per-key counts (Nexmark's q5 takes a maximum over per-auction counts the same way): the inner aggregate's
state is per ``k``, the outer one's per ``n``, and a change of one ``k`` moves a row of the subquery from
one ``n`` to another. No one placement of the input holds both, so the operator runs in the steps of a
GROUP BY over a join (:mod:`mvlog.views.join_routing`), the inner aggregate in the join's place:

1. the upstream's signed rows are shuffled by the partition of their inner group
   (:meth:`NestedAggregateRouting.fan_out`, the inner GROUP BY's :class:`GroupRouting`); the task of
   that partition reads and stages the inner groups' state (``($(s))g[...]``), runs the subquery's
   aggregate, and emits the subquery's changes as signed rows in the outer query's layout
   (:meth:`~mvlog.views.operator.ViewOperator.joined`);
2. those rows are shuffled by the partition of their outer group (:attr:`NestedAggregateRouting.groups`),
   whose task folds them into its groups (``g[...]``) and writes the view's changes, as the partition of
   a GROUP BY over a join does.

The inner GROUP BY reads one view directly. A windowed one (Nexmark's q5 counts bids per auction and
window, then takes each window's maximum) sends a row once to each partition holding one of its windows,
and that task's subquery keeps only the windows there; a global one sends every row to its one row's
partition, whose subquery alone emits that row (:meth:`NestedAggregateRouting.first_step`, the inner
routing's :meth:`GroupRouting.share`). A subquery under it is another step. The outer one is any GROUP BY
keyed by its groups (a global or a windowed one too: its step is the join's third,
:meth:`GroupRouting.share`). Pure: Arrow in, partitions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from mvlog.views.operator import ViewOperator
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import GroupRouting, OneViewSide, grouped_by_key, keyed_by_groups
from mvlog.views.state import inner_prefix


def aggregate_over_aggregate(plan: ViewPlan) -> bool:
    """A GROUP BY keyed by its groups whose one source is a subquery (or WITH query) that groups one view
    by key, directly: by columns, by windows (and columns), or globally."""
    query = plan.query
    if not keyed_by_groups(plan) or len(query.sources) != 1 or query.joins or len(plan.inner) != 1:
        return False
    name, inner = plan.inner[0]
    return query.sources[0].view == name and grouped_by_key(inner) and not inner.inner


@dataclass(frozen=True)
class NestedAggregateRouting(OneViewSide):
    """Routes a GROUP BY over a GROUP BY: the upstream's rows by their inner group, the subquery's rows by
    their outer group."""

    plan: ViewPlan
    partitions: int
    _inner: GroupRouting = field(init=False, repr=False, compare=False)
    _prefix: bytes = field(init=False, repr=False, compare=False)
    #: The outer GROUP BY's step: where the subquery's rows (and the outer groups' state) go.
    groups: GroupRouting = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not aggregate_over_aggregate(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a GROUP BY over a GROUP BY of one view")
        name, inner = self.plan.inner[0]
        object.__setattr__(self, "_inner", GroupRouting(inner, self.partitions))
        object.__setattr__(self, "_prefix", inner_prefix(name))
        object.__setattr__(self, "groups", GroupRouting(self.plan, self.partitions))

    def upstreams(self) -> tuple[str]:
        """The one view the inner GROUP BY reads."""
        return (self.plan.inner[0][1].query.sources[0].view,)

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The partition (int32) of each upstream row's inner group (``side`` 0: the one upstream); not
        of a windowed inner GROUP BY's rows, which may have several (:meth:`fan_out`)."""
        self._one_side(side)
        return self._inner.partitions_of(rows)

    def fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each upstream row goes: (row index, partition) pairs, one per partition holding one of
        its inner groups (a windowed inner GROUP BY's row: each of its windows' partitions, once)."""
        self._one_side(side)
        return self._inner.fan_out(rows)

    def first_step(self, partition: int) -> ViewOperator:
        """The operator of the first step's task of ``partition``: its subquery keeps only the inner
        groups of ``partition`` (a windowed one's windows there; a global one's row, if it is there)."""
        return ViewOperator(self.plan, inner_shares={self.plan.inner[0][0]: self._inner.share(partition)})

    @staticmethod
    def _one_side(side: int) -> None:
        if side != 0:
            raise ValueError(f"a GROUP BY over a GROUP BY reads one view, not side {side}")

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose first-step task owns each state key: an inner group's (``($(s))g[...]``)."""
        for key in keys:
            if not key.startswith(self._prefix):
                raise ValueError(f"view {self.plan.name!r}: {key!r} is not its subquery's state key")
        return self._inner.partitions_of_state_keys([key[len(self._prefix):] for key in keys])
