"""Incremental GROUP BY: per-group deltas computed vectorised, merged into per-group state.

Per group the state holds the row count, for every count/sum/avg the count of non-NULL arguments and
their sum, and for every distinct argument of min/max and of the DISTINCT aggregates (count, sum, avg)
a multiset (value -> count): deleting the current minimum then just moves to the next value, and
deleting one of two equal values leaves the distinct count as it was, without rereading the group's
rows. Sums are exact for ints (Python ints); float sums are running sums, exact only while the values
are exactly representable.

A global aggregate (no GROUP BY) always has one row, as in SQL (count 0, other aggregates NULL over no
rows); its state is kept even when empty so the operator knows the row was already emitted.

``agg(x) FILTER (WHERE c)`` is kept as ``agg(CASE WHEN c THEN x END)`` (``count(*) FILTER (WHERE c)`` as
``count(CASE WHEN c THEN 1 END)``): every aggregate skips NULLs, so that is the same value, and its state
is the state of any other call (a count and a sum, or a multiset of the rows the condition is true for),
which retractions update alike. The view's SQL keeps the FILTER clause (``render``), so the oracle checks
this rewriting too.

HAVING filters the rows, not the state: a group whose HAVING turns false keeps its state and its row is
retracted; when it turns true again the row is emitted anew. ``SELECT DISTINCT`` is planned as a GROUP BY
of the selected expressions with no aggregate calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.changes import Change, change_between
from mvlog.row_schema import ColumnType, Key, Row
from mvlog.views.batch import WEIGHT
from mvlog.views.errors import InconsistentChanges
from mvlog.views.evaluate import aggregate_field, arrow_type, evaluate, group_field
from mvlog.views.expr import AggregateCall, AggregateFunction, Case, Expr, Literal
from mvlog.views.query import Query
from mvlog.views.state import StateReader
from mvlog.views.state_codec import GROUP_TAG, decode_value, dumps, encode_key, encode_value, key_value, loads

_COUNTED = (AggregateFunction.COUNT, AggregateFunction.SUM, AggregateFunction.AVG)
_SUMMED = (AggregateFunction.SUM, AggregateFunction.AVG)
_EXTREMES = (AggregateFunction.MIN, AggregateFunction.MAX)
# Aggregates computed from a per-group multiset of their argument's non-NULL values (value -> count).
_MULTISET = (*_EXTREMES, AggregateFunction.COUNT_DISTINCT, AggregateFunction.SUM_DISTINCT,
             AggregateFunction.AVG_DISTINCT)


@dataclass
class GroupState:
    """One group's aggregate state; also used for one epoch's delta of a group."""

    rows: int
    counts: list[int]  # per aggregate call: non-NULL arguments (count, sum, avg)
    sums: list[Any]  # per aggregate call: sum of the arguments (sum, avg)
    multisets: list[dict[Any, int]] = field(default_factory=list)  # per distinct min/max argument

    def add(self, delta: GroupState) -> GroupState:
        multisets = [dict(m) for m in self.multisets]
        for mine, theirs in zip(multisets, delta.multisets, strict=True):
            for value, count in theirs.items():
                total = mine.get(value, 0) + count
                if total:
                    mine[value] = total
                else:
                    mine.pop(value, None)
        counts = [a + b for a, b in zip(self.counts, delta.counts, strict=True)]
        sums = [a + b for a, b in zip(self.sums, delta.sums, strict=True)]
        return GroupState(self.rows + delta.rows, counts, sums, multisets)

    def is_consistent(self) -> bool:
        counts_ok = all(0 <= c <= self.rows for c in self.counts)
        return self.rows >= 0 and counts_ok and all(c > 0 for m in self.multisets for c in m.values())


def unfiltered(call: AggregateCall) -> AggregateCall:
    """``call`` without its FILTER clause: the same aggregate of the argument where the condition is true,
    NULL elsewhere (``count(*)`` becoming a count of such an argument)."""
    if call.filter is None:
        return call
    function, arg = call.function, call.arg
    if function is AggregateFunction.COUNT_ROWS:
        function, arg = AggregateFunction.COUNT, Literal(1, ColumnType.INT)
    assert arg is not None
    guarded = Case(((call.filter, arg),), Literal(None, arg.type), arg.type, True)
    return AggregateCall(function, guarded, call.type)


class AggregateStage:
    """Turns a filtered batch of signed rows into the changes of the groups it touches."""

    def __init__(self, query: Query, *, global_row: bool = True) -> None:
        """``global_row``: whether this stage maintains a global aggregate's one row (false in a Spark
        task of a partition other than the row's, :class:`~mvlog.views.share.OperatorShare`)."""
        self.query = query
        self.global_row = global_row
        self.group_types = [g.type for g in query.group_by]
        self.calls = tuple(unfiltered(call) for call in query.aggregates)
        extremes: list[Expr] = []
        self.multiset_of: dict[int, int] = {}  # aggregate call index -> multiset index
        for index, call in enumerate(self.calls):
            if call.function in _MULTISET:
                assert call.arg is not None
                if call.arg not in extremes:
                    extremes.append(call.arg)
                self.multiset_of[index] = extremes.index(call.arg)
        self.extremes = extremes
        self.sum_zero = [0.0 if call.function in _SUMMED and call.arg is not None
                         and call.arg.type is ColumnType.FLOAT else 0 for call in self.calls]

    @property
    def is_global(self) -> bool:
        return not self.query.group_by

    def empty(self) -> GroupState:
        return GroupState(0, [0] * len(self.calls), list(self.sum_zero), [{} for _ in self.extremes])

    def apply(self, batch: pa.Table, state: StateReader, writes: dict[bytes, bytes | None]) -> list[Change]:
        deltas = self._deltas(batch)
        if self.is_global and not self.global_row:
            if deltas:
                raise ValueError("input rows of a global aggregate reached an operator that does not maintain "
                                 "its row: they belong to the row's partition")
            return []
        if self.is_global:
            deltas.setdefault((), self.empty())
        keys = {group: encode_key(GROUP_TAG, group, self.group_types) for group in deltas}
        stored = state.get_many(list(keys.values()))
        before: list[tuple[Key, GroupState]] = []
        after: list[tuple[Key, GroupState]] = []
        for group, delta in deltas.items():
            raw = stored.get(keys[group])
            old = self._decode(raw) if raw is not None else None
            new = (old or self.empty()).add(delta)
            if not new.is_consistent() or (new.rows == 0 and not self.is_global and any(new.counts)):
                raise InconsistentChanges(f"group {group!r}: state {old!r} plus this epoch's delta {delta!r} "
                                          "gives negative or impossible counts")
            if old is not None:
                before.append((group, old))
            keep = self.is_global or new.rows > 0
            if keep:
                after.append((group, new))
            if keep and (old is None or new != old):
                writes[keys[group]] = self._encode(new)
            elif not keep and old is not None:
                writes[keys[group]] = None
        old_rows = dict(zip([g for g, _ in before], self._rows(before), strict=True))
        new_rows = dict(zip([g for g, _ in after], self._rows(after), strict=True))
        changes = []
        for group in deltas:
            # The key is the group: the plan makes the GROUP BY values the key columns, in order.
            change = change_between(group, old_rows.get(group), new_rows.get(group))
            if change is not None:
                changes.append(change)
        return changes

    # -- the epoch's deltas, vectorised -------------------------------------------------------------

    def _deltas(self, batch: pa.Table) -> dict[Key, GroupState]:
        if batch.num_rows == 0:
            return {}
        weight = batch.column(WEIGHT)
        groups = {group_field(i): evaluate(g, batch) for i, g in enumerate(self.query.group_by)}
        group_names = list(groups)
        columns: dict[str, pa.Array] = dict(groups)
        columns[WEIGHT] = weight
        sums: list[tuple[str, str]] = [(WEIGHT, "sum")]
        for index, call in enumerate(self.calls):
            if call.arg is None or call.function not in _COUNTED:
                continue
            arg = evaluate(call.arg, batch)
            columns[f"c{index}"] = pc.if_else(pc.is_valid(arg), weight, 0)
            sums.append((f"c{index}", "sum"))
            if call.function in _SUMMED:
                signed = pc.multiply_checked(pc.cast(weight, arg.type), arg)
                columns[f"s{index}"] = pc.fill_null(signed, pa.scalar(0, arg.type))
                sums.append((f"s{index}", "sum"))
        totals = pa.table(columns).group_by(group_names).aggregate(sums)
        deltas: dict[Key, GroupState] = {}
        group_values = [totals.column(name).to_pylist() for name in group_names]
        rows = totals.column(f"{WEIGHT}_sum").to_pylist()
        counts = {i: totals.column(f"c{i}_sum").to_pylist() for i in range(len(self.calls))
                  if f"c{i}" in columns}
        sum_columns = {i: totals.column(f"s{i}_sum").to_pylist() for i in range(len(self.calls))
                       if f"s{i}" in columns}
        for position in range(totals.num_rows):
            delta = self.empty()
            delta.rows = rows[position]
            for i, values in counts.items():
                delta.counts[i] = values[position]
            for i, values in sum_columns.items():
                delta.sums[i] = values[position]
            self._merge(deltas, self._group_key([v[position] for v in group_values]), delta)
        for index, arg in enumerate(self.extremes):
            self._extreme_deltas(deltas, index, evaluate(arg, batch), groups, weight)
        return deltas

    def _extreme_deltas(self, deltas: dict[Key, GroupState], index: int, values: pa.Array,
                        groups: dict[str, pa.Array], weight: pa.Array) -> None:
        table = pa.table({**groups, "__value": values, WEIGHT: weight}).filter(pc.is_valid(values))
        totals = table.group_by([*groups, "__value"]).aggregate([(WEIGHT, "sum")])
        group_values = [totals.column(name).to_pylist() for name in groups]
        kind = self.extremes[index].type
        values = totals.column("__value").to_pylist()
        counts = totals.column(f"{WEIGHT}_sum").to_pylist()
        for value, count, *group in zip(values, counts, *group_values, strict=True):
            if count:
                multiset = deltas[self._group_key(group)].multisets[index]
                value = key_value(value, kind)
                multiset[value] = multiset.get(value, 0) + count

    def _group_key(self, values: Sequence[Any]) -> Key:
        return tuple(key_value(v, k) for v, k in zip(values, self.group_types, strict=True))

    def _merge(self, deltas: dict[Key, GroupState], group: Key, delta: GroupState) -> None:
        """Arrow may split groups Spark merges (``-0.0`` and ``0.0``); their deltas add up."""
        deltas[group] = deltas[group].add(delta) if group in deltas else delta

    # -- final rows, vectorised -------------------------------------------------------------------

    def _rows(self, groups: list[tuple[Key, GroupState]]) -> list[Row | None]:
        if not groups:
            return []
        columns: dict[str, pa.Array] = {}
        for i, kind in enumerate(self.group_types):
            columns[group_field(i)] = pa.array([g[i] for g, _ in groups], arrow_type(kind))
        for i, call in enumerate(self.calls):
            results = [self._result(i, s) for _, s in groups]
            columns[aggregate_field(i)] = pa.array(results, arrow_type(call.type))
        table = pa.table(columns)
        outputs = [(o.name, evaluate(o.expr, table).to_pylist()) for o in self.query.outputs]
        rows: list[Row | None] = [{name: values[position] for name, values in outputs}
                                  for position in range(len(groups))]
        if self.query.having is not None:  # a group HAVING is not true for has no row (NULL: not true)
            passed = pc.fill_null(evaluate(self.query.having, table), False).to_pylist()
            rows = [row if keep else None for row, keep in zip(rows, passed, strict=True)]
        return rows

    def _result(self, index: int, state: GroupState) -> Any:
        call = self.calls[index]
        match call.function:
            case AggregateFunction.COUNT_ROWS:
                return state.rows
            case AggregateFunction.COUNT:
                return state.counts[index]
            case AggregateFunction.SUM:
                return state.sums[index] if state.counts[index] else None
            case AggregateFunction.AVG:
                return state.sums[index] / state.counts[index] if state.counts[index] else None
            case AggregateFunction.MIN:
                multiset = state.multisets[self.multiset_of[index]]
                return min(multiset) if multiset else None
            case AggregateFunction.MAX:
                multiset = state.multisets[self.multiset_of[index]]
                return max(multiset) if multiset else None
            case AggregateFunction.COUNT_DISTINCT:
                return len(state.multisets[self.multiset_of[index]])
            case AggregateFunction.SUM_DISTINCT:
                multiset = state.multisets[self.multiset_of[index]]
                return sum(sorted(multiset)) if multiset else None
            case AggregateFunction.AVG_DISTINCT:
                multiset = state.multisets[self.multiset_of[index]]
                return sum(sorted(multiset)) / len(multiset) if multiset else None
        raise AssertionError(call.function)

    # -- seeding from a full computation (snapshot backfill) ------------------------------------------

    def seeded(self, group_values: Sequence[Any], rows: int, counts: Sequence[int | None], sums: Sequence[Any],
               multisets: Sequence[Sequence[tuple[Any, int]] | None]) -> tuple[Key, GroupState]:
        """A group and its state from totals computed elsewhere (Spark SQL over a snapshot).

        ``counts``/``sums`` are per aggregate call (None where the call keeps none, or SQL's NULL sum over
        no values); ``multisets`` are per distinct min/max argument, as (value, count) pairs.
        """
        state = self.empty()
        state.rows = rows
        for index, call in enumerate(self.calls):
            if call.function in _COUNTED and call.arg is not None:
                state.counts[index] = counts[index] or 0
            if call.function in _SUMMED and sums[index] is not None:
                state.sums[index] = sums[index]
        for index, pairs in enumerate(multisets):
            kind = self.extremes[index].type
            multiset = state.multisets[index]
            for value, count in pairs or ():
                folded = key_value(value, kind)
                multiset[folded] = multiset.get(folded, 0) + count
        group = self._group_key(group_values)
        if not state.is_consistent():
            raise InconsistentChanges(f"group {group!r}: seeded state {state!r} has impossible counts")
        return group, state

    def rows_of(self, groups: list[tuple[Key, GroupState]]) -> list[Row]:
        """The view rows of groups in these states: what the operator emits for them (none for a group
        HAVING filters out, whose state is kept all the same)."""
        return [row for row in self._rows(groups) if row is not None]

    def state_entry(self, group: Key, state: GroupState) -> tuple[bytes, bytes]:
        """The operator-state key and value of a group, as :meth:`apply` stores them."""
        return encode_key(GROUP_TAG, group, self.group_types), self._encode(state)

    # -- state encoding -----------------------------------------------------------------------------

    def _encode(self, state: GroupState) -> bytes:
        multisets = [[[encode_value(v, arg.type), c] for v, c in sorted(m.items())]
                     for m, arg in zip(state.multisets, self.extremes, strict=True)]
        encoded: bytes = dumps({"n": state.rows, "c": state.counts, "s": state.sums, "m": multisets})
        return encoded

    def _decode(self, data: bytes) -> GroupState:
        raw = loads(data)
        multisets = [{decode_value(v, arg.type): c for v, c in entries}
                     for entries, arg in zip(raw["m"], self.extremes, strict=True)]
        return GroupState(raw["n"], list(raw["c"]), list(raw["s"]), multisets)
