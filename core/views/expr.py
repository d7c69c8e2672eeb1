"""The typed expression tree of a planned view.

Planning resolves the sqlglot AST into these nodes once: names are bound to a source side and column,
types are inferred and implicit conversions are explicit ``Cast`` nodes. The vectorised evaluator and
the Spark/DuckDB SQL generator both read this tree, so the incremental operator and the full
recomputation cannot disagree about what a view means.

``type`` is ``None`` only for an expression that is always NULL and whose type nothing determined
(a bare ``NULL``); planning gives such expressions a type as soon as they meet a typed operand.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from mvlog.row_schema import ColumnType

LiteralValue = int | float | str | bool | None


class BinaryOp(StrEnum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    EQ = "="
    NEQ = "<>"
    LT = "<"
    LTE = "<="
    GT = ">"
    GTE = ">="
    AND = "AND"
    OR = "OR"

    @property
    def is_arithmetic(self) -> bool:
        return self in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV)

    @property
    def is_comparison(self) -> bool:
        return self in (BinaryOp.EQ, BinaryOp.NEQ, BinaryOp.LT, BinaryOp.LTE, BinaryOp.GT, BinaryOp.GTE)


class AggregateFunction(StrEnum):
    COUNT_ROWS = "count(*)"
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    # Over the distinct non-NULL values of the argument (a per-group multiset, like min/max keep).
    COUNT_DISTINCT = "count(DISTINCT)"
    SUM_DISTINCT = "sum(DISTINCT)"
    AVG_DISTINCT = "avg(DISTINCT)"


@dataclass(frozen=True)
class ColumnRef:
    """A column of one source of the FROM clause (side 0 = FROM, side 1 = the joined view)."""

    side: int
    column: str
    type: ColumnType | None
    nullable: bool


@dataclass(frozen=True)
class Literal:
    value: LiteralValue
    type: ColumnType | None

    @property
    def nullable(self) -> bool:
        return self.value is None


@dataclass(frozen=True)
class Binary:
    op: BinaryOp
    left: Expr
    right: Expr
    type: ColumnType | None
    nullable: bool


@dataclass(frozen=True)
class Not:
    operand: Expr

    @property
    def type(self) -> ColumnType | None:
        return ColumnType.BOOLEAN

    @property
    def nullable(self) -> bool:
        return self.operand.nullable


@dataclass(frozen=True)
class Negate:
    operand: Expr

    @property
    def type(self) -> ColumnType | None:
        return self.operand.type

    @property
    def nullable(self) -> bool:
        return self.operand.nullable


@dataclass(frozen=True)
class IsNull:
    operand: Expr
    negated: bool

    @property
    def type(self) -> ColumnType | None:
        return ColumnType.BOOLEAN

    @property
    def nullable(self) -> bool:
        return False


@dataclass(frozen=True)
class Between:
    """``operand BETWEEN low AND high``: ``operand >= low AND operand <= high`` in three-valued logic
    (NULL when either comparison is NULL and neither is false); ``NOT BETWEEN`` is ``Not(Between)``.
    A node of its own, not the two comparisons, so the rendered SQL says BETWEEN and the oracle
    checks the engines' BETWEEN against the operator's."""

    operand: Expr
    low: Expr
    high: Expr
    nullable: bool

    @property
    def type(self) -> ColumnType | None:
        return ColumnType.BOOLEAN


@dataclass(frozen=True)
class InList:
    """``operand IN (v1, v2, ...)`` over a list of values (not a subquery: that is a semi join): TRUE if
    the operand equals one, else NULL if the operand or any value is NULL, else FALSE, as in SQL (so
    ``NOT IN`` a list holding a NULL is never true); ``NOT IN`` is ``Not(InList)``."""

    operand: Expr
    values: tuple[Expr, ...]
    nullable: bool

    @property
    def type(self) -> ColumnType | None:
        return ColumnType.BOOLEAN


@dataclass(frozen=True)
class Case:
    """``CASE WHEN c1 THEN v1 ... ELSE d END``; a condition that is NULL counts as false."""

    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr
    type: ColumnType | None
    nullable: bool


@dataclass(frozen=True)
class Coalesce:
    args: tuple[Expr, ...]
    type: ColumnType | None
    nullable: bool


@dataclass(frozen=True)
class Cast:
    """An implicit conversion made explicit: int -> float, or typing an always-NULL expression."""

    operand: Expr
    type: ColumnType

    @property
    def nullable(self) -> bool:
        return self.operand.nullable


@dataclass(frozen=True)
class GroupRef:
    """In an aggregate view's output: the value of the ``index``-th GROUP BY expression."""

    index: int
    type: ColumnType | None
    nullable: bool


@dataclass(frozen=True)
class AggregateRef:
    """In an aggregate view's output: the result of the ``index``-th aggregate call."""

    index: int
    type: ColumnType | None
    nullable: bool


@dataclass(frozen=True)
class AggregateCall:
    function: AggregateFunction
    arg: Expr | None  # None for count(*)
    type: ColumnType
    # ``FILTER (WHERE condition)``: only rows the condition is true for are aggregated (NULL: not true).
    filter: Expr | None = None

    @property
    def nullable(self) -> bool:
        """count is never NULL; the others are NULL over no (non-NULL) values."""
        return self.function not in (AggregateFunction.COUNT_ROWS, AggregateFunction.COUNT,
                                     AggregateFunction.COUNT_DISTINCT)


@dataclass(frozen=True)
class RowNumber:
    """In a top-N view's output: the row's rank in its partition (``ROW_NUMBER() OVER (...)``, the
    query's ``top_n``), 1-based; filled in by the top-N stage, never by the expression evaluator."""

    @property
    def type(self) -> ColumnType | None:
        return ColumnType.INT

    @property
    def nullable(self) -> bool:
        return False


@dataclass(frozen=True)
class WindowStart:
    """The start (epoch milliseconds) of the time window a row is counted in (the query's ``window``):
    a row of a hopping window's input is counted once per window it falls in, so this is not a function
    of the row but a column the window stage adds to the batch, one copy of the row per window."""

    @property
    def type(self) -> ColumnType | None:
        return ColumnType.INT

    @property
    def nullable(self) -> bool:
        return False


@dataclass(frozen=True)
class Call:
    """A scalar function (``mvlog.views.functions``: its name there, its arguments bound and typed)."""

    function: str
    args: tuple[Expr, ...]
    type: ColumnType | None
    nullable: bool


Expr = (ColumnRef | Literal | Binary | Not | Negate | IsNull | Between | InList | Case | Coalesce | Cast | GroupRef
        | AggregateRef | RowNumber | WindowStart | Call)


def children(expr: Expr) -> Iterator[Expr]:
    """Direct sub-expressions, in evaluation order."""
    match expr:
        case Binary(left=left, right=right):
            yield left
            yield right
        case Not(operand=operand) | Negate(operand=operand) | IsNull(operand=operand) | Cast(operand=operand):
            yield operand
        case Between(operand=operand, low=low, high=high):
            yield operand
            yield low
            yield high
        case InList(operand=operand, values=values):
            yield operand
            yield from values
        case Case(whens=whens, default=default):
            for condition, value in whens:
                yield condition
                yield value
            yield default
        case Coalesce(args=args) | Call(args=args):
            yield from args
        case _:
            return


def walk(expr: Expr) -> Iterator[Expr]:
    """The expression and all its sub-expressions, parents first."""
    yield expr
    for child in children(expr):
        yield from walk(child)
