"""Incremental joins: a left-deep chain of binary equi-joins, inner or outer, with residual conditions.

``FROM s0 JOIN s1 ON .. JOIN s2 ON ..`` is ``(s0 ⋈ s1) ⋈ s2``: step ``i`` joins the result of sources
``0..i`` (its *left* input, a row of each of those sources, or None where an outer join null-extended
one) with source ``i + 1`` (its *right* input). Each step keeps both inputs in state, one bucket per join
key, so an epoch reads only the buckets of the join keys its changes touch. The pairs a step matches
follow the delta rule

    Δ(A ⋈ B) = ΔA ⋈ B_old + A_new ⋈ ΔB

restricted to the pairs the residual condition (the ON conjuncts that are not column equalities) holds
for. An outer join also keeps the rows of its preserved side(s) that match nothing, null-extended: such
a row is retracted when its first match arrives and asserted again when its last match leaves. Without
a residual, "matches nothing" is "the other side's bucket is empty", so only a bucket turning empty or
non-empty touches rows beyond the epoch's changes; with one, the rows whose matches can have changed
(those changed, and those a changed row of the other side matches) are tested against the bucket.

A semi join (``IN``/``EXISTS``) outputs its left rows that have a match, an anti join (``NOT EXISTS``)
those without: the latter are the rows an outer join would null-extend, the former all rows but those.

A row whose join key has a NULL never matches (``NULL = x`` is not true) and is not stored; on a
preserved side it is null-extended straight away. The output of a step that is not the last is netted
and fed to the next; the output of the last goes on to the filter, projection or aggregation like the
rows of a single source.

State (see ``state_codec``): step 0 keeps ``j0[k]`` (rows of source 0) and ``j1[k]`` (rows of source 1);
step ``i >= 1`` keeps ``j<i>.0[k]`` (rows of its left input: per source the row or null) and ``j<i>.1[k]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from operator import itemgetter
from typing import cast

from mvlog.row_schema import ColumnType, Key
from mvlog.views.batch import JoinedRow, build_batch
from mvlog.views.deltas import SignedRow, Values
from mvlog.views.errors import InconsistentChanges
from mvlog.views.evaluate import evaluate
from mvlog.views.expr import ColumnRef, Expr, walk
from mvlog.views.query import JoinKind, Query
from mvlog.views.state import StateReader
from mvlog.views.state_codec import JOIN_TAGS, decode_value, dumps, encode_key, encode_value, key_value, loads

Combo = tuple[Values | None, ...]  # a row of each of some consecutive sources; None: null-extended
Identity = tuple[Key | None, ...]  # the primary key of each of them
Bucket = dict[Identity, Combo]  # the rows of one input with one join key
Signed = tuple[int, Combo]


class JoinStage:
    """All the join steps of a query, run in order on one epoch's netted changes of every source."""

    def __init__(self, query: Query) -> None:
        self.steps = [_Step(query, index) for index in range(len(query.joins))]

    def apply(self, deltas: Sequence[list[SignedRow]], state: StateReader,
              writes: dict[bytes, bytes | None]) -> list[JoinedRow]:
        """The signed joined rows of the epoch, given each source's netted signed rows (by side)."""
        left: list[Signed] = [(weight, (values,)) for weight, values in deltas[0]]
        for step in self.steps:
            right: list[Signed] = [(weight, (values,)) for weight, values in deltas[step.index + 1]]
            joined = step.apply(left, right, state, writes)
            left = joined if step is self.steps[-1] else _net(joined)
        return left


def _net(rows: Iterable[Signed]) -> list[Signed]:
    """Signed rows summed per row, what cancels dropped (an intermediate result a later step stores)."""
    counts: Counter[Combo] = Counter()
    for weight, combo in rows:
        counts[combo] += weight
    if any(abs(weight) > 1 for weight in counts.values()):
        raise InconsistentChanges("a join's intermediate result has a row more than once; the upstream "
                                  "changelog or the operator state is inconsistent")
    return [(weight, combo) for combo, weight in counts.items() if weight]


