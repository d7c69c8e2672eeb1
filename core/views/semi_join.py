"""Subqueries of the WHERE clause as semi and anti joins.

A conjunct of WHERE that is ``x IN (SELECT y ...)`` or ``EXISTS (SELECT ... WHERE inner.a = outer.b ...)``
keeps the rows with a match in the subquery, each once: a semi join on ``x = y`` (``outer.b = inner.a``);
``NOT EXISTS`` keeps those without one: an anti join. The subquery is planned as an inner query (an
operator nested in the view's), its correlating equalities taken out of its WHERE and its SELECT list
replaced by the correlated columns, and the join appended to the chain of the FROM clause's joins; the
rest of WHERE then filters the rows as before.

Refused, with the construct and its position: ``NOT IN`` (NULL as soon as the subquery holds a NULL;
``NOT EXISTS`` says what is usually meant), a subquery under OR or NOT other than ``NOT EXISTS``, an
``EXISTS`` without a correlating equality or over an aggregate, correlations other than equalities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sqlglot import TokenType, exp

from mvlog.views.binder import Binder, IncompatibleTypes, common_type
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.expr import ColumnRef
from mvlog.views.parse import ParsedSelect, TableRef, check_subquery
from mvlog.views.query import JoinCondition, JoinKind, JoinStep, Source

if TYPE_CHECKING:
    from mvlog.views.plan import ViewPlan  # plan.py imports this module

PlanSubquery = Callable[[ParsedSelect], "ViewPlan"]  # plans a subquery in the view's scope
ResolveTable = Callable[[ParsedSelect, TableRef], Source]  # the source a subquery's table names


@dataclass
class SemiJoins:
    """The semi and anti joins of one SELECT's WHERE clause, collected by :meth:`extract`."""

    parsed: ParsedSelect
    binder: Binder  # the outer query's, over its FROM clause's sources
    plan: PlanSubquery
    resolve: ResolveTable
    sources: list[Source] = field(default_factory=list)  # the subqueries, after the FROM clause's sources
    steps: list[JoinStep] = field(default_factory=list)
    inner: dict[str, ViewPlan] = field(default_factory=dict)

    def extract(self, where: exp.Expr | None) -> exp.Expr | None:
        """WHERE without its subquery conjuncts (None when nothing is left), each made a join."""
        if where is None:
            return None
        rest = []
        for conjunct in list(where.flatten()) if isinstance(where, exp.And) else [where]:
            node = conjunct.unnest()
            negated = isinstance(node, exp.Not)
            target = node.this.unnest() if isinstance(node, exp.Not) else node
            if isinstance(target, exp.Exists):
                self._exists(target, JoinKind.ANTI if negated else JoinKind.SEMI)
            elif isinstance(target, exp.In) and target.args.get("query") is not None:
                if negated:
                    raise self.parsed.unsupported(
                        "NOT IN (subquery)", node, hint="NOT IN is NULL as soon as the subquery holds a NULL; "
                                                        "write NOT EXISTS (SELECT ... WHERE y = x)")
                self._in(target)
            else:
                rest.append(conjunct)
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else exp.and_(*rest, copy=False)

    def _in(self, node: exp.In) -> None:
        query = node.args["query"]
        sub = check_subquery(self.parsed, query.this if isinstance(query, exp.Subquery) else query)
        outer = node.this.unnest()
        if not isinstance(outer, exp.Column):
            raise self.parsed.unsupported("IN (subquery) of an expression", node,
                                          hint="compare a column: column IN (SELECT ...)")
        plan = self.plan(sub)
        visible = plan.schema.visible_names
        if len(visible) != 1:
            raise ViewDefinitionError(f"the subquery of {self.parsed.describe(node)} must select one column, "
                                      f"not {len(visible)}")
        self._add(node, JoinKind.SEMI, plan, [(self.binder.column(outer), visible[0])])

    def _exists(self, node: exp.Exists, kind: JoinKind) -> None:
        sub = check_subquery(self.parsed, node.this)
        inner = Binder(sub, [self.resolve(sub, table) for table in sub.tables])
        clause = sub.select.args.get("where")
        conjuncts = [] if not isinstance(clause, exp.Where) else (
            list(clause.this.flatten()) if isinstance(clause.this, exp.And) else [clause.this])
        pairs: list[tuple[ColumnRef, exp.Column]] = []
        local: list[exp.Expr] = []
        for conjunct in conjuncts:
            outer = [c for c in conjunct.find_all(exp.Column) if not inner.resolves(c)]
            if not outer:
                local.append(conjunct)
                continue
            equality = conjunct.unnest()
            if (isinstance(equality, exp.EQ) and isinstance(equality.this, exp.Column)
                    and isinstance(equality.expression, exp.Column) and len(outer) == 1):
                mine = equality.expression if outer[0] is equality.this else equality.this
                if inner.resolves(mine):
                    pairs.append((self.binder.column(outer[0]), mine))
                    continue
            raise self.parsed.unsupported("correlated condition other than an equality", conjunct,
                                          hint="correlate by inner.column = outer.column; the subquery's other "
                                               "conditions may read its own views only")
        if not pairs:
            raise self.parsed.unsupported("EXISTS without a correlating equality", node, TokenType.EXISTS,
                                          hint="correlate it: EXISTS (SELECT ... WHERE inner.column = outer.column)")
        select = sub.select
        if select.args.get("group") or any(isinstance(n, exp.AggFunc) for e in select.expressions for n in e.walk()):
            raise self.parsed.unsupported("EXISTS over an aggregate subquery", node, TokenType.EXISTS)
        rewritten = select.copy()
        rewritten.set("expressions", [exp.alias_(column.copy(), f"_k{i}") for i, (_, column) in enumerate(pairs)])
        rewritten.set("where", exp.Where(this=exp.and_(*local)) if local else None)
        plan = self.plan(replace(sub, select=rewritten))
        self._add(node, kind, plan, [(outer, f"_k{i}") for i, (outer, _) in enumerate(pairs)])

    def _add(self, node: exp.Expr, kind: JoinKind, plan: ViewPlan, pairs: list[tuple[ColumnRef, str]]) -> None:
        side = len(self.binder.sources) + len(self.sources)
        alias = f"__mvlog_subquery{len(self.sources)}"  # not a name a user would give a view
        internal = f"$({alias})"
        self.inner[internal] = plan
        self.sources.append(Source(alias, internal, plan.schema))
        conditions = []
        for left, name in pairs:
            column = plan.schema.column(name)
            right = ColumnRef(side, column.name, column.type, column.nullable)
            try:
                compared = common_type([left.type, right.type])
            except IncompatibleTypes:
                compared = None
            if compared is None:
                raise ViewDefinitionError(f"type error in {self.parsed.describe(node)}: cannot compare "
                                          f"{left.type} with {right.type}")
            conditions.append(JoinCondition(left, right, compared))
        self.steps.append(JoinStep(kind, tuple(conditions)))
