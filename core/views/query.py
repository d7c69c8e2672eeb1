"""The resolved shape of a view's SELECT: its sources, join, filter, grouping and output columns.

This is what the operator executes and what the SQL generator renders; it holds no sqlglot objects, so a
plan is a plain value that can be compared, hashed and shared between threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from mvlog.row_schema import ColumnType, RowSchema
from mvlog.views.expr import AggregateCall, ColumnRef, Expr


@dataclass(frozen=True)
class Source:
    """A view read by the query; ``alias`` qualifies its columns (the view name unless aliased)."""

    alias: str
    view: str
    schema: RowSchema


@dataclass(frozen=True)
class JoinCondition:
    """``left = right`` with ``left`` on side 0 and ``right`` on side 1, compared as ``type``."""

    left: ColumnRef
    right: ColumnRef
    type: ColumnType


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
    tiebreak: tuple[ColumnRef, ...]
    limit: int


@dataclass(frozen=True)
class TimeWindow:
    """Spark's ``window(time, size[, slide])`` over an INT column of epoch milliseconds: tumbling when
    ``slide == size``, else hopping (a row falls in every window [start, start + size) that holds it,
    the starts being multiples of ``slide``)."""

    time: Expr
    size: int  # milliseconds
    slide: int  # milliseconds


@dataclass(frozen=True)
class Query:
    sources: tuple[Source, ...]  # one, or two for a join
    join: tuple[JoinCondition, ...]  # empty unless two sources
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
