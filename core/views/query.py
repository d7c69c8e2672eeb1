"""The resolved shape of a view's SELECT: its sources, join, filter, grouping and output columns.

This is what the operator executes and what the SQL generator renders; it holds no sqlglot objects, so a
plan is a plain value that can be compared, hashed and shared between threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mvlog.row_schema import ColumnType, RowSchema
from mvlog.views.expr import AggregateCall, ColumnRef, Expr

# A pseudo-column of every source of a join: TRUE when the joined row has a row of that source, NULL when
# an outer join null-extends it. A view key uses it where NULL key values alone would not tell a
# null-extended row from a row whose key is NULL (see plan.py).
PRESENT = "__present"


@dataclass(frozen=True)
class Source:
    """A view read by the query; ``alias`` qualifies its columns (the view name unless aliased)."""

    alias: str
    view: str
    schema: RowSchema


@dataclass(frozen=True)
class JoinCondition:
    """``left = right`` with ``left`` on a side already joined and ``right`` on the side being joined,
    compared as ``type``."""

    left: ColumnRef
    right: ColumnRef
    type: ColumnType


class JoinKind(StrEnum):
    INNER = "INNER"
    LEFT = "LEFT"
    RIGHT = "RIGHT"
    FULL = "FULL"
    # ``IN (subquery)`` / ``EXISTS``, and ``NOT EXISTS``: the left rows with a match / without one, each
    # once, with no column of the right (a subquery of the WHERE clause, invisible to the rest).
    SEMI = "SEMI"
    ANTI = "ANTI"

    @property
    def filters(self) -> bool:
        """Whether the join keeps left rows only (a semi or anti join)."""
        return self in (JoinKind.SEMI, JoinKind.ANTI)

    @property
    def keeps_left(self) -> bool:
        """Whether a row of the left input without a match is kept, null-extended."""
        return self in (JoinKind.LEFT, JoinKind.FULL)

    @property
    def keeps_right(self) -> bool:
        return self in (JoinKind.RIGHT, JoinKind.FULL)


@dataclass(frozen=True)
class JoinStep:
    """Source ``i + 1`` joined to the result of sources ``0..i`` (a left-deep chain): equal on ``on``
    (at least one column pair) and, for the pairs equal there, ``residual`` true. For an outer join the
    residual decides what matches, so a row whose pairs all fail it is null-extended, not dropped."""

    kind: JoinKind
    on: tuple[JoinCondition, ...]
    residual: Expr | None = None


@dataclass(frozen=True)
class OutputColumn:
    """A column of the view's rows; hidden columns carry key components the SELECT list leaves out."""

    name: str
    expr: Expr
    hidden: bool = False


@dataclass(frozen=True)
class SortKey:
    """One ORDER BY term: ``expr`` ascending or descending, NULLs first or last (Spark's defaults:
    first ascending, last descending)."""

    expr: Expr
    descending: bool
    nulls_first: bool


@dataclass(frozen=True)
class TopN:
    """``ROW_NUMBER() OVER (PARTITION BY partition ORDER BY order) <= limit``: per partition, the rows
    ranked 1..limit. Ties are broken by ``tiebreak`` (the source's key, ascending), in the operator and
    in the rendered SQL alike, so the ranking is a function of the rows."""

    partition: tuple[Expr, ...]
    order: tuple[SortKey, ...]
    tiebreak: tuple[Expr, ...]
    limit: int


@dataclass(frozen=True)
class TimeWindow:
    """Spark's ``window(time, size[, slide])`` over an INT column of epoch milliseconds: tumbling when
    ``slide == size``, else hopping (a row falls in every window [start, start + size) that holds it,
    the starts being multiples of ``slide``)."""

    time: Expr
    size: int  # milliseconds
    slide: int  # milliseconds
    #: The source whose rows the rendered SQL copies, one per window, before a join: the one the time
    #: reads (the operator copies the joined rows instead, after the join: the same rows).
    side: int = 0


@dataclass(frozen=True)
class Query:
    sources: tuple[Source, ...]  # one, or several joined
    joins: tuple[JoinStep, ...]  # one per source after the first: joins[i] joins source i + 1
    where: Expr | None
    group_by: tuple[Expr, ...]
    aggregates: tuple[AggregateCall, ...]
    # Expressions over source columns (ColumnRef) for a projection, over GroupRef/AggregateRef for an
    # aggregate; hidden key columns come last.
    outputs: tuple[OutputColumn, ...]
    is_aggregate: bool
    # HAVING: over GroupRef/AggregateRef like an aggregate's outputs; a group it is not true for has no row.
    having: Expr | None = None
    # Top-N per partition (``mvlog.views.topn_plan``): set, the outputs are over source columns plus
    # the ``RowNumber`` of the row in its partition, and only rows ranked within the limit are rows.
    top_n: TopN | None = None
    # A time window in GROUP BY (``mvlog.views.window``): the batch gets a ``WindowStart`` column first.
    window: TimeWindow | None = None

    @property
    def extendable_sides(self) -> frozenset[int]:
        """The sources an outer join may null-extend (their columns may be NULL in a joined row)."""
        return extendable_sides(self.joins)


def extendable_sides(joins: tuple[JoinStep, ...]) -> frozenset[int]:
    sides: set[int] = set()
    for index, step in enumerate(joins):
        if step.kind.keeps_left:
            sides.add(index + 1)
        if step.kind.keeps_right:
            sides.update(range(index + 1))
    return frozenset(sides)
