"""The epoch index in Redis: for each view and partition, epoch -> offset of its barrier.

Epochs are int64 above 2**53, beyond what a sorted-set score (a double) holds exactly, so the index is a
sorted set of equal scores ordered lexicographically by ``<epoch as 16 hex digits>:<offset>:<records>``
and searched with ZRANGEBYLEX.
"""

from __future__ import annotations

import redis

from mvlog.changes import IndexEntry
from mvlog.connectors.redis.redis_keys import view_key

__all__ = ["EpochIndex", "IndexEntry"]


def epoch_hex(epoch: int) -> str:
    return f"{epoch:016x}"


def index_member(epoch: int, offset: int, records: int) -> str:
    return f"{epoch_hex(epoch)}:{offset}:{records}"


def _parse(member: bytes | str) -> IndexEntry:
    text = member.decode() if isinstance(member, bytes) else member
    epoch, offset, records = text.split(":")
    return IndexEntry(int(epoch, 16), int(offset), int(records))


class EpochIndex:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix

    def key(self, view: str, partition: int) -> str:
        return view_key(self._prefix, view, f"index:{partition}")

    def add(self, view: str, entries: dict[int, IndexEntry]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        for partition, entry in entries.items():
            pipe.zadd(self.key(view, partition), {index_member(entry.epoch, entry.offset, entry.records): 0})
        pipe.execute()

    def at(self, view: str, partition: int, epoch: int) -> IndexEntry | None:
        found = self._redis.zrangebylex(self.key(view, partition), f"[{epoch_hex(epoch)}:",
                                        f"({epoch_hex(epoch + 1)}", start=0, num=1)
        return _parse(found[0]) if found else None

    def entries_at(self, view: str, partitions: int, epoch: int | None) -> dict[int, IndexEntry] | None:
        """Every partition's entry of ``epoch`` (None unless all are there): a writer's proof that its last
        epoch committed, should Redis be wiped before it commits another."""
        if epoch is None:
            return None
        found = {p: self.at(view, p, epoch) for p in range(partitions)}
        entries = {p: e for p, e in found.items() if e is not None}
        return entries if len(entries) == partitions else None

    def offsets_after(self, view: str, partitions: int, epoch: int | None) -> dict[int, int]:
        """Each partition's first offset after ``epoch``'s barrier: where a reader of the epochs above it
        starts. Empty when ``epoch`` is None or not indexed in every partition (read from the start)."""
        return {p: e.offset + 1 for p, e in (self.entries_at(view, partitions, epoch) or {}).items()}

    def before(self, view: str, partition: int, epoch: int) -> IndexEntry | None:
        """The last indexed epoch strictly below ``epoch``: a reader of ``epoch`` starts after its barrier."""
        found = self._redis.zrevrangebylex(self.key(view, partition), f"({epoch_hex(epoch)}", "-",
                                           start=0, num=1)
        return _parse(found[0]) if found else None

    def first_at_or_after(self, view: str, partition: int, epoch: int) -> IndexEntry | None:
        found = self._redis.zrangebylex(self.key(view, partition), f"[{epoch_hex(epoch)}", "+",
                                        start=0, num=1)
        return _parse(found[0]) if found else None

    def oldest(self, view: str, partition: int) -> IndexEntry | None:
        found = self._redis.zrangebylex(self.key(view, partition), "-", "+", start=0, num=1)
        return _parse(found[0]) if found else None

    def latest(self, view: str, partition: int) -> IndexEntry | None:
        found = self._redis.zrevrangebylex(self.key(view, partition), "+", "-", start=0, num=1)
        return _parse(found[0]) if found else None

    def first_retained(self, view: str, partition: int, low_watermark: int) -> IndexEntry | None:
        """The oldest indexed epoch whose records in ``partition`` all sit at or above ``low_watermark``
        (None: retention deleted every indexed epoch, or none is indexed).

        Nothing trims the index when Kafka deletes segments, so what is retained is found here: offsets
        grow with epochs, so a binary search over the sorted set's ranks (O(log n) round trips)."""
        key = self.key(view, partition)
        low, high = 0, int(self._redis.zcard(key))
        while low < high:
            middle = (low + high) // 2
            entry = self._at_rank(key, middle)
            if entry is None or entry.first_offset >= low_watermark:
                high = middle
            else:
                low = middle + 1
        return self._at_rank(key, low)

    def _at_rank(self, key: str, rank: int) -> IndexEntry | None:
        found: list[bytes] = self._redis.zrange(key, rank, rank)  # type: ignore[assignment]
        return _parse(found[0]) if found else None

    def between(self, view: str, partition: int, after: int, upto: int) -> list[IndexEntry]:
        """Entries with ``after < epoch <= upto``, oldest first."""
        found = self._redis.zrangebylex(self.key(view, partition), f"({epoch_hex(after)}:~",
                                        f"({epoch_hex(upto + 1)}")
        return [_parse(m) for m in found]

    def trim_before(self, view: str, partition: int, epoch: int) -> int:
        """Forget epochs below ``epoch`` (after retention deleted them from Kafka)."""
        return int(self._redis.zremrangebylex(self.key(view, partition), "-", f"({epoch_hex(epoch)}"))

    def count_after(self, view: str, epoch: int | None, partition: int = 0, upto: int | None = None) -> int:
        """How many indexed epochs lie above ``epoch`` (all of them when None): a lag in epochs.

        Every partition carries every epoch's barrier, so one partition's index counts them all.
        ``upto`` bounds the count (inclusive): the lag behind an MCE read before, not behind whatever
        the upstream committed since.
        """
        low = "-" if epoch is None else f"({epoch_hex(epoch)}:~"
        high = "+" if upto is None else f"({epoch_hex(upto + 1)}"
        return int(self._redis.zlexcount(self.key(view, partition), low, high))

    def records_after(self, view: str, partitions: int, epoch: int | None, upto: int | None = None) -> int:
        """Change records of the indexed epochs above ``epoch`` (up to ``upto``) over all partitions:
        a lag in records."""
        low = "-" if epoch is None else f"({epoch_hex(epoch)}:~"
        high = "+" if upto is None else f"({epoch_hex(upto + 1)}"
        pipe = self._redis.pipeline(transaction=False)
        for partition in range(partitions):
            pipe.zrangebylex(self.key(view, partition), low, high)
        return sum(_parse(member).records for found in pipe.execute() for member in found)
