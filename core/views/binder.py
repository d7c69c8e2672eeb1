"""Binding sqlglot expressions to typed ``mvlog.views.expr`` trees.

Names are resolved against the query's sources the way Spark resolves them (case-insensitively, a
qualifier picks the source), types are inferred with Spark's rules for the supported subset (int op
float is float, ``/`` is always float, comparisons need comparable types) and every implicit conversion
becomes an explicit ``Cast``. Anything not in the subset is refused here with the construct's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from mvlog.row_schema import INT64_MAX, INT64_MIN, ColumnType
from mvlog.views.errors import UnsupportedSql, ViewDefinitionError
from mvlog.views.expr import (
    AggregateCall,
    AggregateFunction,
    AggregateRef,
    Between,
    Binary,
    BinaryOp,
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
    WindowStart,
    walk,
)
from mvlog.views.functions import bind_function
from mvlog.views.parse import ParsedSelect, fragment
from mvlog.views.query import Source, TimeWindow
from mvlog.views.scope import Scope

_NUMERIC = (ColumnType.INT, ColumnType.FLOAT)
_ARITHMETIC: dict[type[exp.Expr], BinaryOp] = {
    exp.Add: BinaryOp.ADD, exp.Sub: BinaryOp.SUB, exp.Mul: BinaryOp.MUL, exp.Div: BinaryOp.DIV,
}
_COMPARISONS: dict[type[exp.Expr], BinaryOp] = {
    exp.EQ: BinaryOp.EQ, exp.NEQ: BinaryOp.NEQ, exp.LT: BinaryOp.LT, exp.LTE: BinaryOp.LTE,
    exp.GT: BinaryOp.GT, exp.GTE: BinaryOp.GTE,
}
_LOGIC: dict[type[exp.Expr], BinaryOp] = {exp.And: BinaryOp.AND, exp.Or: BinaryOp.OR}
_AGGREGATES: dict[type[exp.Expr], AggregateFunction] = {
    exp.Count: AggregateFunction.COUNT, exp.Sum: AggregateFunction.SUM, exp.Avg: AggregateFunction.AVG,
    exp.Min: AggregateFunction.MIN, exp.Max: AggregateFunction.MAX,
}
_DISTINCT_AGGREGATES: dict[AggregateFunction, AggregateFunction] = {
    AggregateFunction.COUNT: AggregateFunction.COUNT_DISTINCT, AggregateFunction.SUM: AggregateFunction.SUM_DISTINCT,
    AggregateFunction.AVG: AggregateFunction.AVG_DISTINCT,
}
_OPERATOR_NAMES: dict[type[exp.Expr], str] = {
    exp.Mod: "operator %", exp.IntDiv: "operator DIV", exp.NullSafeEQ: "operator <=>",
    exp.NullSafeNEQ: "operator IS DISTINCT FROM", exp.DPipe: "operator ||", exp.BitwiseAnd: "operator &",
    exp.BitwiseOr: "operator |", exp.BitwiseXor: "operator ^", exp.BitwiseNot: "operator ~",
    exp.Like: "LIKE", exp.ILike: "ILIKE", exp.RegexpLike: "RLIKE", exp.Between: "BETWEEN SYMMETRIC", exp.In: "IN",
    exp.Distinct: "DISTINCT", exp.Star: "*", exp.Interval: "INTERVAL", exp.HexString: "hex literal",
    exp.Xor: "XOR",
}


def window_end(size: int) -> Expr:
    """``window.end``: its start plus the window's size (a GROUP BY expression beside the start)."""
    return Binary(BinaryOp.ADD, WindowStart(), Literal(size, ColumnType.INT), ColumnType.INT, False)


FUNCTIONS_HINT = ("the functions are coalesce, lower, upper, concat, length, replace, instr, split_part, "
                  "regexp_extract, date_format, hour, minute, and count, sum, min, max, avg")


