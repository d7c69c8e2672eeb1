"""An object's rows as of an earlier epoch: its serving rows in Redis with its later epochs undone.

Redis serves a table or view at its MCE only. Its rows at an earlier epoch ``E`` are those rows with the
epochs after ``E`` undone from its changelog: each change carries its before-image, and only those epochs
are read (the epoch index says where they start). What a view's state is re-derived from after a Redis
wipe (:mod:`mvlog.services.rederive.state_rebuild`), and a backfill's chunk read again at the epoch it was
emitted in (:mod:`mvlog.services.backfill.task_chunks`).
"""

from __future__ import annotations

from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, undo_changes
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import decode_row


class EpochNotReadableError(RuntimeError):
    """The object's rows at the epoch cannot be read yet: Redis holds it below that epoch (it is being
    restored), or its changelog ends before its MCE."""


def rows_at_epoch(settings: Settings, store: ViewStore, entry: CatalogEntry, epoch: int,
                  idle_timeout: float = 15.0) -> dict[Key, Row]:
    """rows(entry, epoch): its serving rows at its MCE, its committed epochs above ``epoch`` undone."""
    mce, pairs = store.read_at_consistent_epoch(entry.name)
    if mce is None or mce < epoch:
        raise EpochNotReadableError(f"{entry.name} is at epoch {mce} in Redis, below {epoch}")
    rows = {entry.schema.key_of(row): row for row in (decode_row(value) for _, value in pairs)}
    if mce == epoch:
        return rows
    return undo_changes(rows, changes_after(settings, store, entry, epoch, mce, idle_timeout))


def changes_after(settings: Settings, store: ViewStore, entry: CatalogEntry, after: int, upto: int,
                  idle_timeout: float = 15.0) -> list[Change]:
    """The changes of ``entry``'s committed epochs in ``(after, upto]``, in the order they were applied."""
    changes: list[Change] = []
    with ChangelogReader(settings, entry.name, entry.key_columns, entry.partitions, store.index,
                         after_epoch=after, upto_epoch=upto) as reader:
        for found in reader.epochs(idle_timeout=idle_timeout):
            changes.extend(found.changes)
        if reader.last_epoch < upto:
            raise EpochNotReadableError(f"{entry.name}: its changelog ends at epoch {reader.last_epoch}, below "
                                        f"its MCE {upto}; cannot take it back to epoch {after}")
    return changes
