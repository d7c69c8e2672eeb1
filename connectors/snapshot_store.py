"""Which snapshots a view has and where they are: ``<prefix>:{view}:snapshots`` in Redis.

A hash, field = the snapshot's epoch (decimal), value = its :class:`~mvlog.snapshot_plan.SnapshotRecord`
as JSON. A snapshot is recorded only once its Parquet folder is complete, and forgotten before its
folder is deleted, so a recorded snapshot is always readable.
"""

from __future__ import annotations

import redis

from mvlog.snapshot_plan import SnapshotRecord


class SnapshotStore:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def key(self, view: str) -> str:
        return f"{self.prefix}:{{{view}}}:snapshots"

    def record(self, snapshot: SnapshotRecord) -> None:
        self.redis.hset(self.key(snapshot.view), str(snapshot.epoch), snapshot.to_json())

    def forget(self, view: str, epoch: int) -> None:
        self.redis.hdel(self.key(view), str(epoch))

    def all(self, view: str) -> list[SnapshotRecord]:
        """The view's snapshots, oldest first."""
        stored = self.redis.hgetall(self.key(view))
        return sorted((SnapshotRecord.from_json(v) for v in stored.values()), key=lambda r: r.epoch)

    def latest(self, view: str, at_or_before: int | None = None) -> SnapshotRecord | None:
        """The newest snapshot (at or before an epoch when given)."""
        found = [r for r in self.all(view) if at_or_before is None or r.epoch <= at_or_before]
        return found[-1] if found else None

    def drop(self, view: str) -> list[SnapshotRecord]:
        """Forget every snapshot of ``view``; returns them (the caller deletes their folders)."""
        records = self.all(view)
        self.redis.delete(self.key(view))
        return records
