"""Planning a view: SQL text plus the upstream schemas in, a checked ``ViewPlan`` out.

A plan fixes everything the incremental operator and the full recomputation need: the sources, the
join, the filter, the grouping, the output columns with their types, and the view's key.

The key (``ViewPlan.key_columns``, ``schema.primary_key``):

- filter/project: the upstream's key (each upstream row gives at most one view row);
- aggregate: the GROUP BY values (the empty tuple for a global aggregate, which always has one row);
- join: the sources' keys in FROM order (each combination of rows gives at most one view row); a source
  an outer join null-extends has NULL key values in its null-extended rows, and where its own key values
  may all be NULL as well, its presence is one more (hidden) key column (see ``_join_key``).

The key is always made of columns of the view's rows, so ``schema.key_of(row)`` works for every view:
a key component the SELECT list already holds as-is (``SELECT id, ...``, ``SELECT g, count(*) ... GROUP
BY g``) is that column; any other is added as a *hidden* column, stored with the rows (and in the
changelog and snapshots) but left out of ``SELECT *`` and not referable by views built on this one.

Subqueries in FROM, WITH queries, the subqueries of ``IN``/``EXISTS`` (see ``semi_join``) and the
branches of a ``UNION ALL`` (see ``union``) are planned as views of their own, held in ``ViewPlan.inner``
and read by the query under an internal name (``$...``); ``ViewPlan.sources`` still lists only real
upstream views.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import TokenType, exp

from mvlog.row_schema import Column, ColumnType, RowSchema
from mvlog.views.binder import Binder, IncompatibleTypes, coerce, common_type, window_end
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.expr import AggregateCall, Binary, BinaryOp, ColumnRef, Expr, GroupRef, WindowStart, walk
from mvlog.views.parse import (
    JoinRef,
    ParsedSelect,
    TableRef,
    UnionAll,
    common_table_expressions,
    parse_select,
    parse_statement,
    parse_union_all,
)
from mvlog.views.query import (
    PRESENT,
    JoinCondition,
    JoinKind,
    JoinStep,
    OutputColumn,
    Query,
    Source,
    TimeWindow,
    extendable_sides,
)
from mvlog.views.semi_join import SemiJoins
from mvlog.views.union import union_schema
from mvlog.views.window import plan_window

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class ViewPlan:
    """A checked view definition: what the operator maintains and the SQL generator recomputes."""

    name: str
    sql: str
    sources: tuple[str, ...]  # upstream view names, in FROM order, each once (those of subqueries too)
    schema: RowSchema  # the view's rows: SELECT list, then hidden key columns; primary_key = the key
    query: Query
    # The subqueries in FROM and the WITH queries the query reads, each planned as a view of its own
    # (internal name -> plan); ``query.sources`` name them by their internal name (``$name``).
    inner: tuple[tuple[str, ViewPlan], ...] = ()
    # A UNION ALL: ``inner`` holds its branches in order, and ``query`` only lists them as its sources.
    union: bool = False

    @property
    def upstream_schemas(self) -> dict[str, RowSchema]:
        """The schema of each upstream view in ``sources``."""
        schemas: dict[str, RowSchema] = {}
        for _, plan in self.inner:
            schemas.update(plan.upstream_schemas)
        inner = {name for name, _ in self.inner}
        schemas.update({s.view: s.schema for s in self.query.sources if s.view not in inner})
        return schemas

    @property
    def key_columns(self) -> tuple[Column, ...]:
        """The key's components (names and types), in key order; some may be hidden columns."""
        return tuple(self.schema.column(name) for name in self.schema.primary_key)

    @property
    def is_aggregate(self) -> bool:
        return bool(self.query.is_aggregate)

    @property
    def is_join(self) -> bool:
        return len(self.query.sources) > 1


def plan_view(name: str, sql: str, upstreams: Mapping[str, RowSchema]) -> ViewPlan:
    """Plan view ``name`` defined by ``sql`` over the views in ``upstreams`` (view name -> its schema).

    Raises ``ViewDefinitionError`` (``UnsupportedSql`` for constructs outside the subset) naming the
    problem and where it is in ``sql``.
    """
    union = parse_union_all(sql)
    if union is not None:
        return _plan_union(union, name, upstreams)
    tokens, statement = parse_statement(sql)
    from mvlog.views.topn_plan import plan_top_n, row_number_item  # builds on this module: imported late

    if row_number_item(statement) is not None:  # before any other handling of a subquery in FROM
        return plan_top_n(name, sql, tokens, statement, upstreams)
    return _plan(parse_select(sql), name, upstreams, {})