class _Step:
    """Step ``index``: the result of sources ``0..index`` joined with source ``index + 1``."""

    def __init__(self, query: Query, index: int) -> None:
        self.query = query
        self.index = index
        join = query.joins[index]
        self.kind = join.kind
        # Null-extended rows output: an outer join's, and an anti join's left rows without a match.
        self.keeps = (join.kind.keeps_left or join.kind is JoinKind.ANTI, join.kind.keeps_right)
        # Rows whose having a match is followed: those, and a semi join's (its rows are those matched).
        self.tracks = (self.keeps[0] or join.kind.filters, self.keeps[1])
        self.key_types: list[ColumnType | None] = [c.type for c in join.on]
        self.sides = (tuple(range(index + 1)), (index + 1,))  # the sources of each input
        self.tags = JOIN_TAGS if index == 0 else (b"j%d.0" % index, b"j%d.1" % index)

        def locate(ref: ColumnRef, first: int) -> tuple[int, int]:
            return ref.side - first, query.sources[ref.side].schema.names.index(ref.column)

        self.key_at = ([locate(c.left, 0) for c in join.on], [locate(c.right, index + 1) for c in join.on])
        self.pk_indexes = [[s.schema.names.index(k) for k in s.schema.primary_key] for s in query.sources]
        self.column_types = [[c.type for c in s.schema.columns] for s in query.sources]
        self.residual = join.residual
        # A source's primary key out of its row, in one C call; whether its values are stored as they are
        # (no bytes or float column: encode_value and decode_value would hand back every value unchanged).
        # A bucket is decoded whole each time a change touches its join key, so this is the join's inner loop.
        self._pk_of = [_tuple_getter(indexes) for indexes in self.pk_indexes]
        self._stored_as_is = [not any(t in _CONVERTED for t in types) for types in self.column_types]

    # -- one epoch ---------------------------------------------------------------------------------------

    def apply(self, left: list[Signed], right: list[Signed], state: StateReader,
              writes: dict[bytes, bytes | None]) -> list[Signed]:
        keyed = [[(weight, self._join_key(side, combo), combo) for weight, combo in rows]
                 for side, rows in enumerate((left, right))]
        touched = list(dict.fromkeys(k for rows in keyed for _, k, _ in rows if k is not None))
        state_keys = {(side, k): encode_key(self.tags[side], k, self.key_types) for side in (0, 1) for k in touched}
        stored = state.get_many(list(state_keys.values()))
        old: list[dict[Key, Bucket]] = [{}, {}]
        for (side, k), state_key in state_keys.items():
            raw = stored.get(state_key)
            old[side][k] = self._decode(side, raw) if raw is not None else {}
        new = [{k: dict(bucket) for k, bucket in buckets.items()} for buckets in old]
        deltas: list[dict[Key, list[Signed]]] = [{}, {}]
        out: list[Signed] = []
        for side in (0, 1):
            for weight, join_key, combo in sorted(keyed[side], key=lambda row: row[0]):  # retractions first
                if join_key is None:
                    if self.keeps[side]:  # matches nothing, ever
                        out.append((weight, self._extended(side, combo)))
                    continue
                deltas[side].setdefault(join_key, []).append((weight, combo))
                self._apply(side, weight, combo, new[side][join_key])
        # The residual's results, for this epoch only: the operator holds nothing between epochs.
        test = _Residual(self.query, self.residual, self.index + 2) if self.residual is not None else None
        affected = self._affected(test, touched, old, new, deltas) if test is not None else {}
        for k in touched:
            (l_old, r_old), (l_new, r_new) = (old[0][k], old[1][k]), (new[0][k], new[1][k])
            d_left, d_right = deltas[0].get(k, []), deltas[1].get(k, [])
            if self.kind.filters:  # unmatched = rows without a match; semi = all rows - unmatched
                unmatched = self._extensions(test, 0, l_old, l_new, r_old, r_new, d_left, affected.get((0, k)))
                if self.kind is JoinKind.ANTI:
                    out.extend(unmatched)
                else:
                    out.extend((weight, self._extended(0, combo)) for weight, combo in d_left)
                    out.extend((-weight, combo) for weight, combo in unmatched)
                continue
            for weight, left_combo in d_left:  # ΔA ⋈ B_old
                out.extend((weight, left_combo + r) for r in r_old.values() if _matches(test, left_combo, r))
            for weight, right_combo in d_right:  # A_new ⋈ ΔB
                out.extend((weight, a + right_combo) for a in l_new.values() if _matches(test, a, right_combo))
            for side in (0, 1):
                if self.keeps[side]:
                    buckets = ((l_old, l_new), (r_old, r_new))
                    out.extend(self._extensions(test, side, *buckets[side], *buckets[1 - side],
                                                deltas[side].get(k, []), affected.get((side, k))))
        for (side, k), state_key in state_keys.items():
            if k in deltas[side]:
                bucket = new[side][k]
                writes[state_key] = self._encode(side, bucket) if bucket else None
        return out

    def _pair(self, side: int, mine: Combo, other: Combo) -> tuple[Combo, Combo]:
        return (mine, other) if side == 0 else (other, mine)

    def _extended(self, side: int, combo: Combo) -> Combo:
        """A row of input ``side`` null-extended with the other input."""
        return (*combo, None) if side == 0 else (None,) * (self.index + 1) + combo

    def _extensions(self, test: _Residual | None, side: int, mine_old: Bucket, mine_new: Bucket,
                    other_old: Bucket, other_new: Bucket, delta: list[Signed],
                    affected: set[Identity] | None) -> list[Signed]:
        """The change of one bucket's null-extended rows of the preserved input ``side``."""
        if test is None:  # a row matches the whole other bucket: extended iff it is empty
            if not other_old and not other_new:
                return [(weight, self._extended(side, combo)) for weight, combo in delta]
            if not other_old:  # first matches arrived: the rows that were extended are no longer
                return [(-1, self._extended(side, combo)) for combo in mine_old.values()]
            if not other_new:  # the last match left
                return [(1, self._extended(side, combo)) for combo in mine_new.values()]
            return []
        out: list[Signed] = []
        for identity in affected or ():
            for weight, mine, others in ((-1, mine_old, other_old), (1, mine_new, other_new)):
                combo = mine.get(identity)
                if combo is not None and not any(_matches(test, *self._pair(side, combo, o)) for o in others.values()):
                    out.append((weight, self._extended(side, combo)))
        return out

    def _affected(self, test: _Residual, touched: list[Key], old: list[dict[Key, Bucket]], new: list[dict[Key, Bucket]],
                  deltas: list[dict[Key, list[Signed]]]) -> dict[tuple[int, Key], set[Identity]]:
        """With a residual: per preserved input and bucket, the rows whose having a match may have changed
        (changed themselves, or matched by a changed row of the other input). The residual is evaluated
        on every pair this epoch needs in two vectorised batches, before and after finding them."""
        pairs: list[tuple[Combo, Combo]] = []
        for k in touched:
            d_left, d_right = deltas[0].get(k, []), deltas[1].get(k, [])
            pairs += [(a, r) for _, a in d_left for r in chain(old[1][k].values(), new[1][k].values())]
            pairs += [(a, r) for a in chain(old[0][k].values(), new[0][k].values()) for _, r in d_right]
        test.prefetch(pairs)
        affected: dict[tuple[int, Key], set[Identity]] = {}
        pairs = []
        for k in touched:
            for side in (0, 1):
                if not self.tracks[side]:
                    continue
                other_delta = deltas[1 - side].get(k, [])
                rows = {self._identity(side, combo) for _, combo in deltas[side].get(k, [])}
                for combo in chain(old[side][k].values(), new[side][k].values()):
                    if any(test(*self._pair(side, combo, o)) for _, o in other_delta):
                        rows.add(self._identity(side, combo))
                affected[(side, k)] = rows
                for identity in rows:
                    for mine, others in ((old[side][k], old[1 - side][k]), (new[side][k], new[1 - side][k])):
                        if (found := mine.get(identity)) is not None:
                            pairs += [self._pair(side, found, o) for o in others.values()]
        test.prefetch(pairs)
        return affected

    # -- rows and buckets --------------------------------------------------------------------------------

    def _join_key(self, side: int, combo: Combo) -> Key | None:
        values = []
        for (position, column), kind in zip(self.key_at[side], self.key_types, strict=True):
            row = combo[position]
            value = None if row is None else key_value(row[column], kind)
            if value is None:
                return None
            values.append(value)
        return tuple(values)

    def _identity(self, side: int, combo: Combo) -> Identity:
        sources = self.sides[side]
        if len(sources) == 1:
            row = combo[0]
            return (None if row is None else self._pk_of[sources[0]](row),)
        return tuple(None if row is None else self._pk_of[source](row)
                     for source, row in zip(sources, combo, strict=True))

    def _apply(self, side: int, weight: int, combo: Combo, bucket: Bucket) -> None:
        identity = self._identity(side, combo)
        if weight < 0:
            if bucket.pop(identity, None) != combo:
                raise InconsistentChanges(f"join step {self.index}, input {side}: retracted row {combo!r} is "
                                          "not in the operator state")
        else:
            bucket[identity] = combo

    def _encode(self, side: int, bucket: Bucket) -> bytes:
        sources = self.sides[side]
        if len(sources) == 1:  # a source's rows: a list of rows
            types = self.column_types[sources[0]]
            in_order = sorted(bucket.items(), key=lambda item: repr(item[0][0]))
            if self._stored_as_is[sources[0]]:  # a tuple is a JSON array as a list is
                rows: list[object] = [combo[0] or () for _, combo in in_order]
            else:
                rows = [[encode_value(v, t) for v, t in zip(combo[0] or (), types, strict=True)]
                        for _, combo in in_order]
        else:  # a list of [row or null per source]
            rows = [[None if row is None else [encode_value(v, t) for v, t in zip(row, self.column_types[s],
                                                                                  strict=True)]
                     for s, row in zip(sources, combo, strict=True)]
                    for _, combo in sorted(bucket.items(), key=lambda item: repr(item[0]))]
        encoded: bytes = dumps(rows)
        return encoded

    def _decode(self, side: int, data: bytes) -> Bucket:
        sources = self.sides[side]
        if len(sources) == 1 and self._stored_as_is[sources[0]]:
            return self._decode_as_is(sources[0], data)
        bucket: Bucket = {}
        for encoded in loads(data):
            if len(sources) == 1:
                encoded = [encoded]
            combo = tuple(None if row is None else tuple(decode_value(v, t) for v, t in zip(row, self.column_types[s],
                                                                                            strict=True))
                          for s, row in zip(sources, encoded, strict=True))
            bucket[self._identity(side, combo)] = combo
        return bucket

    def _decode_as_is(self, source: int, data: bytes) -> Bucket:
        """:meth:`_decode` of a bucket of one source's rows whose values are stored as they are."""
        pk_of, width = self._pk_of[source], len(self.column_types[source])
        bucket: Bucket = {}
        for encoded in loads(data):
            if len(encoded) != width:
                raise ValueError(f"join step {self.index}: a stored row of source {source} has {len(encoded)} "
                                 f"values, its schema {width}")
            row = tuple(encoded)
            bucket[(pk_of(row),)] = (row,)
        return bucket


