"""Signed rows: an epoch's changes as retractions (-1) and assertions (+1), netted per key.

Input: an upstream epoch may change a key several times; only the row before the epoch and the row
after it matter, so each key's signed rows are summed and what cancels is dropped. Output: the
operator produces signed view rows from several paths (e.g. both sides of a join), which are
consolidated the same way into at most one ``Change`` per view key. Both directions check that the
sums are a proper before/after pair, so a corrupt upstream fails loudly instead of corrupting views.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mvlog.changes import Change, change_between
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.views.errors import InconsistentChanges

Values = tuple[Any, ...]  # a row's values in schema column order
SignedRow = tuple[int, Values]


def row_values(schema: RowSchema, row: Mapping[str, Any]) -> Values:
    """A row as a hashable tuple in column order (missing nullable columns NULL, ints in float columns
    widened), so equal rows compare equal however they were written."""
    values = schema.normalize(row).values()
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in values)


def net_changes(changes: Sequence[Change], schema: RowSchema) -> list[SignedRow]:
    """Per key: the retraction of its row before the epoch and the assertion of its row after it."""
    per_key: dict[Key, Counter[Values]] = {}
    for change in changes:
        counter = per_key.setdefault(tuple(change.key), Counter())
        for weight, row in change.signed_rows():
            counter[row_values(schema, row)] += weight
    signed: list[SignedRow] = []
    for key, counter in per_key.items():
        before, after = _before_after(key, counter, "upstream")
        if before is not None:
            signed.append((-1, before))
        if after is not None:
            signed.append((1, after))
    return signed


def net_rows_changed_once(rows: Iterable[tuple[Row | None, Row | None]], schema: RowSchema) -> list[SignedRow]:
    """:func:`net_changes` of changes that touch each key once (``rows``: each change's row before and after
    it): its two rows as they are, in the same order, and nothing for a change that leaves its row as it
    was. Nothing to sum per key, so no ``Change`` and no counter per key: a join nets every epoch."""
    signed: list[SignedRow] = []
    for before, after in rows:
        old = None if before is None else row_values(schema, before)
        new = None if after is None else row_values(schema, after)
        if old == new:
            continue
        if old is not None:
            signed.append((-1, old))
        if new is not None:
            signed.append((1, new))
    return signed


def consolidate(rows: Iterable[tuple[int, Row]], schema: RowSchema) -> list[Change]:
    """Signed view rows -> one change per view key (keys in order of first appearance)."""
    per_key: dict[Key, Counter[Values]] = {}
    names = schema.names
    for weight, row in rows:
        per_key.setdefault(schema.key_of(row), Counter())[tuple(row[n] for n in names)] += weight
    changes: list[Change] = []
    for key, counter in per_key.items():
        before, after = _before_after(key, counter, "view")
        change = change_between(key, _row(names, before), _row(names, after))
        if change is not None:
            changes.append(change)
    return changes


def _before_after(key: Key, counter: Counter[Values], what: str) -> tuple[Values | None, Values | None]:
    before = [values for values, weight in counter.items() if weight < 0]
    after = [values for values, weight in counter.items() if weight > 0]
    if len(before) > 1 or len(after) > 1 or any(abs(w) > 1 for w in counter.values()):
        sums = {values: weight for values, weight in counter.items() if weight}
        raise InconsistentChanges(f"{what} key {key!r}: the epoch's changes do not sum to one row before and "
                                  f"one row after (row -> net count: {sums!r}); the upstream changelog or "
                                  "the operator state is inconsistent")
    return (before[0] if before else None), (after[0] if after else None)


def _row(names: Sequence[str], values: Values | None) -> Row | None:
    return None if values is None else dict(zip(names, values, strict=True))
