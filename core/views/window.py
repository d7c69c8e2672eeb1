"""Tumbling and hopping time windows: Spark's ``window(ts, '10 seconds'[, '2 seconds'])`` in GROUP BY.

mvlog has no timestamp type (a column is int, float, string, boolean or bytes, and the wire format
follows), so event time is an INT column of epoch **milliseconds**, and ``window.start`` /
``window.end`` are INT milliseconds too. A window is [start, start + size); starts are the multiples of
the slide (floored, also before 1970), and a row falls in each window that holds its time: one for a
tumbling window (slide = size), ``ceil(size / slide)`` or fewer for a hopping one. A row whose time is
NULL falls in none.

The operator and the SQL do the same expansion: the batch (``expand``) and the rendered source
(``windowed_source``: the upstream's rows crossed with ``VALUES (0), (1), ...`` and filtered) get one
copy of each row per window it falls in, with its window start as an extra column; the aggregate then
groups by that column like by any other GROUP BY expression.
"""

from __future__ import annotations

import math
import re

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from mvlog.row_schema import ColumnType
from mvlog.views.errors import ViewDefinitionError
from mvlog.views.evaluate import WINDOW_START, evaluate
from mvlog.views.expr import Expr
from mvlog.views.query import Query, TimeWindow

#: At most this many windows per row (a hopping window's size over its slide): each is a copy of the row.
MAX_WINDOWS_PER_ROW = 1000

_UNITS = {"millisecond": 1, "ms": 1, "second": 1000, "sec": 1000, "s": 1000, "minute": 60_000, "min": 60_000,
          "hour": 3_600_000, "h": 3_600_000, "day": 86_400_000, "d": 86_400_000, "week": 604_800_000}
_DURATION = re.compile(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+?)s?\s*\Z", re.IGNORECASE)


def duration_ms(text: str) -> int | None:
    """``'10 seconds'``, ``'1 minute'``, ``'500 milliseconds'``, ... in milliseconds (None: not one)."""
    match = _DURATION.match(text)
    if match is None:
        return None
    unit = _UNITS.get(match[2].lower()) or _UNITS.get(match[2].lower() + "s")
    return int(match[1]) * unit if unit is not None else None


def plan_window(time: Expr, durations: list[str], describe: str, side: int = 0) -> TimeWindow:
    """The window of ``window(time, size[, slide])`` (``time`` already bound, read off source ``side``),
    checked."""
    if time.type is not ColumnType.INT:
        kind = time.type
        raise ViewDefinitionError(f"type error in {describe}: the event time of window() is an int column of "
                                  f"epoch milliseconds (mvlog has no timestamp type), got "
                                  f"{kind.value if kind else 'NULL'}")
    sizes = [duration_ms(d) for d in durations]
    for text, size in zip(durations, sizes, strict=True):
        if size is None or size <= 0:
            raise ViewDefinitionError(f"{describe}: {text!r} is not a duration such as '10 seconds', '1 minute' "
                                      "or '500 milliseconds'")
    size = sizes[0]
    slide = sizes[1] if len(sizes) > 1 else size
    assert size is not None and slide is not None
    if slide > size:
        raise ViewDefinitionError(f"{describe}: the slide ({durations[1]}) is longer than the window "
                                  f"({durations[0]}); rows between windows would be in none")
    if math.ceil(size / slide) > MAX_WINDOWS_PER_ROW:
        raise ViewDefinitionError(f"{describe}: each row would fall in {math.ceil(size / slide)} windows (at most "
                                  f"{MAX_WINDOWS_PER_ROW}); use a longer slide")
    return TimeWindow(time, size, slide, side)


def expand(batch: pa.Table, window: TimeWindow) -> pa.Table:
    """``batch`` with one copy of each row per window it falls in, its start in column ``WINDOW_START``."""
    times = evaluate(window.time, batch)
    present = pc.is_valid(times)
    batch, times = batch.filter(present), times.filter(present)
    times = pc.cast(times, pa.int64())
    # The latest window start at or before the time: time minus time mod slide, the mod floored (Arrow's
    # integer division truncates towards zero, as SQL's % does).
    remainder = pc.subtract(times, pc.multiply(pc.divide(times, window.slide), window.slide))
    remainder = pc.if_else(pc.less(remainder, 0), pc.add(remainder, window.slide), remainder)
    last = pc.subtract(times, remainder)
    parts = []
    for k in range(math.ceil(window.size / window.slide)):
        starts = pc.subtract(last, k * window.slide)
        inside = pc.greater(pc.add(starts, window.size), times)
        parts.append(batch.filter(inside).append_column(WINDOW_START, starts.filter(inside)))
    return pa.concat_tables(parts)


def windowed_source(query: Query, table: exp.Expr, alias: str, render_time: exp.Expr) -> exp.Expr:
    """The rendered FROM of a windowed view: ``table`` (aliased ``alias``) expanded as :func:`expand` does,
    as a subquery of the same alias, so the rest of the query reads it like the upstream."""
    window = query.window
    assert window is not None
    count = math.ceil(window.size / window.slide)
    number = exp.column("k", table="_w", quoted=True)

    def bigint(value: int) -> exp.Expr:
        return exp.cast(exp.Literal.number(value), "BIGINT")

    time = exp.Paren(this=render_time)
    # floor(time / slide) * slide with SQL's truncating %: time - ((time % slide) + slide) % slide
    floor_mod = exp.Mod(this=exp.Paren(this=exp.Add(this=exp.Paren(this=exp.Mod(this=time.copy(),
                                                                                 expression=bigint(window.slide))),
                                                      expression=bigint(window.slide))),
                        expression=bigint(window.slide))
    start = exp.Sub(this=exp.Sub(this=time.copy(), expression=exp.Paren(this=floor_mod)),
                    expression=exp.Mul(this=number.copy(), expression=bigint(window.slide)))
    numbers = exp.Values(expressions=[exp.Tuple(expressions=[bigint(k)]) for k in range(count)],
                         alias=exp.TableAlias(this=exp.to_identifier("_w", quoted=True),
                                              columns=[exp.to_identifier("k", quoted=True)]))
    inside = exp.and_(exp.Not(this=exp.Paren(this=exp.Is(this=time.copy(), expression=exp.Null()))),
                      exp.GT(this=exp.Add(this=exp.Paren(this=start.copy()), expression=bigint(window.size)),
                             expression=time.copy()))
    expanded = (exp.select(exp.column(exp.Star(), table=alias, quoted=True),
                           exp.alias_(start, WINDOW_START, quoted=True))
                .from_(exp.alias_(table, alias, table=True, quoted=True))
                .join(numbers, join_type="CROSS")
                .where(inside))
    return expanded.subquery(exp.to_identifier(alias, quoted=True), copy=False)