#: Column types whose values the state codec converts (``encode_value`` / ``decode_value``).
_CONVERTED = frozenset({ColumnType.BYTES, ColumnType.FLOAT})


def _tuple_getter(indexes: Sequence[int]) -> Callable[[Values], Key]:
    """A function giving the values at ``indexes`` of a row, as a tuple (``itemgetter`` gives a bare value
    for one index, and takes none for a source without a primary key)."""
    if not indexes:
        return lambda row: ()
    if len(indexes) == 1:
        index = indexes[0]
        return lambda row: (row[index],)
    return cast(Callable[[Values], Key], itemgetter(*indexes))


def _matches(test: _Residual | None, left: Combo, right: Combo) -> bool:
    return test is None or test(left, right)


class _Residual:
    """A join step's residual condition over (left, right) pairs, evaluated in vectorised batches and
    remembered for the epoch (a pair is tested by the inner and the outer parts alike)."""

    def __init__(self, query: Query, expr: Expr, width: int) -> None:
        self.query = query
        self.expr = expr
        self.columns = {(e.side, e.column) for e in walk(expr) if isinstance(e, ColumnRef)}
        self.padding: Combo = (None,) * (len(query.sources) - width)
        self.known: dict[tuple[Combo, Combo], bool] = {}

    def prefetch(self, pairs: Iterable[tuple[Combo, Combo]]) -> None:
        todo = list(dict.fromkeys(pair for pair in pairs if pair not in self.known))
        if not todo:
            return
        rows: list[JoinedRow] = [(1, left + right + self.padding) for left, right in todo]
        results = evaluate(self.expr, build_batch(self.query, rows, self.columns)).to_pylist()
        self.known.update(zip(todo, (result is True for result in results), strict=True))

    def __call__(self, left: Combo, right: Combo) -> bool:
        if (left, right) not in self.known:
            self.prefetch([(left, right)])
        return self.known.get((left, right), False)
