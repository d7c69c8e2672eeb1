"""Vectorised evaluation of planned expressions over an Arrow batch with ``pyarrow.compute``.

Semantics follow Spark SQL: NULL in, NULL out; AND/OR use three-valued (Kleene) logic; a CASE condition
that is NULL is not taken; ``x / 0`` is NULL (Spark's ``try_divide``, and what the generated Spark and
DuckDB SQL compute); integer overflow raises (Spark's ANSI mode) instead of wrapping.

Leaves name batch columns through ``column_field``/``group_field``/``aggregate_field``, so a batch of
source rows and a batch of aggregate results are evaluated by the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.row_schema import ColumnType
from mvlog.views.expr import (
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
    WindowStart,
)
from mvlog.views.functions import evaluate_call

Datum = Any  # pa.Array | pa.ChunkedArray | pa.Scalar: what pyarrow.compute takes and returns

_ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.INT: pa.int64(),
    ColumnType.FLOAT: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.BYTES: pa.binary(),
}

_KERNELS: dict[BinaryOp, Callable[..., Datum]] = {
    BinaryOp.ADD: pc.add_checked,
    BinaryOp.SUB: pc.subtract_checked,
    BinaryOp.MUL: pc.multiply_checked,
    BinaryOp.EQ: pc.equal,
    BinaryOp.NEQ: pc.not_equal,
    BinaryOp.LT: pc.less,
    BinaryOp.LTE: pc.less_equal,
    BinaryOp.GT: pc.greater,
    BinaryOp.GTE: pc.greater_equal,
    BinaryOp.AND: pc.and_kleene,
    BinaryOp.OR: pc.or_kleene,
}


def arrow_type(kind: ColumnType | None) -> pa.DataType:
    return pa.null() if kind is None else _ARROW_TYPES[kind]


WINDOW_START = "__window_start"  # the batch column of a row's window start (``mvlog.views.window``)


def column_field(side: int, column: str) -> str:
    return f"s{side}.{column}"


def group_field(index: int) -> str:
    return f"g{index}"


def aggregate_field(index: int) -> str:
    return f"a{index}"


def evaluate(expr: Expr, batch: pa.Table) -> pa.Array:
    """``expr`` for every row of ``batch``, as one array of ``batch.num_rows`` values."""
    result = _eval(expr, batch)
    if isinstance(result, pa.Scalar):
        return pa.repeat(result, batch.num_rows)
    if isinstance(result, pa.ChunkedArray):
        return result.combine_chunks()
    return result


def _eval(expr: Expr, batch: pa.Table) -> Datum:
    match expr:
        case ColumnRef(side=side, column=column):
            return batch.column(column_field(side, column))
        case GroupRef(index=index):
            return batch.column(group_field(index))
        case AggregateRef(index=index):
            return batch.column(aggregate_field(index))
        case WindowStart():
            return batch.column(WINDOW_START)
        case Call(args=args):
            return evaluate_call(expr, [_eval(a, batch) for a in args], batch.num_rows)
        case Literal(value=value, type=kind):
            return pa.scalar(value, arrow_type(kind))
        case Cast(operand=operand, type=kind):
            return pc.cast(_eval(operand, batch), arrow_type(kind))
        case Binary(op=BinaryOp.DIV, left=left, right=right):
            divisor = _eval(right, batch)
            divisor = pc.if_else(pc.equal(divisor, 0.0), pa.scalar(None, pa.float64()), divisor)
            return pc.divide(_eval(left, batch), divisor)
        case Binary(op=op, left=left, right=right):
            return _KERNELS[op](_eval(left, batch), _eval(right, batch))
        case Not(operand=operand):
            return pc.invert(_eval(operand, batch))
        case Negate(operand=operand):
            return pc.negate_checked(_eval(operand, batch))
        case IsNull(operand=operand, negated=negated):
            value = _eval(operand, batch)
            return pc.is_valid(value) if negated else pc.is_null(value)
        case Between(operand=operand, low=low, high=high):
            value = _eval(operand, batch)
            return pc.and_kleene(pc.greater_equal(value, _eval(low, batch)), pc.less_equal(value, _eval(high, batch)))
        case InList(operand=operand, values=values):
            value = _eval(operand, batch)
            found = pc.equal(value, _eval(values[0], batch))
            for other in values[1:]:  # three-valued: TRUE on a match, else NULL if a NULL was compared
                found = pc.or_kleene(found, pc.equal(value, _eval(other, batch)))
            return found
        case Case(whens=whens, default=default, type=kind):
            return _case(whens, default, arrow_type(kind), batch)
        case Coalesce(args=args):
            return pc.coalesce(*(_eval(a, batch) for a in args))
    raise TypeError(f"cannot evaluate {expr!r}")  # unreachable for plans made by plan_view


def _case(whens: tuple[tuple[Expr, Expr], ...], default: Expr, kind: pa.DataType, batch: pa.Table) -> Datum:
    conditions = [evaluate(condition, batch) for condition, _ in whens]
    values = [evaluate(value, batch).cast(kind) for _, value in whens]
    names = [f"c{i}" for i in range(len(conditions))]
    selector = pc.make_struct(*conditions, field_names=names)
    return pc.case_when(selector, *values, evaluate(default, batch).cast(kind))
