"""A planned view as one SQL query over tables of the upstream rows (Spark SQL or DuckDB).

The snapshot backfill computes a view at a checkpoint epoch with this query, and the tests use it as
the oracle for the incremental operator. It is rendered from the plan (not from the user's text) as a
sqlglot AST and transpiled by sqlglot, so both engines compute exactly what the operator maintains:

- every column is qualified and quoted, ``*`` is expanded, hidden key columns are selected too, and the
  result's columns are the view's schema, in order;
- implicit conversions are explicit CASTs, literals are typed (BIGINT, DOUBLE) so no engine picks
  INT or DECIMAL arithmetic;
- ``a / b`` is ``a / NULLIF(b, 0)``: NULL on division by zero on Spark (ANSI mode or not) and DuckDB.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from mvlog.row_schema import ColumnType
from mvlog.views.batch import referenced_columns
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.evaluate import WINDOW_START
from mvlog.views.expr import (
    AggregateCall,
    AggregateFunction,
    AggregateRef,
    Between,
    Binary,
    BinaryOp,
    Call,
    Case,
    Cast,
    Coalesce,
    ColumnRef,
    Expr,
    GroupRef,
    InList,
    IsNull,
    Literal,
    Negate,
    Not,
    RowNumber,
    WindowStart,
)
from mvlog.views.functions import render_call
from mvlog.views.plan import ViewPlan
from mvlog.views.query import PRESENT, JoinKind, Query
from mvlog.views.union import column_sources
from mvlog.views.window import windowed_source

_SQL_TYPES = {ColumnType.INT: "BIGINT", ColumnType.FLOAT: "DOUBLE", ColumnType.STRING: "STRING",
              ColumnType.BOOLEAN: "BOOLEAN", ColumnType.BYTES: "BINARY"}
_BINARY: dict[BinaryOp, type[exp.Binary]] = {
    BinaryOp.ADD: exp.Add, BinaryOp.SUB: exp.Sub, BinaryOp.MUL: exp.Mul, BinaryOp.DIV: exp.Div,
    BinaryOp.EQ: exp.EQ, BinaryOp.NEQ: exp.NEQ, BinaryOp.LT: exp.LT, BinaryOp.LTE: exp.LTE,
    BinaryOp.GT: exp.GT, BinaryOp.GTE: exp.GTE, BinaryOp.AND: exp.And, BinaryOp.OR: exp.Or,
}
_AGGREGATES: dict[AggregateFunction, type[exp.AggFunc]] = {
    AggregateFunction.COUNT: exp.Count, AggregateFunction.SUM: exp.Sum, AggregateFunction.AVG: exp.Avg,
    AggregateFunction.MIN: exp.Min, AggregateFunction.MAX: exp.Max,
}

_DISTINCT: dict[AggregateFunction, type[exp.AggFunc]] = {
    AggregateFunction.COUNT_DISTINCT: exp.Count, AggregateFunction.SUM_DISTINCT: exp.Sum,
    AggregateFunction.AVG_DISTINCT: exp.Avg,
}


def sql_type(kind: ColumnType) -> str:
    """The SQL type mvlog renders a column type as (the same on Spark and DuckDB)."""
    return _SQL_TYPES[kind]


def to_spark_sql(plan: ViewPlan, table_names: Mapping[str, str]) -> str:
    """The whole view as a Spark SQL query; ``table_names`` maps each upstream view to a table (or
    temporary view) holding its rows, with the upstream schema's columns."""
    return to_sql(plan, table_names, "spark")


def to_duckdb_sql(plan: ViewPlan, table_names: Mapping[str, str]) -> str:
    """The whole view as a DuckDB query (see ``to_spark_sql``)."""
    return to_sql(plan, table_names, "duckdb")


def to_sql(plan: ViewPlan, table_names: Mapping[str, str], dialect: str) -> str:
    missing = [view for view in plan.sources if view not in table_names]
    if missing:
        raise ViewDefinitionError(f"no table given for upstream view(s) {', '.join(missing)} of "
                                  f"{plan.name!r}")
    if plan.union:
        return _union(plan, table_names, dialect).sql(dialect=dialect, identify=True)
    return _select(plan.query, table_names, dialect, dict(plan.inner)).sql(dialect=dialect, identify=True)


