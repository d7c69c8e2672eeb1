"""Reading a view's rows and operator state, alone or together with the MCE they reflect.

Rows are the ``rows`` hash (encoded key -> encoded row), operator state the ``opstate`` hash, and the
*key-order index* ``keyorder`` a sorted set of order members (:mod:`mvlog.key_order`): a backfill scans a
vnode's rows in key order after a position with :meth:`ViewRows.read_ordered`, which returns them with the
MCE they reflect (one script). Reads that need the MCE too are one MULTI or one script, so the rows and
the epoch are of the same commit. All of them are written only by an epoch's commit
(:mod:`~mvlog.connectors.redis.epoch_commit`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.redis_client import is_cluster
from mvlog.connectors.redis.view_meta import ViewMeta

# Rows of some vnodes in key order after given positions, with the MCE they reflect: one script, so the
# rows and the epoch are read atomically (an epoch commit is one script too). ARGV: the row budget, then
# (vnode, lower bound, upper bound) triples; vnodes are read in turn until the budget is spent.
_READ_ORDERED_SCRIPT = lua_script("view_read_ordered")


@dataclass(frozen=True)
class OrderedRead:
    """Rows of some vnodes in key order, as of the upstream's MCE ``epoch``."""

    epoch: int | None
    row_count: int  # all rows of the view at ``epoch``
    parts: list[tuple[int, bool, list[tuple[bytes, bytes]]]]  # (vnode, reached its end, [(member, row)])


class ViewRows(ViewMeta):
    """Rows and operator state of views, read (alone, or with the MCE of :class:`ViewMeta` they reflect)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self._read_ordered = client.register_script(_READ_ORDERED_SCRIPT)

    def get_rows(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self._key(view, "rows"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def row_list(self, view: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """The rows of ``keys`` in their order, None where there is none (one HMGET)."""
        if not keys:
            return []
        return cast(list[bytes | None], self.redis.hmget(self._key(view, "rows"), list(keys)))

    def scan_rows(self, view: str, batch: int = 1000) -> Iterator[tuple[bytes, bytes]]:
        """All rows, a batch at a time (HSCAN: memory stays bounded for large views)."""
        yield from self.redis.hscan_iter(self._key(view, "rows"), count=batch)

    def row_count(self, view: str) -> int:
        return int(self.redis.hlen(self._key(view, "rows")))

    def get_state(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self._key(view, "opstate"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def read_at_consistent_epoch(self, view: str) -> tuple[int | None, list[tuple[bytes, bytes]]]:
        """All rows together with the MCE they reflect (one MULTI, so both are of the same epoch)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._key(view, "meta"), "mce")
        pipe.hgetall(self._key(view, "rows"))
        mce, rows = pipe.execute()
        return (int(mce) if mce is not None else None), list(rows.items())

    def read_many_at_consistent_epoch(self, views: Sequence[str]
                                      ) -> dict[str, tuple[int | None, list[tuple[bytes, bytes]]]]:
        """All rows of several views, each with the MCE they reflect: on a standalone Redis in one MULTI
        (one instant for all of them), on a Redis Cluster (each view's keys in a slot of its own) one MULTI
        per view. A caller must not count on one instant: ``read --views`` takes every view back to the
        lowest MCE from its changelog, so each view's rows agreeing with its own MCE is all it needs."""
        if is_cluster(self.redis):
            return {view: self.read_at_consistent_epoch(view) for view in views}
        pipe = self.redis.pipeline(transaction=True)
        for view in views:
            pipe.hget(self._key(view, "meta"), "mce")
            pipe.hgetall(self._key(view, "rows"))
        replies = pipe.execute()
        return {view: ((int(mce) if mce is not None else None), list(rows.items()))
                for view, mce, rows in zip(views, replies[0::2], replies[1::2], strict=True)}

    def get_rows_at_consistent_epoch(self, view: str, keys: Sequence[bytes]
                                     ) -> tuple[int | None, dict[bytes, bytes]]:
        """The rows of ``keys`` (those that exist) with the MCE they reflect (one MULTI)."""
        if not keys:
            return self.mce(view), {}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._key(view, "meta"), "mce")
        pipe.hmget(self._key(view, "rows"), list(keys))
        mce, values = pipe.execute()
        rows = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        return (int(mce) if mce is not None else None), rows

    def read_ordered(self, view: str, vnodes: Sequence[tuple[int, bytes | None]], budget: int) -> OrderedRead:
        """Up to ``budget`` rows of ``vnodes`` (each: vnode, order member to read after, or None from its
        start), in key order, vnode after vnode, with the MCE they reflect (one atomic script)."""
        args: list[bytes | int] = [budget]
        for vnode, after in vnodes:
            low = b"(" + after if after is not None else b"[" + bytes((vnode,))
            high = b"(" + bytes((vnode + 1,)) if vnode < 255 else b"+"
            args += [vnode, low, high]
        keys = [self._key(view, "meta"), self._key(view, "rows"), self._key(view, "keyorder")]
        reply = cast(list[Any], self._read_ordered(keys=keys, args=args))
        epoch = int(reply[0]) if reply[0] else None
        parts: list[tuple[int, bool, list[tuple[bytes, bytes]]]] = []
        i = 2
        while i < len(reply):
            vnode, count, exhausted = int(reply[i]), int(reply[i + 1]), bool(int(reply[i + 2]))
            members = reply[i + 3:i + 3 + count]
            values = reply[i + 3 + count:i + 3 + 2 * count]
            if any(v is None for v in values):
                raise RuntimeError(f"{view}: the key-order index names rows that do not exist (vnode {vnode})")
            parts.append((vnode, exhausted, list(zip(members, values, strict=True))))
            i += 3 + 2 * count
        return OrderedRead(epoch, int(reply[1]), parts)
