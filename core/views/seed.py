"""A view computed in full at one epoch, as the seed its incremental operator carries on from.

Snapshot backfill computes a view at epoch E over its upstream's snapshot with one SQL query
(:func:`seed_sql`), then streams the result into the view's rows and operator state
(:class:`SeedDecoder`) in batches; from E + 1 on the incremental operator takes over, so what the
query returns must be exactly what the operator would have built from the same rows:

- filter/project: the view's rows, the query being the view itself (``to_sql``); the operator keeps
  no state for them;
- GROUP BY: per group the totals the operator's state holds (row count, per count/sum/avg call the
  non-NULL count and sum, per distinct min/max argument the multiset value -> count, which deletes of
  the current minimum need). The view's rows are derived from that state by the operator's own
  finalisation (:meth:`AggregateStage.rows_of`), so a later change's before-image is bit for bit the
  row written at E (a float ``avg`` computed by Spark could differ from the operator's in the last
  bit, and a downstream view retracting it would then miss its row);
- joins are refused: their state is every row of both sides, and their two upstreams' snapshots are
  not taken at one epoch; so is a top-N (its state is every row of each partition).

Pure: builds SQL text with sqlglot and turns Arrow record batches into rows and state entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from mvlog.row_schema import Row
from mvlog.views.aggregate import AggregateStage
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.expr import AggregateFunction
from mvlog.views.plan import ViewPlan
from mvlog.views.render import render_expr, sql_type, to_sql
from mvlog.views.window import windowed_source

_COUNTED = (AggregateFunction.COUNT, AggregateFunction.SUM, AggregateFunction.AVG)
_SUMMED = (AggregateFunction.SUM, AggregateFunction.AVG)
ROWS = "_n"


def group_column(index: int) -> str:
    return f"_g{index}"


def count_column(index: int) -> str:
    return f"_c{index}"


def sum_column(index: int) -> str:
    return f"_s{index}"


def multiset_column(index: int) -> str:
    return f"_m{index}"


def unseedable(plan: ViewPlan) -> str | None:
    """Why a snapshot cannot seed ``plan`` (None: it can)."""
    if plan.inner:
        return (f"view {plan.name!r} reads a subquery or WITH query: its operator state holds the inner "
                "queries' too, which snapshot backfill does not seed")
    if plan.is_join:
        return (f"view {plan.name!r} joins {' and '.join(plan.sources)}: snapshot backfill reads one upstream's "
                "snapshot, and a join's state holds both sides at one epoch")
    if plan.query.top_n is not None:
        return (f"view {plan.name!r} is a top-N: its state holds every row of each partition, which the seed "
                "(decoded in batches that may split a partition) does not build")
    return None


def check_seedable(plan: ViewPlan) -> None:
    """Raise ViewDefinitionError for a view a snapshot cannot seed (a join, a top-N)."""
    reason = unseedable(plan)
    if reason is not None:
        raise ViewDefinitionError(f"{reason}; use --backfill chunked")


def seed_sql(plan: ViewPlan, table: str, dialect: str = "spark") -> str:
    """The query computing the seed of ``plan`` over ``table`` (the one upstream's rows, its columns)."""
    check_seedable(plan)
    names = {plan.sources[0]: table}
    if not plan.is_aggregate:
        return to_sql(plan, names, dialect)
    query = plan.query
    stage = AggregateStage(query)
    source = exp.alias_(exp.to_table(table, dialect=dialect), query.sources[0].alias, table=True, quoted=True)
    if query.window is not None:  # one copy of each row per time window it falls in
        source = windowed_source(query, exp.to_table(table, dialect=dialect), query.sources[0].alias,
                                 render_expr(query.window.time, query))
    where = render_expr(query.where, query) if query.where is not None else None
    groups = [render_expr(g, query) for g in query.group_by]

    items: list[exp.Expr] = [exp.alias_(g.copy(), group_column(i), quoted=True) for i, g in enumerate(groups)]
    items.append(exp.alias_(exp.Count(this=exp.Star()), ROWS, quoted=True))
    for index, call in enumerate(stage.calls):  # FILTER clauses as the operator keeps them (``unfiltered``)
        if call.arg is None or call.function not in _COUNTED:
            continue
        arg = render_expr(call.arg, query)
        items.append(exp.alias_(exp.Count(this=arg.copy()), count_column(index), quoted=True))
        if call.function in _SUMMED:
            assert call.arg.type is not None  # plan_view types every aggregate argument
            total = exp.cast(exp.Sum(this=arg.copy()), sql_type(call.arg.type))  # DuckDB sums ints as HUGEINT
            items.append(exp.alias_(total, sum_column(index), quoted=True))
    totals = exp.select(*items).from_(source.copy())
    if where is not None:
        totals = totals.where(where.copy())
    if groups:
        totals = totals.group_by(*(g.copy() for g in groups))

    result = exp.select(exp.Star()).from_(totals.subquery("t", copy=False))
    for index, arg_expr in enumerate(stage.extremes):
        arg = render_expr(arg_expr, query)
        present = exp.Not(this=exp.Paren(this=exp.Is(this=exp.Paren(this=arg.copy()), expression=exp.Null())))
        values = exp.select(*(exp.alias_(g.copy(), group_column(i), quoted=True) for i, g in enumerate(groups)),
                            exp.alias_(arg.copy(), "_v", quoted=True),
                            exp.alias_(exp.Count(this=exp.Star()), "_k", quoted=True)).from_(source.copy())
        values = values.where(present if where is None else exp.and_(exp.Paren(this=where.copy()), present))
        values = values.group_by(*(g.copy() for g in groups), arg.copy())
        pairs = exp.ArrayAgg(this=exp.Struct(expressions=[exp.column("_v", quoted=True),
                                                          exp.column("_k", quoted=True)]))
        multiset = (exp.select(*(exp.column(group_column(i), quoted=True) for i in range(len(groups))),
                               exp.alias_(pairs, multiset_column(index), quoted=True))
                    .from_(values.subquery("v", copy=False)))
        if groups:
            multiset = multiset.group_by(*(exp.column(group_column(i), quoted=True) for i in range(len(groups))))
        alias = f"m{index}"
        on: exp.Expr = exp.and_(*(exp.NullSafeEQ(this=exp.column(group_column(i), table="t", quoted=True),
                                                 expression=exp.column(group_column(i), table=alias, quoted=True))
                                  for i in range(len(groups)))) if groups else exp.true()
        result = result.join(multiset.subquery(alias, copy=False), on=on, join_type="LEFT")
    # SELECT t.*, m0._m0, ...: the joined side's group columns would repeat t's names.
    result.set("expressions", [exp.Star() if not stage.extremes else exp.column(exp.Star(), table="t"),
                               *(exp.column(multiset_column(i), table=f"m{i}", quoted=True)
                                 for i in range(len(stage.extremes)))])
    return result.sql(dialect=dialect, identify=True)


@dataclass
class SeedBatch:
    """Part of a seed: view rows (each key once across the seed) and operator state entries."""

    rows: list[Row]
    state: dict[bytes, bytes] = field(default_factory=dict)


class SeedDecoder:
    """Turns record batches of :func:`seed_sql`'s result into view rows and operator state."""

    def __init__(self, plan: ViewPlan) -> None:
        check_seedable(plan)
        self.plan = plan
        self.names = plan.schema.names
        self._stage = AggregateStage(plan.query) if plan.is_aggregate else None
        self._multisets = [multiset_column(i) for i in range(len(self._stage.extremes))] if self._stage else []

    def split(self, batch: pa.RecordBatch, budget: int) -> Iterator[pa.RecordBatch]:
        """``batch`` in slices of at most ``budget`` rows plus min/max multiset entries (a group whose
        multisets alone exceed it is a slice of its own): what :meth:`decode` turns into Python objects
        at once stays bounded however many distinct values a group has (Arrow holds them compactly)."""
        if not self._multisets or batch.num_rows == 0:
            yield batch
            return
        weights = pa.array([1] * batch.num_rows, pa.int64())
        for name in self._multisets:
            lengths = pc.fill_null(pc.list_value_length(batch.column(name)), 0)
            weights = pc.add(weights, pc.cast(lengths, pa.int64()))
        start, load = 0, 0
        for position, weight in enumerate(weights.to_pylist()):
            if position > start and load + weight > budget:
                yield batch.slice(start, position - start)
                start, load = position, 0
            load += weight
        yield batch.slice(start)

    def decode(self, batch: pa.RecordBatch | pa.Table) -> SeedBatch:
        columns = batch.to_pydict()
        count = batch.num_rows
        if self._stage is None:
            values = [columns[name] for name in self.names]
            return SeedBatch([dict(zip(self.names, row, strict=True)) for row in zip(*values, strict=True)]
                             if values else [{} for _ in range(count)])
        stage = self._stage
        calls = range(len(stage.calls))
        groups = [columns[group_column(i)] for i in range(len(stage.group_types))]
        counts = [columns.get(count_column(i), [None] * count) for i in calls]
        sums = [columns.get(sum_column(i), [None] * count) for i in calls]
        multisets = [columns[multiset_column(i)] for i in range(len(stage.extremes))]
        seeded = []
        for position in range(count):
            pairs = [[(p["_v"], p["_k"]) for p in m[position]] if m[position] is not None else None
                     for m in multisets]
            seeded.append(stage.seeded([g[position] for g in groups], columns[ROWS][position],
                                       [c[position] for c in counts], [s[position] for s in sums], pairs))
        state = dict(stage.state_entry(group, group_state) for group, group_state in seeded)
        return SeedBatch(stage.rows_of(seeded), state)
