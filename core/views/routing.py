"""Which changelog partition of a GROUP BY view each input row belongs to: the partition of the group it
falls in, so that one Spark task per view partition holds every input row of its groups (issue 19, a
GROUP BY view's operator in Spark's tasks, shuffled by the vnode of the view's output key).

The view's key is its GROUP BY values, in order (``mvlog.views.plan``): the group of an input row is
the key of the view row it counts towards, and the changelog writer places that row by
``vnode_of(encoded key)`` and the partition owning the vnode. :class:`GroupRouting` computes the same
bytes from the input row (the GROUP BY expressions evaluated on it, cast to the key columns' types,
``-0.0`` folded into ``0.0`` as the operator folds group keys), so the task of partition ``p``:

- gets exactly the input rows of the groups whose view rows are in partition ``p`` (a signed row
  each: the retraction and the assertion of an update that moves a row to another group go to the
  two groups' partitions), and nothing else;
- reads and writes the operator state of those groups only (the state key of a group, ``g[...]``, is
  its GROUP BY values: :meth:`GroupRouting.partitions_of_state_keys`), so the partitions' state keys
  are disjoint and a task never needs another task's state.

A global aggregate's one group is the empty tuple: every input row goes to the partition of the empty
key, whose task alone maintains that row (:meth:`GroupRouting.share`). A windowed GROUP BY's groups
hold the window (its start and end): a row of a hopping window falls in several, maybe in several
partitions, so it goes once to each partition holding one of its windows (:meth:`GroupRouting.fan_out`),
whose operator keeps those windows only (:meth:`GroupRouting.share`: the other copies are the other
partitions' to fold).

A GROUP BY over a filter/project subquery (``FROM (SELECT ... FROM t WHERE ...) s``, or a WITH query)
is routed the same way, its GROUP BY values read off the subquery's row for each input row (a row its
WHERE drops goes nowhere); the task's operator runs the subquery first, on its partition's rows.

Pure: Arrow in, partitions out; the Spark shuffle that uses it is in ``mvlog.services.pipeline``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.row_schema import ColumnType, RowSchema
from mvlog.schemas.arrow_rows import encode_rows
from mvlog.views.evaluate import arrow_type, column_field, evaluate
from mvlog.views.operator import ViewOperator
from mvlog.views.plan import ViewPlan
from mvlog.views.share import OperatorShare
from mvlog.views.state_codec import GROUP_TAG, decode_value, loads
from mvlog.views.window import expand
from mvlog.vnode import VNODE_COUNT, partition_of_vnode

_ROW = "__row"  # a row's index in :meth:`GroupRouting.fan_out`'s copies
_PARTITION = "__partition"


def keyed_by_groups(plan: ViewPlan) -> bool:
    """A GROUP BY whose key is its GROUP BY values and whose aggregate state is per group, over whatever
    input: each group's rows and state can go to the view partition of its key. A global aggregate too
    (its one group, the empty tuple, has one partition), and a windowed GROUP BY (a row goes to the
    partitions of its windows). No top-N or union (state of another shape); a subquery only where the
    caller routes it (:func:`grouped_by_key` takes none, a GROUP BY over a semi or anti join its own)."""
    query = plan.query
    if plan.union or not query.is_aggregate or query.top_n is not None:
        return False
    return len(plan.schema.primary_key) == len(query.group_by)


def grouped_by_key(plan: ViewPlan) -> bool:
    """A GROUP BY over one upstream, :func:`keyed_by_groups`, read directly or through one filter/project
    subquery in FROM (or WITH query, :func:`stateless_subquery`): the views :class:`GroupRouting`
    partitions alone (an aggregate over a join takes the join's routing first,
    :mod:`mvlog.views.join_routing`)."""
    return (keyed_by_groups(plan) and len(plan.query.sources) == 1 and not plan.query.joins
            and (not plan.inner or stateless_subquery(plan) is not None))


def stateless_subquery(plan: ViewPlan) -> ViewPlan | None:
    """The one subquery a one-source query reads when it is a filter/project of one view (``FROM (SELECT
    v % 3 AS b, x FROM t WHERE ok) s``, or a WITH query): each input row gives at most one row of it, by
    itself, so the routing can evaluate it row by row (:meth:`GroupRouting.fan_out`), and the task's
    operator, which runs it first, gets every input row of its groups. None for any other shape."""
    if len(plan.inner) != 1:
        return None
    name, inner = plan.inner[0]
    return inner if plan.query.sources[0].view == name and filter_of_one_view(inner) else None


def filter_of_one_view(plan: ViewPlan, *, through_subquery: bool = False) -> bool:
    """A plan that only filters and projects the rows of one view (no subquery, union, join, aggregate,
    window or top-N): it keeps no state, and each input row gives at most one output row, by itself. With
    ``through_subquery``, also one that reads the view through one such subquery (:func:`stateless_subquery`):
    the same holds of the two together."""
    query = plan.query
    reads = not plan.inner or (through_subquery and stateless_subquery(plan) is not None)
    return (reads and not plan.union and len(query.sources) == 1 and not query.joins
            and not query.is_aggregate and query.top_n is None and query.window is None)


@dataclass(frozen=True)
class GroupRouting:
    """Routes a GROUP BY view's input rows (its upstream's columns, by name) to the view's partitions."""

    plan: ViewPlan
    partitions: int
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not keyed_by_groups(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not a GROUP BY keyed by its groups")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))

    @property
    def _source(self) -> RowSchema:
        return self.plan.query.sources[0].schema

    @property
    def _key_types(self) -> list[ColumnType | None]:
        return [g.type for g in self.plan.query.group_by]

    def partitions_of(self, rows: pa.Table) -> pa.Array:
        """The view partition (int32) of each row of ``rows`` (the upstream's columns, by name); not of a
        windowed GROUP BY's, whose rows may have several, nor of one over a subquery, whose WHERE may
        leave a row none (:meth:`fan_out`)."""
        if self.plan.query.window is not None or self.plan.inner:
            raise ValueError(f"view {self.plan.name!r} is windowed or reads a subquery: a row may go to "
                             "several partitions or none")
        return self.partitions_of_batch(source_batch(self._source, rows))

    def fan_out(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of ``rows`` (the upstream's columns, by name) goes: (row index, partition) pairs,
        in row order. One pair a row (:meth:`partitions_of`), but for a windowed GROUP BY: one per
        partition holding any of the row's windows (none for a row with a NULL time, in no window); and
        none for a row its FROM subquery's WHERE drops (it reaches no group)."""
        kept, batch = self._operator_input(rows)
        indices, parts = self.fan_out_batch(batch)
        return kept.take(indices), parts

    def _operator_input(self, rows: pa.Table) -> tuple[pa.Array, pa.Table]:
        """The rows of ``rows`` that reach the aggregate (their indices) and their values in the operator's
        layout: the upstream's columns, or its FROM subquery's outputs over them (their WHERE applied)."""
        if (inner := stateless_subquery(self.plan)) is None:
            return pa.array(range(rows.num_rows), pa.int64()), source_batch(self._source, rows)
        indices, batch = rows_kept_by(inner, rows)
        return indices, pa.table({column_field(0, o.name): evaluate(o.expr, batch) for o in inner.query.outputs})

    def fan_out_batch(self, batch: pa.Table) -> tuple[pa.Array, pa.Array]:
        """:meth:`fan_out` of rows in the operator's layout (:meth:`partitions_of_batch`): an aggregate
        over a join's joined rows, before their windows' expansion."""
        if (window := self.plan.query.window) is None:
            return each_row_once(self.partitions_of_batch(batch))
        batch = batch.append_column(_ROW, pa.array(range(batch.num_rows), pa.int64()))
        copies = expand(batch, window)
        pairs = pa.table({_ROW: copies.column(_ROW), _PARTITION: self.partitions_of_batch(copies)})
        pairs = pairs.group_by([_ROW, _PARTITION]).aggregate([]).sort_by([(_ROW, "ascending"),
                                                                              (_PARTITION, "ascending")])
        return pairs.column(_ROW).combine_chunks(), pairs.column(_PARTITION).combine_chunks()

    def share(self, partition: int) -> OperatorShare:
        """What partition ``partition``'s operator maintains: a windowed GROUP BY's task gets a row once for
        all of its windows there (:meth:`fan_out`) and keeps those windows; a global aggregate's one row
        is its partition's alone (every input row goes there, and the others' operators would emit the
        row over no input, as SQL's global row). Any other GROUP BY's task owns every row it gets."""
        rows = partial(self._in_partition, partition) if self.plan.query.window is not None else None
        global_row = bool(self.plan.query.group_by) or partition == self.partitions_of_groups([()])[0]
        return OperatorShare(rows, global_row)

    def _in_partition(self, partition: int, batch: pa.Table) -> pa.Array:
        return pc.equal(self.partitions_of_batch(batch), partition)

    def partitions_of_batch(self, batch: pa.Table) -> pa.Array:
        """The view partition (int32) of each row of ``batch``, rows in the operator's layout: an aggregate
        over a join's joined rows (:meth:`~mvlog.views.operator.ViewOperator.joined`), a windowed one's
        copies of its rows (``WINDOW_START`` set)."""
        groups = [evaluate(expr, batch) for expr in self.plan.query.group_by]
        return self.partitions_of_group_values(groups, batch.num_rows)

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose task owns the operator state under each key (a group's, ``g[...]``)."""
        return self.partitions_of_groups([self.group_of_state_key(key) for key in keys])

    def group_of_state_key(self, key: bytes) -> list[Any]:
        """The GROUP BY values a group's state key (``g[...]``) holds, in order, as their types."""
        if not key.startswith(GROUP_TAG + b"["):
            raise ValueError(f"{key!r} is not a group's state key")
        values = loads(key[len(GROUP_TAG):])
        return [decode_value(v, kind) for v, kind in zip(values, self._key_types, strict=True)]

    def partitions_of_groups(self, groups: Sequence[Sequence[Any]]) -> list[int]:
        """The partition of each group (its GROUP BY values, in order)."""
        columns = [pa.array([g[i] for g in groups], arrow_type(kind)) for i, kind in enumerate(self._key_types)]
        owners: list[int] = self.partitions_of_group_values(columns, len(groups)).to_pylist()
        return owners

    def partitions_of_group_values(self, groups: Sequence[pa.Array | pa.ChunkedArray], count: int) -> pa.Array:
        """The partition of each of ``count`` groups given as one array per GROUP BY value: the key bytes
        ``encode_batch`` gives the group's view row, hashed as the writer hashes them."""
        key: list[tuple[str, pa.Array]] = []
        for name, kind, values in zip(self.plan.schema.primary_key, self._key_types, groups, strict=True):
            values = values.cast(arrow_type(kind))
            if kind is ColumnType.FLOAT:  # the operator's group key folds -0.0 into 0.0 (key_value)
                values = pc.if_else(pc.equal(values, 0.0), pa.scalar(0.0, pa.float64()), values)
            key.append((name, values))
        return _partitions_of_key_rows(key, count, self._of_vnode)


class OneViewSide:
    """The parts of the two-shuffle routing interface (:mod:`mvlog.views.keyed_routing`) that a view reading
    one upstream as its one side shares: a top-N's, a GROUP BY over a GROUP BY's. Its operator runs the
    view's own plan, over the upstream's changes under the upstream's name."""

    plan: ViewPlan

    def upstreams(self) -> tuple[str]:
        raise NotImplementedError

    def self_join(self) -> bool:
        return False

    def inputs(self) -> tuple[str]:
        """The name the view's changes go under in the operator's input: the upstream's."""
        return self.upstreams()

    def operator_plan(self) -> ViewPlan:
        """The plan a task's operator runs: the view's own."""
        return self.plan

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        raise NotImplementedError

    def fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of ``rows`` (the upstream's columns, by name) goes: (row index, partition)
        pairs, one per row (:meth:`partitions_of`)."""
        return each_row_once(self.partitions_of(side, rows))

    def first_step(self, partition: int) -> ViewOperator:
        """The operator of the first step's task of ``partition``: all of what it is given."""
        return ViewOperator(self.operator_plan())


def each_row_once(parts: pa.Array) -> tuple[pa.Array, pa.Array]:
    """A fan-out that sends each row to one partition, ``parts[i]`` for row ``i``: (row index, partition)
    pairs, as :meth:`GroupRouting.fan_out` gives them."""
    return pa.array(range(len(parts)), pa.int64()), parts


def rows_kept_by(sub: ViewPlan, rows: pa.Table) -> tuple[pa.Array, pa.Table]:
    """The rows of ``rows`` (its one upstream's columns, by name) that a filter/project ``sub``'s WHERE keeps:
    their indices, and their values in its operator's layout (:func:`source_batch`), as its outputs read them."""
    batch = source_batch(sub.query.sources[0].schema, rows)
    indices = pa.array(range(rows.num_rows), pa.int64())
    if sub.query.where is not None:  # NULL drops the row, as in SQL
        keep = pc.fill_null(evaluate(sub.query.where, batch), False)
        batch, indices = batch.filter(keep), indices.filter(keep)
    return indices, batch


def source_batch(source: RowSchema, rows: pa.Table) -> pa.Table:
    """A one-source view's input ``rows`` (the upstream's columns, by name) in the operator's layout, as its
    expressions read them: what a routing evaluates GROUP BY values, windows or ranking groups on."""
    return pa.table({column_field(0, c.name): rows.column(c.name).cast(arrow_type(c.type)) for c in source.columns})


def partitions_table(partitions: int) -> tuple[int, ...]:
    """The partition owning each vnode, for ``partitions`` partitions (looked up per row)."""
    return tuple(partition_of_vnode(v, partitions) for v in range(VNODE_COUNT))


def view_key_partitions(schema: RowSchema, rows: pa.Table, of_vnode: Sequence[int]) -> pa.Array:
    """The changelog partition (int32) of each of a view's ``rows`` (its columns, by name): the vnode of
    the key bytes ``encode_batch`` gives the row, as the changelog writer places it. ``of_vnode``:
    :func:`partitions_table` of the view's partition count."""
    key = [(name, rows.column(name)) for name in schema.primary_key]
    return _partitions_of_key_rows(key, rows.num_rows, of_vnode)


def _partitions_of_key_rows(key: Sequence[tuple[str, pa.Array | pa.ChunkedArray]], count: int,
                            of_vnode: Sequence[int]) -> pa.Array:
    encoded: list[bytes] = encode_rows(key, count).to_pylist()
    return pa.array([of_vnode[zlib.crc32(k) % VNODE_COUNT] for k in encoded], pa.int32())
