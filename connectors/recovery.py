"""Rolling a view's Redis state forward from its own changelog.

Kafka is the source of truth: when a process died between committing an epoch to Kafka and applying it
to Redis, or Redis was wiped, the epochs above Redis' MCE are read back from the changelog and applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.changelog_reader import ChangelogReader
from mvlog.connectors.view_store import ViewStore, commit_from_changes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogTail:
    last_committed: int  # the view's MCE after rolling forward (0 if none)
    max_seen: int  # the highest epoch in the log, abandoned ones included: new epochs must be above it


def roll_forward(settings: Settings, store: ViewStore, entry: CatalogEntry, idle_timeout: float = 1.5) -> LogTail:
    """Apply every committed epoch above the MCE to Redis.

    The end of the log is where the reader goes idle for ``idle_timeout`` seconds; callers make sure no
    writer of this changelog is running (a new transactional producer has fenced the old one).
    """
    mce = store.mce(entry.name) or 0
    last = mce
    applied = 0
    with ChangelogReader(settings, entry.name, entry.key_columns, entry.partitions, store.index,
                         after_epoch=mce) as reader:
        for epoch in reader.epochs(idle_timeout=idle_timeout):
            store.commit(entry.name, commit_from_changes(entry.key_columns, epoch.epoch, epoch.changes, epoch.index))
            last = epoch.epoch
            applied += 1
        max_seen = max(reader.max_seen_epoch, last)
    if applied:
        log.info("%s: rolled Redis forward by %d epoch(s) to %d", entry.name, applied, last)
    return LogTail(last, max_seen)

