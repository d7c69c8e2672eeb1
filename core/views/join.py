"""Incremental inner equi-join: each side's rows indexed by join key, joined by the delta rule.

    Δ(A ⋈ B) = ΔA ⋈ B_old + A_new ⋈ ΔB

Each side keeps its current rows in state, one bucket per join key (``j0[...]``/``j1[...]``, see
``state_codec``), so an epoch reads only the buckets of the join keys its changes touch. A row whose
join key has a NULL never matches (``NULL = x`` is not true) and is not stored. The joined signed rows
go on to the filter, projection or aggregation like the rows of a single source.
"""

from __future__ import annotations

from collections.abc import Sequence

from mvlog.row_schema import ColumnType, Key
from mvlog.views.batch import JoinedRow
from mvlog.views.deltas import SignedRow, Values
from mvlog.views.errors import InconsistentChanges
from mvlog.views.query import Query
from mvlog.views.state import StateReader
from mvlog.views.state_codec import JOIN_TAGS, decode_value, dumps, encode_key, encode_value, key_value, loads

Bucket = dict[Key, Values]  # the rows of one side with one join key, by their primary key


class JoinStage:
    def __init__(self, query: Query) -> None:
        self.query = query
        self.key_types: list[ColumnType | None] = [c.type for c in query.join]
        self.key_indexes: list[list[int]] = []
        self.pk_indexes: list[list[int]] = []
        self.column_types: list[list[ColumnType]] = []
        for side, source in enumerate(query.sources):
            names = source.schema.names
            columns = [c.left if side == 0 else c.right for c in query.join]
            self.key_indexes.append([names.index(c.column) for c in columns])
            self.pk_indexes.append([names.index(k) for k in source.schema.primary_key])
            self.column_types.append([c.type for c in source.schema.columns])

    def apply(self, deltas: Sequence[list[SignedRow]], state: StateReader,
              writes: dict[bytes, bytes | None]) -> list[JoinedRow]:
        keyed = [[(weight, self._join_key(side, values), values) for weight, values in deltas[side]]
                 for side in (0, 1)]
        touched = list(dict.fromkeys(k for rows in keyed for _, k, _ in rows if k is not None))
        state_keys = {(side, k): encode_key(JOIN_TAGS[side], k, self.key_types)
                      for side in (0, 1) for k in touched}
        stored = state.get_many(list(state_keys.values()))
        buckets: list[dict[Key, Bucket]] = [{}, {}]
        for (side, k), state_key in state_keys.items():
            raw = stored.get(state_key)
            buckets[side][k] = self._decode(side, raw) if raw is not None else {}
        joined: list[JoinedRow] = []
        for weight, left_key, left in keyed[0]:  # ΔA ⋈ B_old
            if left_key is not None:
                joined.extend((weight, (left, right)) for right in buckets[1][left_key].values())
        self._apply(0, keyed[0], buckets[0])
        for weight, right_key, right in keyed[1]:  # A_new ⋈ ΔB
            if right_key is not None:
                joined.extend((weight, (left, right)) for left in buckets[0][right_key].values())
        self._apply(1, keyed[1], buckets[1])
        changed = [{k for _, k, _ in rows if k is not None} for rows in keyed]
        for (side, k), state_key in state_keys.items():
            if k in changed[side]:
                bucket = buckets[side][k]
                writes[state_key] = self._encode(side, bucket) if bucket else None
        return joined

    def _join_key(self, side: int, values: Values) -> Key | None:
        key = tuple(key_value(values[i], kind) for i, kind in zip(self.key_indexes[side], self.key_types,
                                                                   strict=True))
        return None if any(v is None for v in key) else key

    def _apply(self, side: int, rows: list[tuple[int, Key | None, Values]],
               buckets: dict[Key, Bucket]) -> None:
        """Retractions first, then assertions, so an update that keeps its join key stays in place."""
        for weight, k, values in sorted(rows, key=lambda row: row[0]):
            if k is None:
                continue
            pk = tuple(values[i] for i in self.pk_indexes[side])
            bucket = buckets[k]
            if weight < 0:
                if bucket.pop(pk, None) != values:
                    raise InconsistentChanges(f"join side {side}: retracted row {values!r} is not in the "
                                              "operator state")
            else:
                bucket[pk] = values

    def _encode(self, side: int, bucket: Bucket) -> bytes:
        types = self.column_types[side]
        rows = [[encode_value(v, t) for v, t in zip(values, types, strict=True)]
                for _, values in sorted(bucket.items(), key=lambda item: repr(item[0]))]
        encoded: bytes = dumps(rows)
        return encoded

    def _decode(self, side: int, data: bytes) -> Bucket:
        types = self.column_types[side]
        bucket: Bucket = {}
        for encoded in loads(data):
            values = tuple(decode_value(v, t) for v, t in zip(encoded, types, strict=True))
            bucket[tuple(values[i] for i in self.pk_indexes[side])] = values
        return bucket
