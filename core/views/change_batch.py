"""An epoch's view changes with their row images held column-wise, for the Spark consumer's Arrow path.

A filter/project view changes as many rows per epoch as its upstream; building a ``Change`` with two
row dicts for each of them cost more than computing the view. A :class:`ChangeBatch` keeps the before
and after images as Arrow tables (row ``i`` of each is change ``i``'s), so the changes can be encoded for
the changelog and Redis column by column. Only the keys are Python values (Redis's key-order index
needs them). :meth:`ChangeBatch.to_changes` gives the same changes as ``Change`` objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.changes import Change, Op
from mvlog.row_schema import Key, RowSchema
from mvlog.views.errors import InconsistentChanges
from mvlog.views.evaluate import arrow_type


@dataclass(frozen=True)
class ChangeBatch:
    """Changes of one epoch, at most one per view key."""

    schema: RowSchema  # the view's rows
    ops: list[Op]  # per change: CREATE, UPDATE or DELETE
    keys: list[Key]
    before: pa.Table  # the view's columns; row i: change i's row before (all NULL for a CREATE)
    after: pa.Table  # row i: change i's row after (all NULL for a DELETE)

    def __len__(self) -> int:
        return len(self.ops)

    @classmethod
    def from_changes(cls, schema: RowSchema, changes: Sequence[Change]) -> ChangeBatch:
        target = pa.schema([(c.name, arrow_type(c.type)) for c in schema.columns])
        return cls(schema, [c.op for c in changes], [tuple(c.key) for c in changes],
                   pa.Table.from_pylist([c.before or {} for c in changes], target),
                   pa.Table.from_pylist([c.after or {} for c in changes], target))

    def to_changes(self) -> list[Change]:
        befores, afters = self.before.to_pylist(), self.after.to_pylist()
        return [Change(op, key, None if op is Op.CREATE else before, None if op is Op.DELETE else after)
                for op, key, before, after in zip(self.ops, self.keys, befores, afters, strict=True)]


def consolidate_signed(rows: pa.Table, weights: Sequence[int], schema: RowSchema) -> ChangeBatch:
    """Signed view rows (the view's columns; weight -1: a row before the epoch, +1: after) with at most
    one retraction and one assertion per view key -> one change per key, in order of first appearance.

    What :func:`mvlog.views.deltas.consolidate` does for a filter/project view fed one change per
    upstream key (its key is the upstream's), without turning the rows into Python objects.
    """
    columns = [rows.column(name).to_pylist() for name in schema.primary_key]
    keys: list[Key] = list(zip(*columns, strict=True)) if columns else [()] * len(rows)
    retracted: dict[Key, int] = {}
    asserted: dict[Key, int] = {}
    for position, (weight, key) in enumerate(zip(weights, keys, strict=True)):
        side = retracted if weight < 0 else asserted
        if key in side or weight not in (-1, 1):
            raise InconsistentChanges(f"view key {key!r}: more than one row {'before' if weight < 0 else 'after'} "
                                      "the epoch; the upstream changelog or the operator state is inconsistent")
        side[key] = position
    order = list(dict.fromkeys(keys))
    before_at = [retracted.get(key) for key in order]
    after_at = [asserted.get(key) for key in order]
    before = rows.take(pa.array(before_at, pa.int64()))
    after = rows.take(pa.array(after_at, pa.int64()))
    same = _same_rows(before, after, schema.names)  # an update to an equal row changes nothing
    ops: list[Op] = []
    kept_keys: list[Key] = []
    keep: list[bool] = []
    for key, b, a, unchanged in zip(order, before_at, after_at, same, strict=True):
        kept = not (b is not None and a is not None and unchanged)
        keep.append(kept)
        if kept:
            ops.append(Op.CREATE if b is None else Op.DELETE if a is None else Op.UPDATE)
            kept_keys.append(key)
    if len(kept_keys) < len(order):
        mask = pa.array(keep, pa.bool_())
        before, after = before.filter(mask), after.filter(mask)
    names = list(schema.names)
    return ChangeBatch(schema, ops, kept_keys, before.select(names), after.select(names))


def _same_rows(left: pa.Table, right: pa.Table, names: Sequence[str]) -> list[bool]:
    """Per row: whether every column is equal (NULL equal to NULL, as Python's None == None)."""
    same: pa.Array | None = None
    for name in names:
        a, b = left.column(name), right.column(name)
        equal = pc.or_kleene(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
        same = equal if same is None else pc.and_(same, equal)
    if same is None:
        return [True] * len(left)
    result: list[bool] = same.to_pylist()
    return result