def refusal(parsed: ParsedSelect, node: exp.Expr) -> UnsupportedSql:
    """The error for a construct outside the SQL subset, named as users write it (with a hint where one helps)."""
    hint = ""
    keyword: str | None = None
    if isinstance(node, exp.Window):
        construct = "window function"
    elif isinstance(node, exp.Subquery | exp.Select | exp.Exists) or (
            isinstance(node, exp.In) and node.args.get("query") is not None):
        construct = "subquery"
    elif isinstance(node, exp.Cast | exp.TryCast):
        construct = "CAST"
        keyword = "CAST|TRY_CAST"
    elif type(node) in _OPERATOR_NAMES:
        construct = _OPERATOR_NAMES[type(node)]
    elif isinstance(node, exp.Anonymous):
        construct = f"function {node.name}()"
        hint = FUNCTIONS_HINT
    elif isinstance(node, exp.AggFunc):
        construct = f"aggregate function {node.sql_name().lower()}()"
        hint = "the aggregates are count, sum, min, max and avg"
    elif isinstance(node, exp.Func):
        construct = f"function {node.sql_name().lower()}()"
        hint = FUNCTIONS_HINT
    else:
        construct = node.key.upper()
    return parsed.unsupported(construct, node, keyword, hint=hint)


def literal(parsed: ParsedSelect, node: exp.Expr, negative: bool = False) -> Literal:
    """A SQL literal as a typed value (``negative``: the literal under a unary minus, so INT64_MIN fits)."""
    if isinstance(node, exp.Null):
        return Literal(None, None)
    if isinstance(node, exp.Boolean):
        return Literal(bool(node.this), ColumnType.BOOLEAN)
    assert isinstance(node, exp.Literal)
    if node.is_string:
        return Literal(str(node.this), ColumnType.STRING)
    text = ("-" if negative else "") + str(node.this)
    try:
        number = int(text)
    except ValueError:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ViewDefinitionError(f"number {parsed.describe(node)} is out of range") from None
        return Literal(value, ColumnType.FLOAT)
    if not INT64_MIN <= number <= INT64_MAX:
        raise ViewDefinitionError(f"integer {parsed.describe(node)} does not fit in 64 bits")
    return Literal(number, ColumnType.INT)


class IncompatibleTypes(Exception):  # noqa: N818 - internal signal, never shown to users
    """Types that do not combine; callers turn it into a ViewDefinitionError naming the expression."""


@dataclass
class _Context:
    """Where an expression is bound: which clause (for messages) and, in an aggregate SELECT list,
    the GROUP BY expressions it may use and the aggregate calls collected so far."""

    clause: str
    groups: Sequence[Expr] | None = None
    aggregates: list[AggregateCall] | None = field(default=None)

    @property
    def aggregating(self) -> bool:
        return self.aggregates is not None


def common_type(types: Sequence[ColumnType | None]) -> ColumnType | None:
    """The type values of ``types`` are compared or combined as (None: all are untyped NULLs)."""
    known = [t for t in types if t is not None]
    if not known:
        return None
    if all(t in _NUMERIC for t in known):
        return ColumnType.FLOAT if ColumnType.FLOAT in known else ColumnType.INT
    if all(t is known[0] for t in known):
        return known[0]
    raise IncompatibleTypes


def coerce(expr: Expr, to: ColumnType | None) -> Expr:
    """``expr`` as a value of type ``to`` (int widened to float, an untyped NULL given the type)."""
    if to is None or expr.type is to:
        return expr
    if isinstance(expr, Literal) and expr.value is None:
        return Literal(None, to)
    if isinstance(expr, Literal) and to is ColumnType.FLOAT and isinstance(expr.value, int):
        return Literal(float(expr.value), to)
    return Cast(expr, to)


def _type_name(kind: ColumnType | None) -> str:
    return "NULL" if kind is None else kind.value


