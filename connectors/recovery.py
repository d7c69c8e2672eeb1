"""Rolling a view's Redis state forward from its own changelog.

Kafka is the source of truth: when a process died between committing an epoch to Kafka and applying it
to Redis, or Redis was wiped, the epochs above Redis' MCE are read back from the changelog and applied:
rows, epoch index and MCE, and, for an epoch of a chunked backfill, the positions, counters and journal
it committed (from the ``backfill_progress`` mutation on its barriers, :mod:`mvlog.backfill_record`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mvlog.backfill_record import BACKFILL_MUTATION, BackfillReplay, load_positions
from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch
from mvlog.config import Settings
from mvlog.connectors.changelog_reader import ChangelogReader
from mvlog.connectors.view_store import EpochCommit, Lifecycle, ViewStore, commit_from_changes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogTail:
    last_committed: int  # the view's MCE after rolling forward (0 if none)
    max_seen: int  # the highest epoch in the log, abandoned ones included: new epochs must be above it
    backfill: BackfillReplay | None = None  # the backfill state after the last applied epoch


def roll_forward(settings: Settings, store: ViewStore, entry: CatalogEntry, idle_timeout: float = 1.5,
                 upto_epoch: int | None = None) -> LogTail:
    """Apply every committed epoch above the MCE to Redis.

    The end of the log is where the reader goes idle for ``idle_timeout`` seconds, or ``upto_epoch``:
    a changelog whose writer is running never goes idle, so a caller that is not that writer (a rebuild
    of everything) stops at the epoch of its start, and the live writer rolls itself forward from there
    when its next commit finds Redis behind it. The reader is ``read_committed``: every complete epoch
    it hands out committed, the log's last one included.
    """
    mce = store.mce(entry.name) or 0
    last = mce
    applied = 0
    with ChangelogReader(settings, entry.name, entry.key_columns, entry.partitions, store.index,
                         after_epoch=mce, upto_epoch=upto_epoch) as reader:
        backfill = BackfillReplay(entry.sources, load_positions(store.backfill_state(entry.name), entry.sources))
        for epoch in reader.epochs(idle_timeout=idle_timeout):
            store.commit(entry.name, _commit_of(entry, epoch, backfill))
            last = epoch.epoch
            applied += 1
        max_seen = max(reader.max_seen_epoch, last)
    if applied:
        log.info("%s: rolled Redis forward by %d epoch(s) to %d", entry.name, applied, last)
    return LogTail(last, max_seen, backfill)


def _commit_of(entry: CatalogEntry, epoch: Epoch, backfill: BackfillReplay) -> EpochCommit:
    """What the epoch committed to Redis when it was written, as far as its changelog says."""
    mutation = epoch.mutation
    if mutation is None or mutation.kind != BACKFILL_MUTATION:
        return commit_from_changes(entry.key_columns, epoch.epoch, epoch.changes, epoch.index)
    fields, journal = backfill.apply(epoch.epoch, mutation.payload)
    lifecycle = Lifecycle.LIVE if backfill.done else Lifecycle.BACKFILLING
    return commit_from_changes(entry.key_columns, epoch.epoch, epoch.changes, epoch.index, backfill=fields,
                               journal=journal, lifecycle=lifecycle.value)
