"""Scalar functions of the Nexmark queries, on both paths: bound, evaluated per batch, rendered to SQL.

Each function is one ``Call`` node: the binder types it here (``bind_function``), the operator evaluates
it over an Arrow batch (``evaluate_call``) and the SQL generator renders it as a sqlglot node that
sqlglot writes in Spark's and DuckDB's spelling (``render_call``), so both engines compute what the
operator computes:

- ``a % b`` / ``mod(a, b)`` (int or float; the sign of ``a``, as Java and C), ``a DIV b`` (ints, truncated);
  a zero divisor gives NULL, as ``/`` does;
- ``lower(s)``, ``upper(s)``, ``concat(s, ...)`` / ``s || t`` (strings; NULL if any argument is NULL),
  ``length(s)`` / ``char_length(s)`` / ``character_length(s)`` (characters, not bytes), ``replace(s, search[,
  replacement])`` (every non-overlapping occurrence, left to right; an empty search changes nothing),
  ``instr(s, sub)`` (1-based, 0 if absent), ``split_part(s, delimiter, n)`` (n >= 1, '' past the end),
  ``regexp_extract(s, pattern, group)`` ('' without a match; write patterns in the common subset of
  Java's, RE2's and Python's syntax);
- on an event time, an INT of epoch milliseconds (mvlog has no timestamp type), in UTC:
  ``date_format(ts, pattern)`` with the pattern letters ``yyyy MM dd HH mm ss`` (any other character
  is kept as is; quote nothing), ``hour(ts)``, ``minute(ts)`` and ``extract(HOUR|MINUTE FROM ts)``.
  Spark renders them over ``timestamp_millis(ts)`` in its session time zone: run Spark in UTC.

Functions whose result depends on character positions or on calendars are evaluated row by row in
Python (``pyarrow.compute`` counts bytes, not characters, and has no strftime over millis in UTC that
matches Spark's letters); the others stay vectorised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from mvlog.row_schema import ColumnType
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.expr import Call, Expr, Literal

Bind = Callable[[exp.Expr], Expr]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Spark's date_format letters -> strftime, as sqlglot translates them (it appends "strict" to some).
_DATE_DIRECTIVES = {"%Y": "yyyy", "%m": "MM", "%d": "dd", "%H": "HH", "%M": "mm", "%S": "ss"}
_TIME_PARTS = {"HOUR": "hour", "MINUTE": "minute"}
_NUMERIC = (ColumnType.INT, ColumnType.FLOAT)


def bind_function(node: exp.Expr, bind: Bind, describe: Callable[[exp.Expr], str]) -> Expr | None:
    """``node`` as a ``Call`` if it is one of the functions above (None: it is not)."""

    def error(problem: str) -> ViewDefinitionError:
        return ViewDefinitionError(f"type error in {describe(node)}: {problem}")

    def strings(*nodes: exp.Expr) -> list[Expr]:
        args = [bind(n) for n in nodes]
        for arg in args:
            if arg.type not in (ColumnType.STRING, None):
                raise error(f"{node.key.lower()} needs strings, got {arg.type.value if arg.type else 'NULL'}")
        return [_typed(a, ColumnType.STRING) for a in args]

    if isinstance(node, exp.Mod | exp.IntDiv):
        left, right = bind(node.this), bind(node.expression)
        integer = isinstance(node, exp.IntDiv)
        allowed = (ColumnType.INT, None) if integer else (*_NUMERIC, None)
        if left.type not in allowed or right.type not in allowed:
            raise error(f"{'DIV needs ints' if integer else '% needs numbers'}, got "
                        f"{left.type.value if left.type else 'NULL'} and {right.type.value if right.type else 'NULL'}")
        kind = ColumnType.INT if integer or ColumnType.FLOAT not in (left.type, right.type) else ColumnType.FLOAT
        return Call("div" if integer else "mod", (_typed(left, kind), _typed(right, kind)), kind, True)
    if isinstance(node, exp.Lower | exp.Upper):
        (arg,) = strings(node.this)
        return Call(node.key.lower(), (arg,), ColumnType.STRING, arg.nullable)
    if isinstance(node, exp.Length):
        if node.args.get("binary") or node.args.get("encoding") is not None:
            return None
        (arg,) = strings(node.this)
        return Call("length", (arg,), ColumnType.INT, arg.nullable)
    if isinstance(node, exp.Replace):
        replacement = node.args.get("replacement")
        args = strings(node.this, node.expression, *([replacement] if replacement is not None else []))
        if replacement is None:  # Spark's two-argument form removes the occurrences
            args.append(Literal("", ColumnType.STRING))
        return Call("replace", tuple(args), ColumnType.STRING, any(a.nullable for a in args))
    if isinstance(node, exp.Concat | exp.DPipe):
        parts = list(node.expressions) if isinstance(node, exp.Concat) else [node.this, node.expression]
        args = strings(*parts)
        return Call("concat", tuple(args), ColumnType.STRING, any(a.nullable for a in args))
    if isinstance(node, exp.StrPosition):
        if node.args.get("position") is not None or node.args.get("occurrence") is not None:
            return None
        text, sub = strings(node.this, node.args["substr"])
        return Call("instr", (text, sub), ColumnType.INT, text.nullable or sub.nullable)
    if isinstance(node, exp.SplitPart):
        text, delimiter = strings(node.this, node.args["delimiter"])
        index = _int_literal(node.args.get("part_index"))
        if not isinstance(delimiter, Literal) or not delimiter.value or index is None or index < 1:
            raise error("split_part needs a non-empty literal delimiter and a literal part number from 1")
        return Call("split_part", (text, delimiter, Literal(index, ColumnType.INT)), ColumnType.STRING, text.nullable)
    if isinstance(node, exp.RegexpExtract):
        text, pattern = strings(node.this, node.expression)
        group = 1 if node.args.get("group") is None else _int_literal(node.args["group"])
        if not isinstance(pattern, Literal) or not isinstance(pattern.value, str) or group is None or group < 0:
            raise error("regexp_extract needs a literal pattern and a literal group number")
        try:
            groups = re.compile(pattern.value).groups
        except re.error as problem:
            raise error(f"regexp_extract's pattern does not compile: {problem}") from None
        if group > groups:
            raise error(f"regexp_extract's pattern has {groups} group(s), not {group}")
        return Call("regexp_extract", (text, pattern, Literal(group, ColumnType.INT)), ColumnType.STRING,
                    text.nullable)
    if isinstance(node, exp.TimeToStr) and isinstance(node.this, exp.TimeStrToTime):
        time = _event_time(bind(node.this.this), error)
        layout = node.args.get("format")
        strftime = str(layout.this).replace("strict", "") if isinstance(layout, exp.Literal) else None
        if strftime is None or any(d not in _DATE_DIRECTIVES for d in re.findall(r"%.", strftime)):
            raise error("date_format takes a literal pattern of the letters yyyy, MM, dd, HH, mm and ss")
        return Call("date_format", (time, Literal(strftime, ColumnType.STRING)), ColumnType.STRING, time.nullable)
    part = None
    if isinstance(node, exp.Hour | exp.Minute):
        part, operand = node.key.lower(), node.this
    elif isinstance(node, exp.Extract) and str(node.this.name).upper() in _TIME_PARTS:
        part, operand = _TIME_PARTS[str(node.this.name).upper()], node.expression
    if part is not None:
        time = _event_time(bind(operand), error)
        return Call(part, (time,), ColumnType.INT, time.nullable)
    return None


def _typed(arg: Expr, kind: ColumnType) -> Expr:
    from mvlog.views.binder import coerce  # the binder imports this module

    return coerce(arg, kind)


def _int_literal(node: exp.Expr | None) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and str(node.this).isdigit():
        return int(node.this)
    return None


def _event_time(arg: Expr, error: Callable[[str], ViewDefinitionError]) -> Expr:
    if arg.type not in (ColumnType.INT, None):
        raise error("the event time is an int of epoch milliseconds (mvlog has no timestamp type), got "
                    f"{arg.type.value if arg.type else 'NULL'}")
    return _typed(arg, ColumnType.INT)


# -- evaluation ------------------------------------------------------------------------------------------


def evaluate_call(call: Call, args: Sequence[Any], rows: int) -> Any:
    """``call`` over evaluated arguments (Arrow arrays or scalars) of a batch of ``rows`` rows."""
    name = call.function
    if name in ("mod", "div"):
        left, right = args
        divisor = pc.if_else(pc.equal(right, 0), pa.scalar(None, right.type), right)
        if name == "div" or call.type is ColumnType.INT:
            quotient = pc.divide(left, divisor)  # Arrow truncates integer division, as Spark and DuckDB
            return quotient if name == "div" else pc.subtract(left, pc.multiply(divisor, quotient))
        return _rows(lambda a, b: math.fmod(a, b) if b else None, [left, right], rows, pa.float64())
    if name == "lower":
        return pc.utf8_lower(args[0])
    if name == "upper":
        return pc.utf8_upper(args[0])
    if name == "concat":
        return pc.binary_join_element_wise(*args, "")
    if name == "length":
        return pc.cast(pc.utf8_length(args[0]), pa.int64())  # code points, as Spark's and DuckDB's length
    if name == "replace":
        search, replacement = call.args[1:]
        if isinstance(search, Literal) and isinstance(replacement, Literal) and search.value \
                and replacement.value is not None:
            return pc.replace_substring(args[0], str(search.value), str(replacement.value))
        return _rows(lambda s, old, new: s.replace(old, new) if old else s, args, rows, pa.string())
    if name == "instr":
        return _rows(lambda s, sub: s.find(sub) + 1, args, rows, pa.int64())
    if name == "split_part":
        delimiter, index = str(_value(call.args[1])), int(_value(call.args[2]))

        def part(s: str) -> str:
            parts = s.split(delimiter)
            return parts[index - 1] if index <= len(parts) else ""

        return _rows(part, args[:1], rows, pa.string())
    if name == "regexp_extract":
        pattern, group = re.compile(str(_value(call.args[1]))), int(_value(call.args[2]))

        def extract(s: str) -> str:
            match = pattern.search(s)
            found: str | None = match.group(group) if match else None
            return found or ""

        return _rows(extract, args[:1], rows, pa.string())
    if name == "date_format":
        layout = str(_value(call.args[1]))
        return _rows(lambda ms: (_EPOCH + timedelta(milliseconds=ms)).strftime(layout), args[:1], rows, pa.string())
    if name == "hour":
        return _rows(lambda ms: ms // 3_600_000 % 24, args[:1], rows, pa.int64())
    if name == "minute":
        return _rows(lambda ms: ms // 60_000 % 60, args[:1], rows, pa.int64())
    raise TypeError(f"cannot evaluate {call!r}")


def _value(arg: Expr) -> Any:
    assert isinstance(arg, Literal)  # bind_function makes these arguments literals
    return arg.value


def _rows(function: Callable[..., Any], args: Sequence[Any], rows: int, kind: pa.DataType) -> pa.Array:
    """``function`` row by row (NULL in any argument gives NULL)."""
    columns = [a.to_pylist() if not isinstance(a, pa.Scalar) else [a.as_py()] * rows for a in args]
    values = [None if any(v is None for v in row) else function(*row) for row in zip(*columns, strict=True)]
    return pa.array(values, kind)


# -- rendering -------------------------------------------------------------------------------------------


def render_call(call: Call, args: Sequence[exp.Expr]) -> exp.Expr:
    """``call`` as a sqlglot node over its rendered arguments; sqlglot spells it per dialect."""
    name = call.function
    if name in ("mod", "div"):
        divisor = exp.Nullif(this=args[1], expression=exp.Literal.number(0))
        kind = exp.IntDiv if name == "div" else exp.Mod
        return exp.Paren(this=kind(this=_paren(args[0]), expression=divisor))
    if name == "lower":
        return exp.Lower(this=args[0])
    if name == "upper":
        return exp.Upper(this=args[0])
    if name == "concat":
        node = args[0]
        for arg in args[1:]:
            node = exp.DPipe(this=_paren(node), expression=_paren(arg), safe=True)
        return exp.Paren(this=node)
    if name == "length":
        return exp.Length(this=args[0])
    if name == "replace":
        return exp.Replace(this=args[0], expression=args[1], replacement=args[2])
    if name == "instr":
        return exp.StrPosition(this=args[0], substr=args[1])
    if name == "split_part":
        return exp.SplitPart(this=args[0], delimiter=args[1], part_index=_number(call.args[2]))
    if name == "regexp_extract":
        return exp.RegexpExtract(this=args[0], expression=args[1], group=_number(call.args[2]))
    time = exp.UnixToTime(this=args[0], scale=exp.UnixToTime.MILLIS)
    if name == "date_format":
        return exp.TimeToStr(this=time, format=args[1])
    if name == "hour":
        return exp.Hour(this=time)
    if name == "minute":
        return exp.Minute(this=time)
    raise TypeError(f"cannot render {call!r}")


def _number(arg: Expr) -> exp.Expr:
    assert isinstance(arg, Literal)
    return exp.Literal.number(str(arg.value))


def _paren(node: exp.Expr) -> exp.Expr:
    return exp.Paren(this=node) if isinstance(node, exp.Binary | exp.Not | exp.Neg) else node