def plan_select(name: str, parsed: ParsedSelect, upstreams: Mapping[str, RowSchema]) -> ViewPlan:
    """Plan view ``name`` defined by the checked SELECT ``parsed`` (see ``plan_view``)."""
    return _plan(parsed, name, upstreams, {})


# Common table expressions in scope, by folded name: (internal name, plan).
Scope = dict[str, tuple[str, ViewPlan]]


def _plan_union(union: UnionAll, name: str, upstreams: Mapping[str, RowSchema]) -> ViewPlan:
    """A UNION ALL: each branch planned in the scope of the statement's WITH clause."""
    scope = _scope(union.parsed, name, upstreams, {}, union.node)
    branches = [_plan(branch, name, upstreams, scope) for branch in union.branches]
    schema = union_schema(branches)
    inner = tuple((f"$(branch{i})", branch) for i, branch in enumerate(branches))
    sources = tuple(Source(f"branch{i}", internal, branch.schema) for i, (internal, branch) in enumerate(inner))
    query = Query(sources, (), None, (), (), (), False)
    views = tuple(dict.fromkeys(view for branch in branches for view in branch.sources))
    return ViewPlan(name, union.parsed.sql, views, schema, query, inner, union=True)


def _scope(parsed: ParsedSelect, name: str, upstreams: Mapping[str, RowSchema], scope: Scope,
           node: exp.Expr | None = None) -> Scope:
    """``scope`` plus the WITH queries of ``parsed``'s SELECT (or of ``node``), each planned in turn."""
    scope = dict(scope)
    for cte_name, cte_query, _ in common_table_expressions(parsed, node):
        scope[cte_name.casefold()] = (f"${cte_name}", _plan(cte_query, name, upstreams, scope))
    return scope


