"""An epoch's changes in columns: the one shape change data has from the source to the commit.

A view changes as many rows per epoch as its upstream; building a ``Change`` with two row dicts for each
of them cost more than computing the view, and carrying two shapes (``Change`` lists and Arrow signed
rows) doubled every step after the source. A :class:`ChangeBatch` holds an epoch's changes as the
changelog's Debezium envelope does, column-wise: one op per change and the before and after images as
two Arrow tables (row ``i`` of each is change ``i``'s). The operator takes one per upstream and returns
one for the view, the changelog writer encodes it column by column, and a view's output batch is
exactly what a view built on it reads. ``Change`` lists exist only at the edges (the Python API, the
changelog reader, tests): :meth:`ChangeBatch.from_changes` and :meth:`ChangeBatch.to_changes`.

An upstream's batch may change a key more than once (a changelog written outside mvlog); the operator
nets those. A view's output batch changes each key at most once (:func:`consolidate_signed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.changes import Change, Op
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.views.errors import InconsistentChanges
from mvlog.views.evaluate import arrow_type

_OPS = {op.value: op for op in Op}  # Enum lookup by value is slow: once per op code
_WITH_BEFORE = pa.array([Op.UPDATE.value, Op.DELETE.value])
_WITH_AFTER = pa.array([Op.CREATE.value, Op.UPDATE.value, Op.READ.value])
_NO_POSITION = pa.scalar(None, pa.uint64())


@dataclass(frozen=True)
class ChangeBatch:
    """Changes of one epoch to the rows of ``schema``, column-wise."""

    schema: RowSchema
    ops: pa.Array  # string: per change its Op value (c, u, d, or r for a snapshot read)
    before: pa.Table  # the schema's columns; row i: change i's row before (a null row for c and r)
    after: pa.Table  # row i: change i's row after (a null row for d)
    _keys: list[Key] | None = field(default=None, compare=False, repr=False)  # computed on first use

    def __len__(self) -> int:
        return len(self.ops)

    @classmethod
    def empty(cls, schema: RowSchema) -> ChangeBatch:
        return cls.from_changes(schema, [])

    @classmethod
    def from_changes(cls, schema: RowSchema, changes: Sequence[Change]) -> ChangeBatch:
        """The edge adapter from the row form (a missing nullable column is NULL, an int in a float
        column is widened, as ``RowSchema.normalize`` does)."""
        target = _arrow_schema(schema)
        return cls(schema, pa.array([c.op.value for c in changes], pa.string()),
                   pa.Table.from_pylist([c.before or {} for c in changes], target),
                   pa.Table.from_pylist([c.after or {} for c in changes], target), [tuple(c.key) for c in changes])

    @classmethod
    def from_signed(cls, schema: RowSchema, rows: pa.Table, weights: pa.Array | pa.ChunkedArray,
                    change_ids: pa.Array | pa.ChunkedArray) -> ChangeBatch:
        """The changes of signed rows as the ``mvlog`` data source delivers them: per change, the
        retraction (-1) of its row before, then the assertion (+1) of its row after, next to each other
        and sharing ``change_ids`` (its partition and offset). Paired without leaving Arrow.

        Two rows of one change that are not adjacent become a delete and a create of the same key,
        which the operator nets back into the update: only the fast path depends on the order."""
        count = len(rows)
        if count == 0:
            return cls.empty(schema)
        target = _arrow_schema(schema)
        images = pa.table([rows.column(f.name).cast(f.type) for f in target], schema=target)
        ids = _array(change_ids)
        retraction = pc.equal(_array(weights), -1)
        # follows[i]: row i + 1 is the assertion of the change whose retraction is row i
        follows = pc.and_(pc.and_(pc.equal(ids.slice(1), ids.slice(0, count - 1)), retraction.slice(0, count - 1)),
                          pc.invert(retraction.slice(1)))
        starts = pc.indices_nonzero(pc.invert(pa.concat_arrays([pa.array([False]), follows])))
        opens = pc.take(retraction, starts)  # the change has a row before
        paired = pc.take(pa.concat_arrays([follows, pa.array([False])]), starts)  # ... and a row after
        before_at = pc.if_else(opens, starts, _NO_POSITION)
        after_at = pc.if_else(opens, pc.if_else(paired, pc.add(starts, 1), _NO_POSITION), starts)
        ops = pc.if_else(opens, pc.if_else(paired, Op.UPDATE.value, Op.DELETE.value), Op.CREATE.value)
        return cls(schema, ops, images.take(before_at), images.take(after_at))

    @property
    def has_before(self) -> pa.Array:
        """Per change: whether it has a row before (an update or a delete)."""
        return pc.is_in(self.ops, value_set=_WITH_BEFORE)

    @property
    def has_after(self) -> pa.Array:
        """Per change: whether it has a row after (a create, an update or a snapshot read)."""
        return pc.is_in(self.ops, value_set=_WITH_AFTER)

    @property
    def keys(self) -> list[Key]:
        """Each change's key, as Python values (Redis's key-order index needs them): read from the key
        columns of its row after, or before for a delete."""
        if self._keys is None:
            has_after = self.has_after
            columns = [pc.if_else(has_after, self.after.column(name), self.before.column(name)).to_pylist()
                       for name in self.schema.primary_key]
            keys: list[Key] = list(zip(*columns, strict=True)) if columns else [()] * len(self)
            object.__setattr__(self, "_keys", keys)
            return keys
        return self._keys

    def where(self, keep: Sequence[bool]) -> ChangeBatch:
        """The changes whose ``keep`` is true, in order."""
        mask = pa.array(keep, pa.bool_())
        keys = None if self._keys is None else [key for key, kept in zip(self._keys, keep, strict=True) if kept]
        return ChangeBatch(self.schema, self.ops.filter(mask), self.before.filter(mask), self.after.filter(mask),
                           keys)

    def one_change_per_key(self) -> bool:
        """Whether no key changes twice (every mvlog writer's batches; then each key has at most one
        signed row per sign, and the operator needs no netting)."""
        if len(self) <= 1:
            return True
        pk = self.schema.primary_key
        if not pk:
            return False
        has_after = self.has_after
        keys = pa.table({name: pc.if_else(has_after, self.after.column(name), self.before.column(name))
                         for name in pk})
        distinct = pc.count_distinct(keys.column(0)).as_py() if len(pk) == 1 else len(keys.group_by(pk).aggregate([]))
        return bool(distinct == len(self))

    def signed(self) -> tuple[pa.Table, pa.Array]:
        """The changes as signed rows: per change, the retraction (-1) of its row before, then the
        assertion (+1) of its row after; the rows and their weights (int64), without leaving Arrow."""
        count = len(self)
        both = pa.concat_tables([self.before, self.after])  # row i: change i's before; count + i: its after
        present = pa.concat_arrays([self.has_before, self.has_after])
        slots = pc.subtract(pc.cumulative_sum(pa.nulls(2 * count, pa.int64()).fill_null(1)), 1)
        is_after = pc.bit_wise_and(slots, 1)  # slot 2i: change i's before, 2i + 1: its after
        positions = pc.add(pc.divide(slots, 2), pc.multiply(is_after, count))
        positions = positions.filter(pc.take(present, positions))
        weights = pc.subtract(pc.multiply(pc.greater_equal(positions, count).cast(pa.int64()), 2), 1)
        return both.take(positions), weights

    def to_changes(self) -> list[Change]:
        """The edge adapter to the row form."""
        return [Change(op, key, before, after)
                for key, (op, before, after) in zip(self.keys, self.change_rows(), strict=True)]

    def change_rows(self) -> list[tuple[Op, Row | None, Row | None]]:
        """Each change's op and its rows before and after (None where the op has none) as Python rows:
        :meth:`to_changes` without making the ``Change`` objects, for a caller that only reads the rows."""
        befores, afters = self.before.to_pylist(), self.after.to_pylist()
        rows: list[tuple[Op, Row | None, Row | None]] = []
        for code, before, after in zip(self.ops.to_pylist(), befores, afters, strict=True):
            op = _OPS[code]
            rows.append((op, before if op in (Op.UPDATE, Op.DELETE) else None, None if op is Op.DELETE else after))
        return rows


def _arrow_schema(schema: RowSchema) -> pa.Schema:
    return pa.schema([(c.name, arrow_type(c.type)) for c in schema.columns])


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


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
    ops: list[str] = []
    kept_keys: list[Key] = []
    keep: list[bool] = []
    for key, b, a, unchanged in zip(order, before_at, after_at, same, strict=True):
        kept = not (b is not None and a is not None and unchanged)
        keep.append(kept)
        if kept:
            ops.append(_CREATE if b is None else _DELETE if a is None else _UPDATE)
            kept_keys.append(key)
    if len(kept_keys) < len(order):
        mask = pa.array(keep, pa.bool_())
        before, after = before.filter(mask), after.filter(mask)
    names = list(schema.names)
    return ChangeBatch(schema, pa.array(ops, pa.string()), before.select(names), after.select(names), kept_keys)


_CREATE, _UPDATE, _DELETE = Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value


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
