"""Planning a top-N per group: ``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)`` filtered by rank.

The one shape recognised (the way Flink, RisingWave and Spark users write it)::

    SELECT <columns of the subquery, or *> FROM (
        SELECT ..., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o [DESC]) AS rn FROM v [JOIN ...] [WHERE ...]
    ) [AS x] WHERE rn <= N                                       -- or rn < N, rn = 1, N >= rn

The subquery is planned like a filter/project view (its key is the sources' key); the view's rows are,
per partition, its rows ranked 1..N. Ties in ORDER BY are broken by the sources' key, ascending, in the
operator and in the rendered SQL alike, so which rows are in the top N is a function of the rows (a
plain ``ROW_NUMBER`` leaves ties to the engine). The view's key is the sources' key: a row that moves in
the ranking keeps its key, and ``rn``, when selected, is an ordinary column that changes with it.

Anything else around a ``ROW_NUMBER`` subquery (a filter besides the rank, expressions over its columns,
an aggregate inside it) is refused with its position: write it inside the subquery or in a view on this one.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import Token, TokenType, exp

from mvlog.row_schema import Column, RowSchema
from mvlog.views.binder import Binder
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.expr import Expr, Literal, RowNumber
from mvlog.views.parse import REFUSED_CLAUSES, ParsedSelect, arg, check_subquery
from mvlog.views.plan import ViewPlan, _check_names, _with_key, plan_select
from mvlog.views.query import OutputColumn, Query, SortKey, TopN

_OUTER_CLAUSES = {"expressions", "from", "where"}


def row_number_item(statement: exp.Expr) -> exp.Alias | None:
    """The ``ROW_NUMBER() OVER (...) AS rn`` item of ``statement``'s FROM subquery, if it has one (the
    statement is then planned as a top-N, or refused as one)."""
    if not isinstance(statement, exp.Select):
        return None
    source = arg(statement, "from")
    if not isinstance(source, exp.From) or not isinstance(source.this, exp.Subquery):
        return None
    inner = source.this.this
    if not isinstance(inner, exp.Select):
        return None
    for item in inner.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Window) and isinstance(node.this, exp.RowNumber):
            return item if isinstance(item, exp.Alias) else exp.Alias(this=item)
    return None


def plan_top_n(name: str, sql: str, tokens: tuple[Token, ...], statement: exp.Expr,
               upstreams: Mapping[str, RowSchema]) -> ViewPlan:
    assert isinstance(statement, exp.Select)
    item = row_number_item(statement)
    assert item is not None
    outer = ParsedSelect(sql, statement, tokens, (), ())  # locates the parts of the whole statement
    window = item.this
    if not item.alias:
        raise outer.unsupported("ROW_NUMBER() without an alias", window, "ROW_NUMBER",
                                hint="name it, e.g. ROW_NUMBER() OVER (...) AS rn, and filter on rn <= N")
    rank_name = item.alias
    _check_outer(outer, statement)
    _check_window(outer, window)
    source = arg(statement, "from")
    assert isinstance(source, exp.From) and isinstance(source.this, exp.Subquery)
    subquery = source.this
    inner_select = subquery.this
    for other in inner_select.expressions:
        window_node = next((n for n in other.walk() if isinstance(n, exp.Window)), None) if other is not item else None
        if window_node is not None:
            raise outer.unsupported("window function", window_node,
                                    hint="a top-N subquery has one ROW_NUMBER() OVER (...) and no other window")
    # The subquery is planned with the ROW_NUMBER item as a placeholder column (its name and position
    # are checked like any other), which then becomes the RowNumber.
    placeholder = inner_select.copy()
    placeholder.set("expressions", [exp.alias_(exp.Literal.number(0), rank_name, quoted=item.args["alias"].quoted)
                                    if i is item else i.copy() for i in inner_select.expressions])
    inner_parsed = check_subquery(outer, placeholder)
    inner = plan_select(name, inner_parsed, upstreams)
    if inner.is_aggregate:
        raise outer.unsupported("ROW_NUMBER() over an aggregate", inner_select, TokenType.SELECT,
                                hint="create the aggregate as a view and rank its rows in a view on it")
    binder = Binder(inner_parsed, inner.query.sources, inner.query.extendable_sides)
    partition = tuple(binder.row_expr(p, "PARTITION BY") for p in window.args.get("partition_by") or [])
    order = tuple(SortKey(binder.row_expr(o.this, "ORDER BY"), bool(o.args.get("desc")),
                          bool(o.args.get("nulls_first")))
                  for o in window.args["order"].expressions)
    columns = {}
    for output in inner.query.outputs:
        expr: Expr = output.expr
        if output.name == rank_name and isinstance(expr, Literal):
            expr = RowNumber()
        if not output.hidden:
            columns[output.name.casefold()] = OutputColumn(output.name, expr)
    limit = _rank_limit(outer, statement, rank_name, subquery.alias_or_name)
    outputs = _outer_outputs(outer, statement, columns, subquery.alias_or_name)
    _check_names(outputs)
    sources = inner.query.sources
    # The subquery's key (its sources' keys) is the view's, and breaks ties.
    inner_outputs = {o.name: o.expr for o in inner.query.outputs}
    tiebreak = tuple(inner_outputs[name] for name in inner.schema.primary_key)
    key: list[tuple[Expr, str]] = list(zip(tiebreak, inner.schema.primary_key, strict=True))
    outputs, primary_key = _with_key(outputs, key, sources)
    query = Query(sources, inner.query.joins, inner.query.where, (), (), tuple(outputs), False,
                  top_n=TopN(partition, order, tiebreak, limit))
    schema = RowSchema(tuple(Column(o.name, o.expr.type, o.expr.nullable, o.hidden)  # type: ignore[arg-type]
                             for o in outputs), tuple(primary_key))
    return ViewPlan(name, sql, inner.sources, schema, query, inner.inner)


def _check_outer(outer: ParsedSelect, statement: exp.Select) -> None:
    for clause, value in statement.args.items():
        name = clause.rstrip("_")
        if value and name not in _OUTER_CLAUSES:
            node = value[0] if isinstance(value, list) else value if isinstance(value, exp.Expr) else statement
            construct, keyword = {"joins": ("JOIN", TokenType.JOIN), "group": ("GROUP BY", TokenType.GROUP_BY),
                                  "distinct": ("SELECT DISTINCT", TokenType.DISTINCT),
                                  "having": ("HAVING", TokenType.HAVING)}.get(
                name, REFUSED_CLAUSES.get(name, (name.upper(), None)))
            raise outer.unsupported(f"{construct} around a top-N subquery", node, keyword,
                                    hint="the query around a ROW_NUMBER() subquery selects its columns WHERE "
                                         "rn <= N; put the rest in a view on this one")
    source = arg(statement, "from")
    if isinstance(source, exp.From) and source.expressions:
        raise outer.unsupported("FROM with several views (implicit cross join)", statement, TokenType.FROM)


def _check_window(outer: ParsedSelect, window: exp.Window) -> None:
    order = window.args.get("order")
    if not isinstance(order, exp.Order) or not order.expressions:
        raise outer.unsupported("ROW_NUMBER() without ORDER BY", window, "ROW_NUMBER",
                                hint="the ranking needs an order: OVER (PARTITION BY ... ORDER BY ...)")
    for name in ("spec", "alias"):
        if window.args.get(name):
            raise outer.unsupported("window frame or named window", window, "ROW_NUMBER")


def _rank_limit(outer: ParsedSelect, statement: exp.Select, rank_name: str, alias: str) -> int:
    """N of ``WHERE rn <= N`` (also ``rn < N``, ``rn = 1`` and the mirrored forms)."""
    where = statement.args.get("where")
    hint = f"filter the subquery's rows by rank alone: WHERE {rank_name} <= N"
    if not isinstance(where, exp.Where):
        raise outer.unsupported("ROW_NUMBER() in a subquery without a rank filter", statement, "ROW_NUMBER",
                                hint=hint)
    condition = where.this.unnest()
    flipped: dict[type[exp.Expr], type[exp.Expr]] = {
        exp.LTE: exp.GTE, exp.LT: exp.GT, exp.EQ: exp.EQ, exp.GTE: exp.LTE, exp.GT: exp.LT}
    if type(condition) not in flipped:
        raise outer.unsupported("a filter besides the rank around a top-N subquery", condition, TokenType.WHERE,
                                hint=hint + " (filter rows inside the subquery, before they are ranked)")
    kind: type[exp.Expr] = type(condition)
    left, right = condition.this, condition.expression
    if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
        left, right, kind = right, left, flipped[kind]
    is_rank = isinstance(left, exp.Column) and left.name.casefold() == rank_name.casefold() and (
        not left.table or left.table.casefold() == alias.casefold())
    if not is_rank or not isinstance(right, exp.Literal) or right.is_string or not right.this.isdigit():
        raise outer.unsupported("a rank filter other than rank <= N, rank < N or rank = 1", condition,
                                TokenType.WHERE, hint=hint)
    number = int(right.this)
    limits: dict[type[exp.Expr], int] = {exp.LTE: number, exp.LT: number - 1, exp.EQ: number}
    limit = limits.get(kind)
    if limit is None or (kind is exp.EQ and number != 1):
        raise outer.unsupported("a rank filter other than rank <= N, rank < N or rank = 1", condition,
                                TokenType.WHERE, hint=hint)
    if limit < 1:
        raise ViewDefinitionError(f"the rank filter {outer.describe(condition)} keeps no row")
    return limit


def _outer_outputs(outer: ParsedSelect, statement: exp.Select, columns: dict[str, OutputColumn],
                   alias: str) -> list[OutputColumn]:
    outputs: list[OutputColumn] = []
    for item in statement.expressions:
        node, name = (item.this, item.alias) if isinstance(item, exp.Alias) else (item, None)
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            outputs.extend(columns.values())
            continue
        if not isinstance(node, exp.Column):
            raise outer.unsupported("an expression over a top-N subquery's columns", node,
                                    hint="compute it inside the subquery, or in a view on this one")
        if node.table and node.table.casefold() != alias.casefold():
            raise ViewDefinitionError(f"unknown alias {node.table!r} in {outer.describe(node)}; the query reads "
                                      f"the subquery {alias}")
        column = columns.get(node.name.casefold())
        if column is None:
            raise ViewDefinitionError(f"unknown column {node.name!r} in {outer.describe(node)}; the subquery has "
                                      f"columns {', '.join(c.name for c in columns.values())}")
        outputs.append(OutputColumn(name or column.name, column.expr))
    return outputs