def _plan(parsed: ParsedSelect, name: str, upstreams: Mapping[str, RowSchema], scope: Scope) -> ViewPlan:
    """The plan of one SELECT (the statement, or a subquery of it)."""
    sql = parsed.sql
    scope = _scope(parsed, name, upstreams, scope)
    inner: dict[str, ViewPlan] = {}
    sources = tuple(_source(parsed, table, name, upstreams, scope, inner) for table in parsed.tables)
    aliases = [s.alias.casefold() for s in sources]
    for side, source in enumerate(sources):
        if side and source.alias.casefold() in aliases[:side]:
            other = sources[aliases.index(source.alias.casefold())]
            example = f"FROM {other.view} a JOIN {source.view} b"
            raise ViewDefinitionError(f"two joined views are called {source.alias!r}; give them "
                                      f"different aliases, e.g. {example}")
    extendable = extendable_sides(tuple(JoinStep(ref.kind, ()) for ref in parsed.joins))
    binder = Binder(parsed, sources, extendable)
    joins = tuple(_join_step(parsed, binder, index, ref) for index, ref in enumerate(parsed.joins))
    where_clause = parsed.select.args.get("where")
    semi = SemiJoins(parsed, binder, lambda sub: _plan(sub, name, upstreams, scope),
                     lambda sub, table: _source(sub, table, name, upstreams, scope, {}))
    where_node = semi.extract(where_clause.this if isinstance(where_clause, exp.Where) else None)
    where = binder.condition(where_node, "WHERE") if where_node is not None else None
    items = list(parsed.select.expressions)
    group_clause = parsed.select.args.get("group")
    # ``GROUP BY (window(...))`` is ``GROUP BY window(...)``: parentheses around one expression change nothing.
    group_nodes = [_unparen(n) for n in group_clause.expressions] if isinstance(group_clause, exp.Group) else []
    having_clause = parsed.select.args.get("having")
    having_node = having_clause.this if isinstance(having_clause, exp.Having) else None
    is_aggregate = bool(group_nodes) or having_node is not None or any(
        isinstance(n, exp.AggFunc) for item in items for n in item.walk())
    distinct = isinstance(parsed.select.args.get("distinct"), exp.Distinct)
    having: Expr | None = None
    if distinct and is_aggregate:
        raise parsed.unsupported("SELECT DISTINCT over an aggregate", parsed.select.args["distinct"],
                                 TokenType.DISTINCT, hint="the rows of a GROUP BY are distinct already")
    if is_aggregate or distinct:
        if distinct:  # the distinct rows are the groups of the selected expressions
            group_by, aggregates, outputs = _distinct_outputs(_projection_outputs(parsed, binder, items))
        else:
            window = _time_window(parsed, binder, group_nodes)
            if window is not None:
                binder.window = window
            group_by, aggregates, outputs = _aggregate_outputs(parsed, binder, items, group_nodes)
        if having_node is not None:
            having, aggregates = _having(parsed, binder, items, having_node, group_by, aggregates)
        key: list[tuple[Expr, str]] = [
            (GroupRef(i, g.type, g.nullable), g.column if isinstance(g, ColumnRef) else
             "window_start" if isinstance(g, WindowStart) else
             "window_end" if binder.window is not None and g == window_end(binder.window.size) else f"group_{i}")
            for i, g in enumerate(group_by)]
        is_aggregate = True
    else:
        group_by, aggregates = (), ()
        outputs = _projection_outputs(parsed, binder, items)
        key = _join_key(sources, extendable)
    _check_names(outputs)
    outputs, primary_key = _with_key(outputs, key, sources)
    inner.update(semi.inner)
    query = Query((*sources, *semi.sources), (*joins, *semi.steps), where, group_by, aggregates, tuple(outputs),
                  is_aggregate, having, window=binder.window)
    columns = []
    for output in outputs:
        if output.expr.type is None:
            raise ViewDefinitionError(f"cannot infer a type for column {output.name!r}: it is always NULL")
        columns.append(Column(output.name, output.expr.type, output.expr.nullable, output.hidden))
    schema = RowSchema(tuple(columns), tuple(primary_key))
    views = [v for s in query.sources for v in (inner[s.view].sources if s.view in inner else (s.view,))]
    return ViewPlan(name, sql, tuple(dict.fromkeys(views)), schema, query, tuple(inner.items()))


def _source(parsed: ParsedSelect, table: TableRef, view: str, upstreams: Mapping[str, RowSchema], scope: Scope,
            inner: dict[str, ViewPlan]) -> Source:
    """The source ``table`` names: a subquery, a WITH query in scope, else an upstream view. A subquery or
    WITH query becomes an inner plan, registered in ``inner`` under its internal name."""
    if table.subquery is not None:
        internal = f"$({table.alias})"
        inner[internal] = _plan(table.subquery, view, upstreams, scope)
        return Source(table.alias, internal, inner[internal].schema)
    if (found := scope.get(table.view.casefold())) is not None:
        internal, plan = found
        inner[internal] = plan
        return Source(table.alias, internal, plan.schema)
    if table.view == view:
        raise ViewDefinitionError(f"view {view!r} cannot read itself ({parsed.describe(table.node)})")
    name = table.view if table.view in upstreams else next(
        (n for n in upstreams if n.casefold() == table.view.casefold()), None)
    if name is None:
        known = ", ".join(sorted(upstreams)) or "(none)"
        raise ViewDefinitionError(f"unknown view {table.view!r} in {parsed.describe(table.node)}; "
                                  f"known views: {known}")
    alias = table.alias if table.alias != table.view else name
    return Source(alias, name, upstreams[name])


def _join_key(sources: tuple[Source, ...], extendable: frozenset[int]) -> list[tuple[Expr, str]]:
    """The key of a projection: every source's primary key, in FROM order (NULL where an outer join
    null-extends the source). Where a source's key columns may all be NULL themselves (a view grouped by
    a nullable column, a global aggregate), NULLs would not tell its null-extended rows from its rows,
    so its presence (``PRESENT``: TRUE, or NULL when null-extended) is a key component too."""
    key: list[tuple[Expr, str]] = []
    for side, source in enumerate(sources):
        columns = [source.schema.column(pk) for pk in source.schema.primary_key]
        nullable = side in extendable
        key += [(ColumnRef(side, c.name, c.type, c.nullable or nullable), c.name) for c in columns]
        if nullable and all(c.nullable for c in columns):
            key.append((ColumnRef(side, PRESENT, ColumnType.BOOLEAN, True), f"{source.alias}_present"))
    return key


