"""Where a staged replacement's hydration starts: an upstream's snapshot, or its changelog's first epoch.

Hydration computes the replacement's rows at the view's MCE from its upstreams' history. Replaying an
upstream's whole changelog needs it retained from its first epoch, which Kafka retention ends; a
snapshot (``mvlog snapshot``) keeps the upstream's rows at an epoch E instead. So each upstream starts
from its newest snapshot at or before the view's MCE whose later epochs its changelog still holds, or
else from its changelog's first epoch; with neither, the replacement cannot be hydrated, and says why.

The replacement's first state is computed at one epoch F: the newest chosen snapshot's epoch (the
view's MCE when every upstream replays its changelog). Each upstream's rows at F are its snapshot's rows
(as ``r`` changes) plus its changes after the snapshot up to F, fed to the operator in one step, as a
snapshot backfill does (the snapshot's rows pass through the driver); the follower then catches up
over (F, MCE] from the changelog and follows the view's epochs. Nothing is written to the view's
changelog either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import SparkSession

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.retention import starts_the_log
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import ReplacementError
from mvlog.services.snapshot_compaction import check_changelog_after, read_snapshot
from mvlog.snapshot_plan import SnapshotError, SnapshotRecord

#: ``changes_of(upstream, after, upto)``: the upstream's changes of its epochs in ``(after, upto]``.
ChangesOf = Callable[[str, int, int], list[Change]]


@dataclass(frozen=True)
class HydrationStart:
    """Per upstream, the snapshot hydration loads (None: its changelog is replayed from its first epoch)."""

    snapshots: Mapping[str, SnapshotRecord | None]
    view_mce: int

    @property
    def epoch(self) -> int:
        """F, the epoch of the replacement's first state."""
        return max((s.epoch for s in self.snapshots.values() if s is not None), default=self.view_mce)

    def describe(self) -> str:
        return "; ".join(f"{name}: snapshot at epoch {s.epoch}" if s is not None
                         else f"{name}: changelog from its first epoch" for name, s in self.snapshots.items())


def hydration_start(settings: Settings, store: ViewStore, snapshots: SnapshotStore,
                    upstreams: Mapping[str, CatalogEntry], view_mce: int) -> HydrationStart:
    """Choose each upstream's start (raises :class:`ReplacementError` naming an upstream that has neither
    a usable snapshot nor its whole changelog)."""
    chosen: dict[str, SnapshotRecord | None] = {}
    for name, entry in upstreams.items():
        record = snapshots.latest(name, at_or_before=view_mce)
        why_not = f"it has no snapshot at or before epoch {view_mce}"
        if record is not None:
            try:
                check_changelog_after(settings, store, entry, record.epoch)
                chosen[name] = record
                continue
            except SnapshotError as error:
                why_not = f"its snapshot at epoch {record.epoch} is not covered by the changelog ({error})"
        if not starts_the_log(settings, store.index, name):
            raise ReplacementError(
                f"cannot hydrate: the changelog of {name} no longer starts at its first epoch (Kafka retention) "
                f"and {why_not}; a replacement starts from an upstream's snapshot or from its whole changelog")
        chosen[name] = None
    return HydrationStart(chosen, view_mce)


def first_inputs(start: HydrationStart, spark: SparkSession, upstreams: Mapping[str, CatalogEntry],
                 changes_of: ChangesOf) -> dict[str, list[Change]]:
    """Each upstream's rows at ``start.epoch`` as changes: its snapshot's rows, then its later changes."""
    inputs: dict[str, list[Change]] = {}
    for name, record in start.snapshots.items():
        changes = snapshot_reads(spark, upstreams[name], record) if record is not None else []
        after = record.epoch if record is not None else 0
        if start.epoch > after:
            changes.extend(changes_of(name, after, start.epoch))
        inputs[name] = changes
    return inputs


def snapshot_reads(spark: SparkSession, upstream: CatalogEntry, record: SnapshotRecord) -> list[Change]:
    """The snapshot's rows as ``r`` (read) changes, applied like creates."""
    columns = [f"`{c}`" for c in upstream.schema.names]
    rows = read_snapshot(spark, upstream, record.path).select(*columns).toArrow().to_pylist()
    keys = upstream.key_columns
    return [Change(Op.READ, tuple(row[k] for k in keys), None, row) for row in rows]