def _union(plan: ViewPlan, table_names: Mapping[str, str], dialect: str) -> exp.Expr:
    """Each branch's query selecting the view's columns (its own, cast to the view's types; its number;
    its key in its hidden key columns, NULL in the others'), under UNION ALL."""
    branches = [branch for _, branch in plan.inner]
    selects = []
    for number, branch in enumerate(branches):
        rows = exp.alias_(exp.Subquery(this=_select(branch.query, table_names, dialect, dict(branch.inner))),
                          "b", table=True, quoted=True)
        items = []
        for column, source in zip(plan.schema.columns, column_sources(plan.schema, branches, number), strict=True):
            value: exp.Expr
            if isinstance(source, str):
                value = exp.column(source, table="b", quoted=True)
                if branch.schema.column(source).type is not column.type:
                    value = exp.cast(value, _SQL_TYPES[column.type])
            elif source is None:
                value = exp.cast(exp.Null(), _SQL_TYPES[column.type])
            else:
                value = _literal(source, column.type)
            items.append(exp.alias_(value, column.name, quoted=True))
        selects.append(exp.select(*items).from_(rows))
    union: exp.Expr = selects[0]
    for select in selects[1:]:
        union = exp.union(union, select, distinct=False)
    return union


def _select(query: Query, table_names: Mapping[str, str], dialect: str,
            inner: Mapping[str, ViewPlan] | None = None) -> exp.Select:
    if query.top_n is not None:
        return _top_n(query, table_names, dialect, inner or {})
    items = [exp.alias_(render_expr(o.expr, query), o.name, quoted=True) for o in query.outputs]
    return _from_where_group(exp.select(*items), query, table_names, dialect, inner or {})


def _from_where_group(select: exp.Select, query: Query, table_names: Mapping[str, str], dialect: str,
                      inner: Mapping[str, ViewPlan]) -> exp.Select:
    tables = [_source(query, side, table_names, dialect, inner) for side in range(len(query.sources))]
    if query.window is not None:  # one copy of each row of the time's source per time window it falls in
        side = query.window.side
        source = query.sources[side]
        tables[side] = windowed_source(query, exp.to_table(table_names[source.view], dialect=dialect),
                                       source.alias, render_expr(query.window.time, query))
    select = select.from_(tables[0])
    for index, join in enumerate(query.joins):
        conditions: list[exp.Expr] = [exp.EQ(this=render_expr(c.left, query), expression=render_expr(c.right, query))
                                      for c in join.on]
        if join.residual is not None:
            conditions.append(_paren(render_expr(join.residual, query)))
        if join.kind.filters:  # a semi or anti join: the subquery of WHERE it came from, correlated
            exists = exp.Exists(this=exp.select(exp.Literal.number(1)).from_(tables[index + 1])
                                .where(exp.and_(*conditions)))
            select = select.where(exists if join.kind is JoinKind.SEMI else exp.Not(this=exists))
            continue
        select = select.join(tables[index + 1], on=exp.and_(*conditions), join_type=join.kind.value)
    if query.where is not None:
        select = select.where(render_expr(query.where, query))
    if query.group_by:
        select = select.group_by(*(render_expr(g, query) for g in query.group_by))
    if query.having is not None:
        select = select.having(render_expr(query.having, query))
    return select


_RANK = "__mvlog_rank"


def _top_n(query: Query, table_names: Mapping[str, str], dialect: str, inner: Mapping[str, ViewPlan]
           ) -> exp.Select:
    """``SELECT <outputs> FROM (SELECT <outputs>, ROW_NUMBER() OVER (...) AS rank FROM ...) WHERE rank <= N``,
    the ORDER BY followed by the sources' key (the operator's tiebreak)."""
    assert query.top_n is not None
    rank = next((o.name for o in query.outputs if isinstance(o.expr, RowNumber)), _RANK)
    items = [exp.alias_(render_expr(o.expr, query), o.name, quoted=True) for o in query.outputs]
    if rank == _RANK:
        items.append(exp.alias_(render_expr(RowNumber(), query), rank, quoted=True))
    ranked = _from_where_group(exp.select(*items), query, table_names, dialect, inner)
    outer = exp.select(*(exp.column(o.name, table="_top_n", quoted=True) for o in query.outputs))
    limit = exp.LTE(this=exp.column(rank, table="_top_n", quoted=True),
                    expression=exp.Literal.number(query.top_n.limit))
    return outer.from_(ranked.subquery("_top_n", copy=False)).where(limit)


def _row_number(query: Query) -> exp.Expr:
    assert query.top_n is not None
    terms = [exp.Ordered(this=render_expr(k.expr, query), desc=k.descending, nulls_first=k.nulls_first)
             for k in query.top_n.order]
    terms += [exp.Ordered(this=render_expr(t, query), desc=False, nulls_first=True) for t in query.top_n.tiebreak]
    partition = [render_expr(p, query) for p in query.top_n.partition]
    window = exp.Window(this=exp.RowNumber(), partition_by=partition or None, order=exp.Order(expressions=terms))
    return exp.cast(window, "BIGINT")  # Spark's row_number() is an INT