def _join_step(parsed: ParsedSelect, binder: Binder, index: int, ref: JoinRef) -> JoinStep:
    """The ``index``-th JOIN: its column equalities between the joined view and the views before it, and
    every other conjunct of ON as the residual condition on the pairs they match."""
    joined = index + 1
    conjuncts = list(ref.on.flatten()) if isinstance(ref.on, exp.And) else [ref.on]
    conditions: list[JoinCondition] = []
    residual: Expr | None = None
    for conjunct in conjuncts:
        node = conjunct.unnest()
        condition = _equality(parsed, binder, node, joined)
        if condition is not None:
            conditions.append(condition)
            continue
        bound = binder.condition(node, "ON")
        later = sorted({e.side for e in walk(bound) if isinstance(e, ColumnRef) and e.side > joined})
        if later:
            names = ", ".join(binder.sources[s].alias for s in later)
            raise ViewDefinitionError(f"{parsed.describe(node)} in the ON clause of the join of "
                                      f"{binder.sources[joined].alias!r} reads {names}, joined after it")
        residual = bound if residual is None else Binary(BinaryOp.AND, residual, bound, ColumnType.BOOLEAN,
                                                          residual.nullable or bound.nullable)
    if not conditions:
        keyword = TokenType.JOIN if ref.kind is JoinKind.INNER else getattr(TokenType, ref.kind.value)
        raise parsed.unsupported("join without an equality between the joined views", ref.node, keyword,
                                 hint="ON needs a column = column between the joined view and one before it; "
                                      "other conditions may stand beside it with AND")
    return JoinStep(ref.kind, tuple(conditions), residual)


def _equality(parsed: ParsedSelect, binder: Binder, node: exp.Expr, joined: int) -> JoinCondition | None:
    """``node`` as an equi-join condition (a column of a view before ``joined`` = a column of it), else None."""
    if not (isinstance(node, exp.EQ) and isinstance(node.this, exp.Column)
            and isinstance(node.expression, exp.Column)):
        return None
    left, right = binder.column(node.this), binder.column(node.expression)
    if left.side == joined:
        left, right = right, left
    if right.side != joined or left.side >= joined:
        return None
    try:
        kind = common_type([left.type, right.type])
    except IncompatibleTypes:
        kind = None
    if kind is None:
        raise ViewDefinitionError(f"type error in {parsed.describe(node)}: cannot join "
                                  f"{left.type} with {right.type}")
    return JoinCondition(left, right, kind)


def _projection_outputs(parsed: ParsedSelect, binder: Binder, items: list[exp.Expr]) -> list[OutputColumn]:
    outputs: list[OutputColumn] = []
    for position, item in enumerate(items):
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            outputs.extend(_expand_star(parsed, binder, item))
            continue
        node, name = _named(item, position)
        outputs.append(OutputColumn(name, binder.row_expr(node, "SELECT")))
    return outputs


def _expand_star(parsed: ParsedSelect, binder: Binder, item: exp.Expr) -> list[OutputColumn]:
    if isinstance(item, exp.Star):
        if any(item.args.get(a) for a in ("except", "replace", "rename")):
            raise parsed.unsupported("* EXCEPT/REPLACE", item)
        sides = list(range(len(binder.sources)))
    else:
        assert isinstance(item, exp.Column)
        sides = [i for i, s in enumerate(binder.sources) if s.alias.casefold() == item.table.casefold()]
        if not sides:
            raise ViewDefinitionError(f"unknown view or alias {item.table!r} in {parsed.describe(item)}")
    return [OutputColumn(c.name, ColumnRef(side, c.name, c.type, c.nullable or side in binder.nullable_sides))
            for side in sides for c in binder.sources[side].schema.columns if not c.hidden]


