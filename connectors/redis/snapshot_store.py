"""Which snapshots a view has and where they are: ``<prefix>:{view}:snapshots`` in Redis.

A hash, field = the snapshot's epoch (decimal), value = its :class:`~mvlog.snapshot_plan.SnapshotRecord`
as JSON. A snapshot is recorded only once its Parquet folder is complete, and forgotten before its
folder is deleted, so a recorded snapshot is always readable.

Each folder also holds its record (``_mvlog_snapshot.json``; Spark and Parquet readers skip names that
start with ``_``), so after a Redis wipe the first look-up of a view's snapshots registers them again
from the snapshot folder: wiping Redis loses no snapshot.
"""

from __future__ import annotations

from pathlib import Path

import redis

from mvlog.config import Settings
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.snapshot_plan import SnapshotRecord

MANIFEST = "_mvlog_snapshot.json"


class SnapshotStore:
    def __init__(self, client: redis.Redis, prefix: str, folder: Path | None = None) -> None:
        self.redis = client
        self.prefix = prefix
        self.folder = folder  # <snapshot_root>/<prefix>: each view's snapshots are in folder/<view>/epoch=E

    @classmethod
    def of(cls, settings: Settings, client: redis.Redis) -> SnapshotStore:
        return cls(client, settings.topic_prefix, settings.snapshot_root / settings.topic_prefix)

    def key(self, view: str) -> str:
        return view_key(self.prefix, view, "snapshots")

    def record(self, snapshot: SnapshotRecord) -> None:
        self.redis.hset(self.key(snapshot.view), str(snapshot.epoch), snapshot.to_json())

    def forget(self, view: str, epoch: int) -> None:
        self.redis.hdel(self.key(view), str(epoch))

    def all(self, view: str) -> list[SnapshotRecord]:
        """The view's snapshots, oldest first (registered again from their folders when Redis has none)."""
        stored = self.redis.hgetall(self.key(view))
        if not stored:
            for record in self.found_in_folder(view):
                self.record(record)
            stored = self.redis.hgetall(self.key(view))
        return sorted((SnapshotRecord.from_json(v) for v in stored.values()), key=lambda r: r.epoch)

    def found_in_folder(self, view: str) -> list[SnapshotRecord]:
        """The complete snapshots of ``view`` in the snapshot folder (those with their record file)."""
        if self.folder is None or not (self.folder / view).is_dir():
            return []
        found = []
        for manifest in sorted((self.folder / view).glob(f"epoch=*/{MANIFEST}")):
            try:
                record = SnapshotRecord.from_json(manifest.read_text())
            except (ValueError, KeyError):
                continue
            if record.view == view and Path(record.path) == manifest.parent:
                found.append(record)
        return found

    def latest(self, view: str, at_or_before: int | None = None) -> SnapshotRecord | None:
        """The newest snapshot (at or before an epoch when given)."""
        found = [r for r in self.all(view) if at_or_before is None or r.epoch <= at_or_before]
        return found[-1] if found else None

    def drop(self, view: str) -> list[SnapshotRecord]:
        """Forget every snapshot of ``view``; returns them (the caller deletes their folders)."""
        records = self.all(view)
        self.redis.delete(self.key(view))
        return records
