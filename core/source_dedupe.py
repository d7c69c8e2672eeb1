"""Applying Debezium's at-least-once redelivery once: the per-key last-applied source position.

A Kafka Connect worker that dies (SIGKILL, OOM, a lost host) restarts from the source offsets it last
*flushed*; Debezium then emits again every change after them. Those duplicates are distinct Kafka
messages, so the ingester's own exactly-once (offsets committed with the epoch) does not see them.
Re-applying a duplicate insert or update as an upsert is harmless on its own, but the duplicates come
*after* newer changes of the same rows: a redelivered old update overwrites a newer row, a redelivered
insert resurrects a row deleted since. They are recognised by the database position Debezium puts in
each event's ``source`` block.

**Which position, compared how.** For PostgreSQL it is the change's WAL ``lsn``. LSNs are not
monotone across the stream (a transaction that commits later may hold changes written earlier), but they
are **per row**: a row is locked by the transaction that changes it until it commits, so the next change
of that row is written after that commit, at a higher LSN; and a row's key is unique, so an insert of a
deleted key waits for the delete to commit too. Hence the rule: **a streamed change of key k whose
position is <= the last position applied for k is a redelivery, and is skipped.** Deleted keys keep their
position (a redelivered insert must not bring the row back).

**Snapshot reads** (``op`` ``r``) carry the snapshot's LSN, and a transaction open across the snapshot
may stream changes with lower LSNs that the snapshot did not see: reads are always applied and do not set
a key's position (a snapshot is only redone, whole, before streaming starts). Other databases' events,
and events without a position, are applied as they come (no deduplication: see the README).

The state lives in :class:`PositionFilter`: pure, so the rule is unit-tested without Kafka. The ingester
commits each epoch's newly applied positions on that epoch's barriers (the same Kafka transaction as the
rows and the source offsets) and folds them back at start, so a SIGKILL never forgets one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mvlog.row_schema import Key

__all__ = ["PositionFilter", "debezium_position"]

#: ``source.snapshot`` values of events read by a snapshot rather than streamed from the log.
_SNAPSHOT_VALUES = {"true", "first", "first_in_data_collection", "last", "last_in_data_collection", "incremental"}


def debezium_position(op: Any, source: Any) -> int | None:
    """The position of a *streamed* Debezium change that orders the changes of one row, or None.

    PostgreSQL only (``source.connector == "postgresql"``): the change's ``lsn``. None for snapshot
    reads and for everything that has no such position."""
    if op == "r" or not isinstance(source, Mapping) or source.get("connector") != "postgresql":
        return None
    if str(source.get("snapshot", "false")).lower() in _SNAPSHOT_VALUES:
        return None
    lsn = source.get("lsn")
    if isinstance(lsn, bool) or not isinstance(lsn, int | str):
        return None
    try:
        return int(lsn)
    except ValueError:
        return None


class PositionFilter:
    """The last applied position per key; :meth:`admit` says whether a change is new, and records it.

    :meth:`take_changed` hands the positions recorded since the last call (what an epoch must persist),
    :meth:`load` folds persisted ones back in (epoch order; the higher position wins anyway)."""

    def __init__(self) -> None:
        self._last: dict[Key, int] = {}
        self._changed: dict[Key, int] = {}
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._last)

    def last(self, key: Key) -> int | None:
        return self._last.get(key)

    def admit(self, key: Key, position: int | None) -> bool:
        """True when the change of ``key`` at ``position`` is to be applied (and remember it); False for
        a redelivery (a position at or below the key's last applied one). No position: always applied."""
        if position is None:
            return True
        last = self._last.get(key)
        if last is not None and position <= last:
            self.skipped += 1
            return False
        self._last[key] = position
        self._changed[key] = position
        return True

    def take_changed(self) -> dict[Key, int]:
        """The positions admitted since the last call (then forgotten here, kept in the filter)."""
        changed, self._changed = self._changed, {}
        return changed

    def load(self, positions: Iterable[tuple[Key, int]]) -> None:
        """Fold persisted positions in (the highest per key is kept)."""
        for key, position in positions:
            if position > self._last.get(key, -1):
                self._last[key] = position