def _named(item: exp.Expr, position: int) -> tuple[exp.Expr, str]:
    """The expression of a SELECT item and its column name (the alias, or one derived like Spark's)."""
    if isinstance(item, exp.Alias):
        return item.this, item.alias
    node = item.unnest()
    if isinstance(node, exp.Column):
        return item, node.name
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
        return item, "count"
    aggregate = isinstance(node, exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max)
    if aggregate and isinstance(node.this, exp.Column):
        return item, f"{node.key}_{node.this.name}"
    return item, f"_c{position}"


def _aggregate_outputs(parsed: ParsedSelect, binder: Binder, items: list[exp.Expr],
                       group_nodes: list[exp.Expr]
                       ) -> tuple[tuple[Expr, ...], tuple[AggregateCall, ...], list[OutputColumn]]:
    aliases = {item.alias.casefold(): item.this for item in items if isinstance(item, exp.Alias)}
    group_by: list[Expr] = []
    for node in group_nodes:
        if isinstance(node, exp.Literal) and not node.is_string:
            raise parsed.unsupported("GROUP BY position", node, hint="name the column or expression instead")
        if isinstance(node, exp.Rollup | exp.Cube | exp.GroupingSets):
            construct = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE"}.get(type(node), "GROUPING SETS")
            raise parsed.unsupported(f"GROUP BY {construct}", node, construct.split()[0])
        if _is_window_call(node):
            for bound in (WindowStart(), window_end(binder.window.size)):  # type: ignore[union-attr]
                if bound not in group_by:
                    group_by.append(bound)
            continue
        target = node
        if isinstance(node, exp.Column) and not node.table and not binder.resolves(node) \
                and node.name.casefold() in aliases:
            target = aliases[node.name.casefold()]  # Spark resolves GROUP BY names to SELECT aliases too
        if any(isinstance(n, exp.AggFunc) for n in target.walk()):
            raise ViewDefinitionError(f"aggregate function in GROUP BY: {parsed.describe(node)}")
        bound = binder.row_expr(target, "GROUP BY")
        if bound not in group_by:
            group_by.append(bound)
    aggregates: list[AggregateCall] = []
    outputs: list[OutputColumn] = []
    for position, item in enumerate(items):
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            raise ViewDefinitionError(f"{parsed.describe(item)} in an aggregate view: list the GROUP BY "
                                      "columns and aggregates instead")
        node, name = _named(item, position)
        outputs.append(OutputColumn(name, binder.output_expr(node, group_by, aggregates)))
    return tuple(group_by), tuple(aggregates), outputs


def _unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _is_window_call(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).casefold() == "window"


def _time_window(parsed: ParsedSelect, binder: Binder, group_nodes: list[exp.Expr]) -> TimeWindow | None:
    """The ``window(ts, size[, slide])`` among the GROUP BY expressions, checked (None: there is none)."""
    calls = [node for node in group_nodes if _is_window_call(node)]
    if not calls:
        return None
    call = calls[0]
    where = parsed.describe(call, "window")
    if len(calls) > 1:
        raise parsed.unsupported("more than one time window in GROUP BY", calls[1], "window")
    args = list(call.expressions)
    if not 2 <= len(args) <= 3:
        raise parsed.unsupported("window() with a start offset" if len(args) == 4 else "window() arguments", call,
                                 "window", hint="window(ts, '10 seconds') or window(ts, '10 seconds', '2 seconds')")
    time = binder.row_expr(args[0], "window()")
    side = _window_side(parsed, binder, call, time)
    if binder.sources[side].view.startswith("$"):  # an inner query's internal name
        raise parsed.unsupported("time window over a subquery or WITH query", call, "window",
                                 hint="create the subquery as a view and window it in a view on that one")
    durations = []
    for duration in args[1:]:
        if not (isinstance(duration, exp.Literal) and duration.is_string):
            raise parsed.unsupported("window() duration that is not a string literal", duration, "window",
                                     hint="write it as '10 seconds'")
        durations.append(str(duration.this))
    return plan_window(time, durations, where, side)


