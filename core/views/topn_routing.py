"""Where the input rows and operator state of a top-N live when its operator runs in Spark's tasks: by the
partition of their **PARTITION BY values**, not of the view's key (issue 19 item 2, top-N).

A top-N view's key is its source's key (:mod:`mvlog.views.topn_plan`), but its state is per ranking
group, the rows of one PARTITION BY value (``t[...]``, :mod:`mvlog.views.topn`), and a change of one row
moves the rank of every row of its group: the rows a change touches sit in every view partition, so no
routing of the input by the view's key keeps a group in one task (the same reason as a join's,
:mod:`mvlog.views.join_routing`). So a top-N runs in a join's two steps, each partitioned by its own key:

1. the input's signed rows are shuffled by the partition of their ranking group
   (:meth:`TopNRouting.partitions_of`); task ``j`` holds every change of its groups, reads and stages
   their state only (:meth:`TopNRouting.partitions_of_state_keys`), and ranks them with the pure operator;
2. its output (the view's changes as signed rows) is shuffled again by the partition of the view's key,
   where the changes of one view key are consolidated (a row moving to another group leaves one group's
   top N in one task and enters the other's in another: one update) and written.

:class:`TopNRouting` has :class:`~mvlog.views.join_routing.JoinRouting`'s interface for one source, so the
join's jobs run it (:mod:`mvlog.views.keyed_routing`). A top-N without PARTITION BY has one group, the
empty tuple: one task ranks it, like a global aggregate's.

A group's partition is ``partition_of_vnode(crc32(the JSON of its values) % 256)``: the bytes of its state
key after the tag, so a state key's owner is read off the key itself. Pure: Arrow in, partitions out.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from mvlog.row_schema import ColumnType
from mvlog.views.evaluate import evaluate
from mvlog.views.plan import ViewPlan
from mvlog.views.routing import GroupRouting, OneViewSide, partitions_table, source_batch
from mvlog.views.state_codec import TOP_N_TAG, encode_key
from mvlog.vnode import VNODE_COUNT


def top_n_of_one_view(plan: ViewPlan) -> bool:
    """A top-N (``ROW_NUMBER() ... WHERE rn <= N``) over one view, filtered and projected only: the views
    :class:`TopNRouting` partitions. Not over a join, a subquery or a union (state of another shape)."""
    query = plan.query
    return (query.top_n is not None and not plan.inner and not plan.union and len(query.sources) == 1
            and not query.joins)


@dataclass(frozen=True)
class TopNRouting(OneViewSide):
    """Routes a top-N's input rows (its upstream's columns, by name) to the partitions of their ranking
    groups."""

    plan: ViewPlan
    partitions: int
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: A join's GROUP BY step: a top-N has none (:class:`~mvlog.views.join_routing.JoinRouting`'s interface).
    groups: GroupRouting | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not top_n_of_one_view(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a top-N over one view")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))

    @property
    def _kinds(self) -> list[ColumnType | None]:
        top_n = self.plan.query.top_n
        assert top_n is not None
        return [p.type for p in top_n.partition]

    def upstreams(self) -> tuple[str]:
        """The one view the data source reads."""
        return (self.plan.query.sources[0].view,)

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The partition (int32) of each row's ranking group (``side`` 0: the one upstream's columns, by name)."""
        if side != 0:
            raise ValueError(f"a top-N reads one view, not side {side}")
        top_n = self.plan.query.top_n
        assert top_n is not None
        batch = source_batch(self.plan.query.sources[0].schema, rows)
        columns = [evaluate(p, batch).to_pylist() for p in top_n.partition]
        kinds = self._kinds
        if not columns:
            return pa.array([self._owner((), kinds)] * rows.num_rows, pa.int32())
        return pa.array([self._owner(values, kinds) for values in zip(*columns, strict=True)], pa.int32())

    def _owner(self, values: Sequence[Any], kinds: Sequence[ColumnType | None]) -> int:
        return self._of_vnode[zlib.crc32(encode_key(b"", values, kinds)) % VNODE_COUNT]

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose task owns each state key (a ranking group's, ``t[...]``)."""
        owners = []
        for key in keys:
            if not key.startswith(TOP_N_TAG + b"["):
                raise ValueError(f"{key!r} is not a top-N group's state key")
            owners.append(self._of_vnode[zlib.crc32(key[len(TOP_N_TAG):]) % VNODE_COUNT])
        return owners