class Binder:
    """Binds the expressions of one parsed SELECT against its sources."""

    def __init__(self, parsed: ParsedSelect, sources: Sequence[Source],
                 nullable_sides: frozenset[int] = frozenset()) -> None:
        self.parsed = parsed
        self.scope = Scope(parsed, sources, nullable_sides)
        self.window: TimeWindow | None = None  # the GROUP BY's time window, once planned

    @property
    def sources(self) -> tuple[Source, ...]:
        return self.scope.sources

    @property
    def nullable_sides(self) -> frozenset[int]:
        """Sources an outer join may null-extend: every column nullable."""
        return self.scope.nullable_sides

    # -- entry points -------------------------------------------------------------------------------

    def row_expr(self, node: exp.Expr, clause: str) -> Expr:
        """An expression over one (joined) input row; aggregates are not allowed."""
        return self._bind(node, _Context(clause))

    def condition(self, node: exp.Expr, clause: str) -> Expr:
        """A boolean expression over one input row (WHERE); NULL counts as false where it is used."""
        bound = self.row_expr(node, clause)
        if bound.type not in (ColumnType.BOOLEAN, None):
            raise self._type_error(node, f"{clause} needs a boolean, this is {_type_name(bound.type)}")
        return coerce(bound, ColumnType.BOOLEAN)

    def output_expr(self, node: exp.Expr, groups: Sequence[Expr], aggregates: list[AggregateCall]) -> Expr:
        """A SELECT item of an aggregate view: over GROUP BY expressions and aggregate calls only.

        New aggregate calls are appended to ``aggregates`` (deduplicated), so every call is computed once.
        """
        return self._bind(node, _Context("SELECT", groups, aggregates))

    def column(self, node: exp.Column) -> ColumnRef:
        return self.scope.column(node)

    def resolves(self, node: exp.Column) -> bool:
        """Whether ``node`` names a column of a source (GROUP BY falls back to SELECT aliases if not)."""
        return self.scope.resolves(node)

    def describe(self, node: exp.Expr) -> str:
        return str(self.parsed.describe(node))

    # -- expressions --------------------------------------------------------------------------------

    def _bind(self, node: exp.Expr, ctx: _Context) -> Expr:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Column) and node.table.casefold() == "window" and not any(
                s.alias.casefold() == "window" for s in self.sources):
            return self._window_column(node, ctx)
        if ctx.aggregating:
            if isinstance(node, exp.AggFunc):
                return self._aggregate(node, ctx)
            if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
                return self._aggregate(node.this, ctx, node)
            if not any(isinstance(n, exp.AggFunc) for n in node.walk()):
                bound = self._bind(node, _Context(ctx.clause))
                groups = list(ctx.groups or ())
                if bound in groups:
                    index = groups.index(bound)
                    return GroupRef(index, bound.type, bound.nullable)
                if not any(isinstance(e, ColumnRef | WindowStart) for e in walk(bound)):
                    return bound
                if isinstance(node, exp.Column):
                    raise ViewDefinitionError(
                        f"column {node.name!r} in {self.describe(node)} must be in GROUP BY or inside an "
                        "aggregate function (count, sum, min, max, avg)")
        return self._structural(node, ctx)

    def _window_column(self, node: exp.Column, ctx: _Context) -> Expr:
        """``window.start`` / ``window.end`` of a GROUP BY window(...): INT epoch milliseconds."""
        if self.window is None:
            raise ViewDefinitionError(f"{self.describe(node)} needs a time window in GROUP BY, e.g. "
                                      "GROUP BY window(ts, '10 seconds')")
        if ctx.clause not in ("SELECT", "HAVING"):
            raise self.parsed.unsupported(f"window.{node.name} in {ctx.clause}", node,
                                          hint="window.start and window.end are selected, or used in HAVING")
        field = node.name.casefold()
        if field not in ("start", "end"):
            raise ViewDefinitionError(f"unknown field {node.name!r} in {self.describe(node)}: a window has start "
                                      "and end")
        bound = WindowStart() if field == "start" else window_end(self.window.size)
        groups = list(ctx.groups or ())
        if ctx.aggregating and bound in groups:
            return GroupRef(groups.index(bound), bound.type, bound.nullable)
        return bound

    def _structural(self, node: exp.Expr, ctx: _Context) -> Expr:
        kind = type(node)
        if isinstance(node, exp.Column):
            return self.column(node)
        if isinstance(node, exp.Literal | exp.Boolean | exp.Null):
            return literal(self.parsed, node)
        if kind in _ARITHMETIC:
            return self._arithmetic(node, _ARITHMETIC[kind], ctx)
        if kind in _COMPARISONS:
            return self._compare(node, _COMPARISONS[kind], self._bind(node.this, ctx),
                                 self._bind(node.expression, ctx))
        if kind in _LOGIC:
            left, right = self._bind(node.this, ctx), self._bind(node.expression, ctx)
            op = _LOGIC[kind]
            self._need_boolean(node, op.value, left, right)
            return Binary(op, coerce(left, ColumnType.BOOLEAN), coerce(right, ColumnType.BOOLEAN),
                          ColumnType.BOOLEAN, left.nullable or right.nullable)
        if isinstance(node, exp.Not):
            inner = node.this
            while isinstance(inner, exp.Paren):
                inner = inner.this
            if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):
                return IsNull(self._bind(inner.this, ctx), negated=True)
            operand = self._bind(node.this, ctx)
            self._need_boolean(node, "NOT", operand)
            return Not(coerce(operand, ColumnType.BOOLEAN))
        if isinstance(node, exp.Neg):
            return self._negate(node, ctx)
        if isinstance(node, exp.Is):
            if isinstance(node.expression, exp.Null):
                return IsNull(self._bind(node.this, ctx), negated=False)
            raise self.parsed.unsupported(f"IS {fragment(node.expression).upper()}", node,
                                          hint="only IS NULL and IS NOT NULL are supported")
        if isinstance(node, exp.Between) and not node.args.get("symmetric"):
            return self._between(node, ctx)
        if isinstance(node, exp.In) and self._is_value_list(node):
            return self._in_list(node, ctx)
        if isinstance(node, exp.Case):
            return self._case(node, ctx)
        if isinstance(node, exp.Coalesce):
            return self._coalesce(node, ctx)
        if kind in _AGGREGATES or (isinstance(node, exp.Filter) and type(node.this) in _AGGREGATES):
            where = "another aggregate" if ctx.clause.startswith("the argument") else ctx.clause
            raise ViewDefinitionError(f"aggregate function {self.describe(node)} is not allowed in {where}")
        call = bind_function(node, lambda arg: self._bind(arg, ctx), self.describe)
        if call is not None:
            return call
        raise refusal(self.parsed, node)

    def _negate(self, node: exp.Neg, ctx: _Context) -> Expr:
        if isinstance(node.this, exp.Literal) and not node.this.is_string:
            return literal(self.parsed, node.this, negative=True)
        operand = self._bind(node.this, ctx)
        if operand.type not in (*_NUMERIC, None):
            raise self._type_error(node, f"unary - needs a number, got {_type_name(operand.type)}")
        return Literal(None, None) if operand.type is None else Negate(operand)

    def _arithmetic(self, node: exp.Expr, op: BinaryOp, ctx: _Context) -> Expr:
        left, right = self._bind(node.this, ctx), self._bind(node.expression, ctx)
        if left.type not in (*_NUMERIC, None) or right.type not in (*_NUMERIC, None):
            raise self._type_error(node, f"{op.value} needs numbers, got {_type_name(left.type)} and "
                                         f"{_type_name(right.type)}")
        if op is BinaryOp.DIV:
            result: ColumnType | None = ColumnType.FLOAT  # Spark: `/` is always fractional division
        else:
            result = common_type([left.type, right.type])
            if result is None:
                return Literal(None, None)
        return Binary(op, coerce(left, result), coerce(right, result), result,
                      left.nullable or right.nullable or op is BinaryOp.DIV)  # x / 0 is NULL

    def _compare(self, node: exp.Expr, op: BinaryOp, left: Expr, right: Expr) -> Expr:
        try:
            kind = common_type([left.type, right.type])
        except IncompatibleTypes:
            raise self._type_error(node, f"cannot compare {_type_name(left.type)} with "
                                         f"{_type_name(right.type)}") from None
        if kind is None:
            return Literal(None, ColumnType.BOOLEAN)
        return Binary(op, coerce(left, kind), coerce(right, kind), ColumnType.BOOLEAN,
                      left.nullable or right.nullable)

    def _need_boolean(self, node: exp.Expr, what: str, *operands: Expr) -> None:
        for operand in operands:
            if operand.type not in (ColumnType.BOOLEAN, None):
                raise self._type_error(node, f"{what} needs booleans, got {_type_name(operand.type)}")

    def _between(self, node: exp.Between, ctx: _Context) -> Expr:
        operand, low, high = (self._bind(node.args[name], ctx) for name in ("this", "low", "high"))
        try:
            kind = common_type([operand.type, low.type, high.type])
        except IncompatibleTypes:
            raise self._type_error(node, f"BETWEEN cannot compare {_type_name(operand.type)} with "
                                         f"{_type_name(low.type)} and {_type_name(high.type)}") from None
        if kind is None:
            return Literal(None, ColumnType.BOOLEAN)
        return Between(coerce(operand, kind), coerce(low, kind), coerce(high, kind),
                       operand.nullable or low.nullable or high.nullable)

    @staticmethod
    def _is_value_list(node: exp.In) -> bool:
        """``x IN (v, ...)``: no subquery (a semi join, planned from WHERE), no UNNEST, no field."""
        return bool(node.expressions) and not any(node.args.get(name) for name in ("query", "unnest", "field"))

    def _in_list(self, node: exp.In, ctx: _Context) -> Expr:
        operand = self._bind(node.this, ctx)
        values = [self._bind(value, ctx) for value in node.expressions]
        try:
            kind = common_type([operand.type, *(v.type for v in values)])
        except IncompatibleTypes:
            types = ", ".join(dict.fromkeys(_type_name(v.type) for v in values))
            raise self._type_error(node, f"IN cannot compare {_type_name(operand.type)} with a list of "
                                         f"{types}") from None
        if kind is None:
            return Literal(None, ColumnType.BOOLEAN)
        return InList(coerce(operand, kind), tuple(coerce(v, kind) for v in values),
                      operand.nullable or any(v.nullable for v in values))

    def _case(self, node: exp.Case, ctx: _Context) -> Expr:
        subject = self._bind(node.this, ctx) if node.this is not None else None
        whens: list[tuple[Expr, Expr]] = []
        for branch in node.args.get("ifs") or []:
            when = self._bind(branch.this, ctx)
            if subject is not None:
                when = self._compare(branch, BinaryOp.EQ, subject, when)
            else:
                self._need_boolean(branch.this, "CASE WHEN", when)
            whens.append((coerce(when, ColumnType.BOOLEAN), self._bind(branch.args["true"], ctx)))
        default_node = node.args.get("default")
        default = self._bind(default_node, ctx) if default_node is not None else Literal(None, None)
        values = [value for _, value in whens] + [default]
        try:
            kind = common_type([v.type for v in values])
        except IncompatibleTypes:
            types = ", ".join(sorted({_type_name(v.type) for v in values}))
            raise self._type_error(node, f"CASE branches have incompatible types {types}") from None
        if kind is None:
            return Literal(None, None)
        return Case(tuple((when, coerce(value, kind)) for when, value in whens), coerce(default, kind), kind,
                    any(v.nullable for v in values))

    def _coalesce(self, node: exp.Coalesce, ctx: _Context) -> Expr:
        args = [self._bind(node.this, ctx), *(self._bind(a, ctx) for a in node.expressions)]
        try:
            kind = common_type([a.type for a in args])
        except IncompatibleTypes:
            types = ", ".join(sorted({_type_name(a.type) for a in args}))
            raise self._type_error(node, f"COALESCE arguments have incompatible types {types}") from None
        if kind is None:
            return Literal(None, None)
        return Coalesce(tuple(coerce(a, kind) for a in args), kind, all(a.nullable for a in args))

    def _aggregate(self, node: exp.AggFunc, ctx: _Context, filtered: exp.Filter | None = None) -> Expr:
        """An aggregate call (with ``filtered``, the FILTER (WHERE ...) node around it)."""
        function = _AGGREGATES.get(type(node))
        if function is None:
            raise refusal(self.parsed, node)
        name = function.value
        target = node.this
        if isinstance(target, exp.Distinct):
            if len(target.expressions) != 1:
                raise self.parsed.unsupported(f"{name}(DISTINCT ...) of several expressions", node,
                                              hint="count the distinct values of one expression")
            function = _DISTINCT_AGGREGATES.get(function, function)  # min/max of distinct values: the same
            target = target.expressions[0]
        if node.expressions:
            raise self.parsed.unsupported(f"{name}() with several arguments", node)
        arg: Expr | None
        if function is AggregateFunction.COUNT and isinstance(target, exp.Star):
            function, arg, result = AggregateFunction.COUNT_ROWS, None, ColumnType.INT
        else:
            if target is None or isinstance(target, exp.Star):
                raise ViewDefinitionError(f"{name} needs a column or expression: {self.describe(node)}")
            arg = self._bind(target, _Context(f"the argument of {name}"))
            result = self._aggregate_type(node, function, arg)
        condition = self._aggregate_filter(filtered) if filtered is not None else None
        call = AggregateCall(function, arg, result, condition)
        assert ctx.aggregates is not None
        if call not in ctx.aggregates:
            ctx.aggregates.append(call)
        return AggregateRef(ctx.aggregates.index(call), result, call.nullable)

    def _aggregate_filter(self, node: exp.Filter) -> Expr:
        """The condition of ``agg(...) FILTER (WHERE condition)``: over one input row, like WHERE."""
        where = node.expression
        if not isinstance(where, exp.Where):
            raise self.parsed.unsupported("FILTER without WHERE", node, "FILTER")
        condition = self._bind(where.this, _Context("FILTER (WHERE ...)"))
        if condition.type not in (ColumnType.BOOLEAN, None):
            raise self._type_error(where.this, f"FILTER (WHERE ...) needs a boolean, this is "
                                               f"{_type_name(condition.type)}")
        return coerce(condition, ColumnType.BOOLEAN)

    def _aggregate_type(self, node: exp.Expr, function: AggregateFunction, arg: Expr) -> ColumnType:
        if function in (AggregateFunction.COUNT, AggregateFunction.COUNT_DISTINCT):
            return ColumnType.INT
        if arg.type is None:
            raise self._type_error(node, f"cannot infer the type of {function.value} of an always-NULL value")
        if function in (AggregateFunction.SUM, AggregateFunction.AVG, *_DISTINCT_AGGREGATES.values()):
            if arg.type not in _NUMERIC:
                raise self._type_error(node, f"{function.value} needs numbers, got {_type_name(arg.type)}")
            average = function in (AggregateFunction.AVG, AggregateFunction.AVG_DISTINCT)
            return ColumnType.FLOAT if average else arg.type
        return arg.type

    def _type_error(self, node: exp.Expr, problem: str) -> ViewDefinitionError:
        return ViewDefinitionError(f"type error in {self.describe(node)}: {problem}")