def _window_side(parsed: ParsedSelect, binder: Binder, call: exp.Expr, time: Expr) -> int:
    """The source whose rows a time window copies, one per window (over a join: the one source the time
    reads, which no outer join null-extends, so that copying its rows before the join, as the rendered
    SQL does, is the same as copying the joined rows after it, as the operator does)."""
    if len(binder.sources) == 1:
        return 0
    sides = {e.side for e in walk(time) if isinstance(e, ColumnRef)}
    if len(sides) != 1:
        raise parsed.unsupported("time window over a join whose time is not a column of one joined view", call,
                                 "window", hint="window over a column of one side, e.g. window(a.ts, '1 minute')")
    side = sides.pop()
    if side in binder.nullable_sides:
        raise parsed.unsupported("time window over the side an outer join null-extends", call, "window",
                                 hint="window over the time of the side the join keeps, or use an inner join")
    return side


def _distinct_outputs(outputs: list[OutputColumn]
                      ) -> tuple[tuple[Expr, ...], tuple[AggregateCall, ...], list[OutputColumn]]:
    """``SELECT DISTINCT e1, e2, ...`` as ``SELECT e1, e2, ... GROUP BY e1, e2, ...``."""
    group_by = list(dict.fromkeys(o.expr for o in outputs))
    grouped = [OutputColumn(o.name, GroupRef(group_by.index(o.expr), o.expr.type, o.expr.nullable))
               for o in outputs]
    return tuple(group_by), (), grouped


def _having(parsed: ParsedSelect, binder: Binder, items: list[exp.Expr], node: exp.Expr,
            group_by: tuple[Expr, ...], aggregates: tuple[AggregateCall, ...]
            ) -> tuple[Expr, tuple[AggregateCall, ...]]:
    """The HAVING condition over the groups and aggregate calls (new calls are added to ``aggregates``);
    a name that is no source column but a SELECT alias means that item's expression, as in Spark."""
    aliases = {item.alias.casefold(): item.this for item in items if isinstance(item, exp.Alias)}

    def expand(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and not n.table and not binder.resolves(n) \
                and n.name.casefold() in aliases:
            alias: exp.Expr = aliases[n.name.casefold()].copy()
            return alias
        return n

    expanded = node.copy().transform(expand) if aliases else node
    calls = list(aggregates)
    bound = binder.output_expr(expanded, group_by, calls)
    if bound.type not in (ColumnType.BOOLEAN, None):
        raise ViewDefinitionError(f"type error in {parsed.describe(node, TokenType.HAVING)}: HAVING needs a "
                                  f"boolean, this is {bound.type.value if bound.type else 'NULL'}")
    return coerce(bound, ColumnType.BOOLEAN), tuple(calls)


def _check_names(outputs: list[OutputColumn]) -> None:
    seen: dict[str, str] = {}
    for output in outputs:
        if not _NAME.match(output.name):
            raise ViewDefinitionError(f"column name {output.name!r} is not a valid name (letters, digits and "
                                      "_, not starting with a digit); rename it with AS")
        folded = output.name.casefold()
        if folded in seen:
            raise ViewDefinitionError(f"duplicate column name {output.name!r} in the SELECT list; "
                                      "rename one of them with AS")
        seen[folded] = output.name


def _with_key(outputs: list[OutputColumn], key: list[tuple[Expr, str]], sources: tuple[Source, ...]
              ) -> tuple[list[OutputColumn], list[str]]:
    """Outputs plus hidden columns for key components not selected as-is, and the key's column names."""
    outputs = list(outputs)
    taken = {o.name.casefold() for o in outputs}
    primary_key: list[str] = []
    for expr, base in key:
        existing = next((o.name for o in outputs if o.expr == expr and o.name not in primary_key), None)
        if existing is None:
            existing = _free_name(base, expr, sources, taken)
            taken.add(existing.casefold())
            outputs.append(OutputColumn(existing, expr, hidden=True))
        primary_key.append(existing)
    return outputs, primary_key


def _free_name(base: str, expr: Expr, sources: tuple[Source, ...], taken: set[str]) -> str:
    candidates = [base]
    if isinstance(expr, ColumnRef) and len(sources) >= 2:
        candidates.append(f"{sources[expr.side].alias}_{base}")
    for candidate in candidates:
        if candidate.casefold() not in taken:
            return candidate
    name = candidates[-1]
    while name.casefold() in taken:
        name = "_" + name
    return name

