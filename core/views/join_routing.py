"""Where the input rows and operator state of an equi-join of two sources (inner, left, right or full outer,
semi or anti; two views, or one view with itself) live when its operator runs in Spark's tasks: by the
partition of their **join key**, not of the view's key (issue 19 item 2, joins).

A join view's key is both sources' keys (``mvlog.views.plan``): the view row of a pair ``(a, b)`` lands
in the partition of ``vnode(encode(a.pk, b.pk))``, which depends on both rows. A row ``a`` matches every
row of the other side with its join key, and those pairs' view rows are spread over every partition, so
no placement of ``a`` by the view key's partition can hold all of its pairs: routing the inputs by the
output key (what a GROUP BY does, :mod:`mvlog.views.routing`) does not work for a join. The operator's
state is per join key (a bucket ``j0[k]`` / ``j1[k]`` per side, :mod:`mvlog.views.join`), and every pair
it makes is inside one join key. So the join runs in two steps, each partitioned by its own key:

1. both inputs' signed rows are shuffled by the partition of their join key
   (:meth:`JoinRouting.partitions_of`); the task of join-key partition ``j`` holds every change of its
   join keys on both sides, reads and stages the buckets of its join keys only
   (:meth:`JoinRouting.partitions_of_state_keys`: the state keys of two tasks are disjoint), and runs the
   pure operator on them;
2. its output (the view's changes as signed rows) is shuffled again by the partition of the view's key
   (:func:`mvlog.views.routing.view_key_partitions`), where the changes of one view key, from whichever
   join-key tasks made them, are consolidated (a row whose join key changed is retracted by the old key's
   task and asserted by the new one's) and written as that partition's epoch.

An outer join routes the same way: a preserved row is null-extended exactly when its join key's bucket
of the other side has no match for it (with a residual condition, no pair of that bucket passes it), so
its null-extended row is asserted and retracted by the task that holds both buckets of its join key, and
the second shuffle consolidates it like any other view row (its view key has NULL in the other side's
key columns, ``mvlog.views.plan``). ``tests/unit/test_join_routing.py`` checks, for every kind, that
the split operators give the single operator's changes and state.

A semi or anti join (``EXISTS``, ``IN``, ``NOT EXISTS``: :mod:`mvlog.views.semi_join`) is one join step
too, its state the same buckets per join key, its output the left rows with (without) a match in their
join key's bucket. Its right side is a subquery, an inner plan over another view: when that is a
filter/project passing the correlated columns through (:func:`subquery_of`), a row of that view has
the join key of the subquery row it makes, read off its own columns, so its rows are routed like a
side's and each task runs the whole operator (subquery included, stateless) on its share.

A top-N over an inner equi-join ranked per join key (``ROW_NUMBER() OVER (PARTITION BY <one side's join
key columns> ...)``, Nexmark's q9 "winning bids": the highest bid of each auction) is one join step too:
every joined row of a ranking group has the group's values as its join key, so the task of that join key
holds the whole group, and the group's state key (``t[...]``, :mod:`mvlog.views.topn`) encodes the same
values with the same types as the join key's bytes, so it has the same owner (:func:`top_n_over_join`).
The task runs the join and the ranking together; the second shuffle consolidates the view's changes as
for a join (a row leaving one group's top N and entering another's is one update there). An outer join
is not routed this way: its null-extended rows would fall in a ranking group of NULL, whose owner is not
partition 0 where NULL join keys go.

A **chain of equi-joins on one key** (``a JOIN b ON a.k = b.k LEFT JOIN c ON b.k = c.k``: every step
compares each source's same columns, in the same order, as the same types; an order enriched by several
tables keyed by its id) is one join step too, however many sources: a combo (a row of each source so far)
whose step-``i`` join key is ``v`` holds only rows whose key columns are ``v`` (a match makes them equal;
a null-extended side adds none), all of them routed to ``v``'s partition, so that task makes the combo,
holds both buckets of step ``i`` for ``v`` (``j<i>.0[v]`` / ``j<i>.1[v]``, the same bytes after the tag as
step 0's), and runs every step of the operator on its share (:func:`join_chain_on_one_key`). A combo whose
step key has a NULL (a null-extended side) touches no state, in whichever task holds it, as a row with a
NULL join key does. A chain whose steps compare other columns (``JOIN c ON b.w = c.id``) needs a shuffle
per step and stays on the driver.

A join key's partition is ``partition_of_vnode(crc32(the JSON of its key values) % 256)``: the bytes of
its state key after the tag (``encode_key``), so a state key's owner is read off the key itself. Rows
whose join key has a NULL never match and touch no state: an inner or semi join drops them, an outer
join null-extends a preserved side's straight away (its retraction too, when the row changes), an anti
join keeps its left rows, all from the row alone. Any task can do that, so they all go to partition 0;
their view rows are then routed by their own view key like the rest.

Pure: Arrow in, partitions out.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pyarrow as pa

from mvlog.row_schema import ColumnType
from mvlog.views.expr import ColumnRef, Expr
from mvlog.views.operator import ViewOperator
from mvlog.views.plan import ViewPlan
from mvlog.views.query import JoinKind
from mvlog.views.routing import GroupRouting, each_row_once, filter_of_one_view, keyed_by_groups, partitions_table
from mvlog.views.state_codec import TOP_N_TAG, encode_key
from mvlog.vnode import VNODE_COUNT

#: A join step's state key: its tag (``j0``/``j1`` for step 0, ``j<i>.0``/``j<i>.1`` after), then its key.
_BUCKET = re.compile(rb"j(?:[01]|[1-9][0-9]*\.[01])(?=\[)")


def two_source_equi_join(plan: ViewPlan) -> bool:
    """A view over an equi-join of two sources, projected and filtered only: the views :class:`JoinRouting`
    can partition. An inner or outer (left, right, full) join of two views or of one view with itself,
    with or without a residual condition; or a semi or anti join (``EXISTS`` / ``IN`` / ``NOT EXISTS``)
    whose subquery is a filter/project of a view (another, or the same), passing its correlated columns through
    (:func:`subquery_of`: its rows are routed by that view's columns). Not a chain of joins (the second
    step's key is another column), not an aggregate, top-N, window, union or other subquery over or in a
    join (state of another shape).

    A self-join reads its one upstream once and routes each row twice, once per side by that side's join
    key (:meth:`JoinRouting.partitions_of`): the operator of a join-key task then gets each side's rows
    apart (:meth:`JoinRouting.inputs`), which the one view's changes of a single operator cannot say."""
    query = plan.query
    if query.is_aggregate or query.top_n is not None or query.window is not None:
        return False
    return _equi_join_of_two(plan)


def join_chain_on_one_key(plan: ViewPlan) -> bool:
    """A view over a chain of three or more sources, each step an inner or outer equi-join on the same
    key (:func:`chain_key_columns`), projected and filtered only."""
    query = plan.query
    if query.is_aggregate or query.top_n is not None or query.window is not None:
        return False
    return chain_key_columns(plan) is not None


def chain_key_columns(plan: ViewPlan) -> list[list[str]] | None:
    """Each source's columns of the one key every step of a chain of three or more sources compares (inner
    or outer joins; views, a view read twice too), in the ON clauses' order; None when a step compares
    other columns, in another order or as another type, or the query is not such a chain."""
    query = plan.query
    if plan.union or plan.inner or len(query.sources) < 3 or any(step.kind.filters for step in query.joins):
        return None
    first = query.joins[0].on
    kinds = [c.type for c in first]
    columns: list[list[str] | None] = [[c.left.column for c in first], [c.right.column for c in first]]
    for step in query.joins[1:]:
        on = step.on
        if len(on) != len(kinds) or any(c.type != kind for c, kind in zip(on, kinds, strict=True)):
            return None
        for position, condition in enumerate(on):
            known = columns[condition.left.side]
            if known is None or known[position] != condition.left.column:
                return None
        columns.append([c.right.column for c in on])
    return [cast(list[str], c) for c in columns]


def aggregate_over_join(plan: ViewPlan) -> bool:
    """A GROUP BY keyed by its groups (:func:`~mvlog.views.routing.keyed_by_groups`; a global aggregate
    too, all of whose joined rows go to its one row's partition; a windowed one, whose joined rows go to
    the partitions of their windows) over an inner, outer, semi or anti equi-join of two sources (two
    views, or one with itself; a semi or anti join's subquery routable, :func:`subquery_of`), or over a
    chain of joins on one key (:func:`chain_key_columns`): its
    operator runs in two steps, the join per join key and the aggregate per group (a third shuffle, by
    the group's view partition, between them)."""
    return keyed_by_groups(plan) and _equi_join_on_one_key(plan)


def top_n_over_join(plan: ViewPlan) -> bool:
    """A top-N over an inner equi-join of two views (or of one view with itself), or over an inner chain of
    joins on one key, whose PARTITION BY is one source's join key: its columns, in the ON clause's order,
    of the types they are compared as. A ranking group is then one join key, in one join-key task, and its
    state key has that join key's owner."""
    query = plan.query
    top_n = query.top_n
    if top_n is None or query.is_aggregate or query.window is not None or not _equi_join_on_one_key(plan):
        return False
    if any(step.kind is not JoinKind.INNER for step in query.joins):
        return False
    kinds = [c.type for c in query.joins[0].on]
    return any(_is_key(top_n.partition, side, names, kinds) for side, names in enumerate(source_key_columns(plan)))


def source_key_columns(plan: ViewPlan) -> list[list[str]]:
    """Each source's columns of the join key, in the ON clause's order: a chain's on one key
    (:func:`chain_key_columns`), or the one step's FROM and JOIN sides (for a semi or anti join, the
    subquery's output names)."""
    on = plan.query.joins[0].on
    return chain_key_columns(plan) or [[c.left.column for c in on], [c.right.column for c in on]]


def _is_key(exprs: Sequence[Expr], side: int, columns: Sequence[str], kinds: Sequence[ColumnType | None]) -> bool:
    """``exprs`` are source ``side``'s columns ``columns``, in order, each of the type in ``kinds``."""
    return len(exprs) == len(columns) and all(
        isinstance(e, ColumnRef) and e.side == side and e.column == column and e.type == kind
        for e, column, kind in zip(exprs, columns, kinds, strict=True))


def routed_by_join_key(plan: ViewPlan) -> bool:
    """A view whose operator :class:`JoinRouting` partitions: an equi-join of two sources
    (:func:`two_source_equi_join`) or a chain of them on one key (:func:`join_chain_on_one_key`), a GROUP
    BY over one (:func:`aggregate_over_join`), or a top-N over an inner one ranked per join key
    (:func:`top_n_over_join`)."""
    return (two_source_equi_join(plan) or join_chain_on_one_key(plan) or aggregate_over_join(plan)
            or top_n_over_join(plan))


def _equi_join_on_one_key(plan: ViewPlan) -> bool:
    """One equi-join step of two sources (:func:`_equi_join_of_two`), or a chain of them on one key."""
    return _equi_join_of_two(plan) or chain_key_columns(plan) is not None


def _equi_join_of_two(plan: ViewPlan) -> bool:
    """One equi-join step of two sources, the second a view or a semi or anti join's routable subquery."""
    query = plan.query
    if plan.union or len(query.sources) != 2 or len(query.joins) != 1:
        return False
    if query.joins[0].kind.filters:
        return subquery_of(plan) is not None
    return not plan.inner


def subquery_of(plan: ViewPlan) -> ViewPlan | None:
    """A semi or anti join's subquery (source 1, an inner plan), when it is a filter/project of one view
    whose outputs the join reads are that view's columns passed through; else None."""
    query = plan.query
    inner = dict(plan.inner)
    if (len(query.sources) != 2 or len(query.joins) != 1 or not query.joins[0].kind.filters or len(inner) != 1
            or query.sources[1].view not in inner or query.sources[0].view in inner):
        return None
    sub = inner[query.sources[1].view]
    if not filter_of_one_view(sub):
        return None
    outputs = {o.name: o.expr for o in sub.query.outputs}
    passed = all(isinstance(outputs.get(c.right.column), ColumnRef) for c in query.joins[0].on)
    return sub if passed else None


@dataclass(frozen=True)
class JoinRouting:
    """Routes an equi-join's input rows (each upstream's columns, by name) to join-key partitions."""

    plan: ViewPlan
    partitions: int
    _of_vnode: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _subquery: ViewPlan | None = field(init=False, repr=False, compare=False)  # a semi or anti join's
    _columns: list[list[str]] = field(init=False, repr=False, compare=False)  # each source's key columns
    #: A GROUP BY over the join: where its groups (its joined rows, its groups' state) go, the third step.
    groups: GroupRouting | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not routed_by_join_key(self.plan):
            raise ValueError(f"view {self.plan.name!r} is not an equi-join of two views or a chain of them on "
                             "one key, a GROUP BY over one or a top-N over one ranked per join key")
        object.__setattr__(self, "_of_vnode", partitions_table(self.partitions))
        groups = GroupRouting(self.plan, self.partitions) if aggregate_over_join(self.plan) else None
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "_subquery", subquery_of(self.plan))
        object.__setattr__(self, "_columns", source_key_columns(self.plan))

    @property
    def _kinds(self) -> list[ColumnType | None]:
        return [c.type for c in self.plan.query.joins[0].on]

    def upstreams(self) -> tuple[str, ...]:
        """The views the data source reads for each side: the join's sources (two, or a chain's), or for a
        semi or anti join, the FROM view and the view its subquery reads."""
        sources, sub = self.plan.query.sources, self._subquery
        if sub is not None:
            return sources[0].view, sub.query.sources[0].view
        return tuple(source.view for source in sources)

    def self_join(self) -> bool:
        """Some sides read the same view (its rows are routed once per side)."""
        return len(set(self.upstreams())) < len(self.upstreams())

    def inputs(self) -> tuple[str, ...]:
        """The name each side's changes go under in the input of :meth:`operator_plan`'s operator: the
        upstreams' names, but ``<view>#<side>`` for a side reading a view an earlier side reads (a
        self-join's second side: ``<view>#1``): in a join-key task the sides hold different rows of the
        one view (each routed by its own side's join key)."""
        upstreams = self.upstreams()
        return tuple(f"{view}#{side}" if view in upstreams[:side] else view for side, view in enumerate(upstreams))

    def operator_plan(self) -> ViewPlan:
        """The plan a join-key task's operator runs: the view's, each source read again (a self-join's
        second, or its semi or anti join's subquery's source) renamed to its input (:meth:`inputs`). The
        operator's state does not change (its buckets are per step and side, ``j0`` / ``j1``, ``j1.0`` ...),
        nor its output: it reads each source's changes by that source's view name, and a single operator
        gives every side the one view's changes."""
        return read_sides_as(self.plan, self.inputs()) if self.self_join() else self.plan

    def columns(self, side: int) -> list[str]:
        """The join key's columns of upstream ``side`` (0: FROM, 1: JOIN, or the view a semi or anti
        join's subquery reads, whose column each of its outputs passes through; a chain's ``side``-th
        source), in the ON clause's order."""
        sub = self._subquery
        if side == 0 or sub is None:
            return self._columns[side]
        outputs = {o.name: o.expr for o in sub.query.outputs}
        return [cast(ColumnRef, outputs[name]).column for name in self._columns[side]]

    def partitions_of(self, side: int, rows: pa.Table) -> pa.Array:
        """The join-key partition (int32) of each row of source ``side`` (its columns, by name)."""
        columns = [rows.column(name) for name in self.columns(side)]
        return join_key_partitions(columns, self._kinds, rows.num_rows, self._of_vnode)

    def fan_out(self, side: int, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Where each row of source ``side`` goes: (row index, partition) pairs, one per row."""
        return each_row_once(self.partitions_of(side, rows))

    def first_step(self, partition: int) -> ViewOperator:
        """The operator of join-key task ``partition``: all of what it is given."""
        return ViewOperator(self.operator_plan())

    def partition_of_key(self, values: Sequence[Any]) -> int:
        """The partition of one join key (its values in the ON clause's order, of the types compared)."""
        return partition_of_join_key(values, self._kinds, self._of_vnode)

    def partitions_of_state_keys(self, keys: Sequence[bytes]) -> list[int]:
        """The partition whose task owns each state key: a bucket of either side of a step (``j0[...]``,
        ``j1[...]``, a chain's ``j<i>.0[...]``, ``j<i>.1[...]``: one key's bytes after the tag, whatever the
        step), or a top-N's ranking group (``t[...]``, whose values are a join key's:
        :func:`top_n_over_join`)."""
        ranked = self.plan.query.top_n is not None
        owners = []
        for key in keys:
            if (owner := partition_of_bucket(key, self._of_vnode)) is not None:
                owners.append(owner)
            elif ranked and key.startswith(TOP_N_TAG + b"["):
                owners.append(self._of_vnode[zlib.crc32(key[len(TOP_N_TAG):]) % VNODE_COUNT])
            else:
                raise ValueError(f"{key!r} is not a join bucket's state key")
        return owners


def partition_of_join_key(values: Sequence[Any], kinds: Sequence[ColumnType | None], of_vnode: Sequence[int]) -> int:
    """The partition of one join key (its values in the ON clause's order, compared as ``kinds``): the vnode
    of its state key's bytes after the tag. A key with a NULL goes to partition 0: it matches nothing and
    stores nothing (an outer join null-extends its row from the row alone)."""
    if any(v is None for v in values):
        return 0
    return of_vnode[zlib.crc32(encode_key(b"", values, kinds)) % VNODE_COUNT]


def join_key_partitions(columns: Sequence[pa.Array | pa.ChunkedArray], kinds: Sequence[ColumnType | None], count: int,
                        of_vnode: Sequence[int]) -> pa.Array:
    """The partition (int32) of each of ``count`` join keys given as one array per key column. Each distinct
    key is encoded and hashed once: a window's start repeats in every row of the window (a hopping window's
    copies of a row, Nexmark q5's per-window join), a hot join key in every row of it."""
    values = [column.to_pylist() for column in columns]
    rows = zip(*values, strict=True) if values else [()] * count
    owners: dict[tuple[Any, ...], int] = {}
    out = []
    for key in rows:
        owner = owners.get(key)
        if owner is None:
            owner = owners[key] = partition_of_join_key(key, kinds, of_vnode)
        out.append(owner)
    return pa.array(out, pa.int32())


def partition_of_bucket(key: bytes, of_vnode: Sequence[int]) -> int | None:
    """The partition owning a join step's bucket (``j0[...]``, ``j1[...]``, a chain's ``j<i>.0[...]``: one
    key's bytes after the tag, whatever the step), or None when ``key`` is not one."""
    if (tag := _BUCKET.match(key)) is None:
        return None
    return of_vnode[zlib.crc32(key[tag.end():]) % VNODE_COUNT]


def read_sides_as(plan: ViewPlan, inputs: Sequence[str]) -> ViewPlan:
    """``plan`` (one whose sides a routing of :mod:`mvlog.views.keyed_routing` routes, or a filter/project or
    GROUP BY of one view) with side ``i`` read under ``inputs[i]``: its query's source ``i`` when that is a
    view, the view a subquery in FROM reads (:func:`reading_as`) when it is one, or for a semi or anti join the
    FROM view and the view its subquery reads (the subquery keeps its name). A task's operator then gets each
    side's routed rows apart (a self-join's, a union branch's)."""
    reads = tuple(dict.fromkeys(inputs))
    if (sub := subquery_of(plan)) is not None:
        renamed = _read_as(sub, 0, inputs[1], (inputs[1],))
        inner = tuple((name, renamed if found is sub else found) for name, found in plan.inner)
        return _read_as(replace(plan, inner=inner), 0, inputs[0], reads)
    query, subqueries = plan.query, dict(plan.inner)
    sources, read = list(query.sources), {}
    for side, (source, name) in enumerate(zip(query.sources, inputs, strict=True)):
        if source.view in subqueries:
            read[source.view] = reading_as(subqueries[source.view], name)
        else:
            sources[side] = replace(source, view=name)
    inner = tuple((name, read.get(name, found)) for name, found in plan.inner)
    return replace(plan, sources=reads, inner=inner, query=replace(query, sources=tuple(sources)))


def reading_as(sub: ViewPlan, name: str) -> ViewPlan:
    """``sub``, a query of one view (maybe through a chain of one-source subqueries: a GROUP BY over a
    filter/project, or over a GROUP BY), reading that view as ``name``."""
    if sub.inner:
        (inner_name, inner), = sub.inner
        return replace(sub, sources=(name,), inner=((inner_name, reading_as(inner, name)),))
    query = sub.query
    return replace(sub, sources=(name,), query=replace(query, sources=(replace(query.sources[0], view=name),)))


def _read_as(plan: ViewPlan, source: int, name: str, reads: tuple[str, ...]) -> ViewPlan:
    """``plan`` with its query's source ``source`` read under ``name``, and the views it reads ``reads``."""
    sources = list(plan.query.sources)
    sources[source] = replace(sources[source], view=name)
    return replace(plan, sources=reads, query=replace(plan.query, sources=tuple(sources)))