def _source(query: Query, side: int, table_names: Mapping[str, str], dialect: str,
            inner: Mapping[str, ViewPlan]) -> exp.Expr:
    """A source's table (or a subquery's or WITH query's SELECT, inlined) under its alias; where the plan
    reads its ``PRESENT`` pseudo-column, a subquery adding it (TRUE on every row, so NULL exactly where an
    outer join null-extends the source)."""
    source = query.sources[side]
    table: exp.Expr
    if source.view in inner:
        plan = inner[source.view]
        table = exp.alias_(exp.Subquery(this=_select(plan.query, table_names, dialect, dict(plan.inner))),
                           source.alias, table=True, quoted=True)
        if (side, PRESENT) not in referenced_columns(query):
            return table
    else:
        table = exp.to_table(table_names[source.view], dialect=dialect)
    if (side, PRESENT) in referenced_columns(query):
        present = exp.select(exp.Star(), exp.alias_(exp.true(), PRESENT, quoted=True)).from_(table)
        return exp.alias_(exp.Subquery(this=present), source.alias, table=True, quoted=True)
    return exp.alias_(table, source.alias, table=True, quoted=True)


def render_expr(expr: Expr, query: Query) -> exp.Expr:
    """One plan expression as a sqlglot node (columns qualified by their source's alias)."""
    match expr:
        case ColumnRef(side=side, column=column):
            return exp.column(column, table=query.sources[side].alias, quoted=True)
        case GroupRef(index=index):
            return render_expr(query.group_by[index], query)
        case AggregateRef(index=index):
            return _aggregate(query.aggregates[index], query)
        case Literal(value=value, type=kind):
            return _literal(value, kind)
        case Cast(operand=operand, type=kind):
            return exp.cast(render_expr(operand, query), _SQL_TYPES[kind])
        case Binary(op=BinaryOp.DIV, left=left, right=right):
            divisor = exp.Nullif(this=render_expr(right, query), expression=exp.Literal.number(0))
            return exp.Div(this=_paren(render_expr(left, query)), expression=divisor)
        case Binary(op=op, left=left, right=right):
            return _BINARY[op](this=_paren(render_expr(left, query)), expression=_paren(render_expr(right, query)))
        case Not(operand=operand):
            return exp.Not(this=_paren(render_expr(operand, query)))
        case Negate(operand=operand):
            return exp.Neg(this=_paren(render_expr(operand, query)))
        case IsNull(operand=operand, negated=negated):
            test = exp.Is(this=_paren(render_expr(operand, query)), expression=exp.Null())
            return exp.Not(this=exp.Paren(this=test)) if negated else test
        case Between(operand=operand, low=low, high=high):
            return exp.Paren(this=exp.Between(this=_paren(render_expr(operand, query)),
                                              low=_paren(render_expr(low, query)),
                                              high=_paren(render_expr(high, query))))
        case InList(operand=operand, values=values):
            return exp.Paren(this=exp.In(this=_paren(render_expr(operand, query)),
                                         expressions=[render_expr(v, query) for v in values]))
        case Case(whens=whens, default=default):
            case = exp.Case()
            for condition, result in whens:
                case = case.when(render_expr(condition, query), render_expr(result, query))
            return case.else_(render_expr(default, query))
        case Coalesce(args=args):
            first, *rest = (render_expr(a, query) for a in args)
            return exp.Coalesce(this=first, expressions=rest)
        case RowNumber():
            return _row_number(query)
        case WindowStart():
            assert query.window is not None
            return exp.column(WINDOW_START, table=query.sources[query.window.side].alias, quoted=True)
        case Call(args=args):
            return render_call(expr, [render_expr(a, query) for a in args])
    raise TypeError(f"cannot render {expr!r}")  # unreachable for plans made by plan_view


def _aggregate(call: AggregateCall, query: Query) -> exp.Expr:
    node: exp.Expr
    if call.function is AggregateFunction.COUNT_ROWS:
        node = exp.Count(this=exp.Star())
    elif call.function in _DISTINCT:
        assert call.arg is not None
        node = _DISTINCT[call.function](this=exp.Distinct(expressions=[render_expr(call.arg, query)]))
    else:
        assert call.arg is not None
        node = _AGGREGATES[call.function](this=render_expr(call.arg, query))
    if call.filter is not None:
        node = exp.Filter(this=node, expression=exp.Where(this=render_expr(call.filter, query)))
    return node


def _literal(value: object, kind: ColumnType | None) -> exp.Expr:
    if value is None:
        return exp.Null() if kind is None else exp.cast(exp.Null(), _SQL_TYPES[kind])
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.cast(exp.Literal.number(value), "BIGINT")
    if isinstance(value, float):
        return exp.cast(exp.Literal.number(repr(value)), "DOUBLE")
    return exp.Literal.string(str(value))


def _paren(node: exp.Expr) -> exp.Expr:
    """Explicit parentheses around operands, so precedence never depends on the dialect's printer."""
    if isinstance(node, exp.Binary | exp.Not | exp.Neg | exp.Is):
        return exp.Paren(this=node)
    return node
