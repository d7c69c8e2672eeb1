"""Rolling a view's Redis state forward from its own changelog.

Kafka is the source of truth: when a process died between committing an epoch to Kafka and applying it
to Redis, or Redis was wiped, the epochs above Redis' MCE are read back from the changelog and applied:
rows, epoch index and MCE, and, for an epoch of a chunked backfill, the positions, counters and journal
it committed (from the ``backfill_progress`` mutation on its barriers, :mod:`mvlog.backfill_record`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mvlog.backfill_record import BACKFILL_MUTATION, BackfillReplay, load_positions
from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch, IndexEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.retention import low_watermarks
from mvlog.connectors.redis.view_store import EpochCommit, Lifecycle, ViewStore, commit_from_changes
from mvlog.epoch import MAX_EPOCH

log = logging.getLogger(__name__)


class ChangelogTrimmedError(RuntimeError):
    """Redis holds none of an object's state and Kafka's retention deleted the start of its changelog:
    rolling forward from what is left would serve it without the rows of the deleted epochs."""


def require_log_start(settings: Settings, entry: CatalogEntry) -> None:
    """Raise ChangelogTrimmedError unless every partition of ``entry``'s changelog starts at offset 0.

    With Redis empty there is no index to say which epochs the remaining log holds whole; a log that
    starts at offset 0 everywhere holds them all. (A log that lost only aborted records is refused too.)
    """
    lows = low_watermarks(settings, settings.changelog_topic(entry.name), entry.partitions)
    if trimmed := {p: low for p, low in lows.items() if low > 0}:
        raise ChangelogTrimmedError(
            f"{entry.name}: Redis holds none of its state and its changelog no longer starts at its first epoch "
            f"(Kafka's retention deleted the offsets below {trimmed}, as partition: first offset kept); "
            f"rebuilding it from the rest would serve it without the rows of the deleted epochs, so it is not "
            f"rebuilt. Restore Redis from its append-only file or a backup (rebuilding from a snapshot is not "
            f"supported yet), or drop it and create it again")


@dataclass(frozen=True)
class LogTail:
    last_committed: int  # the view's MCE after rolling forward (0 if none)
    max_seen: int  # the highest epoch in the log, abandoned ones included: new epochs must be above it
    # The log's last complete epoch, which nothing proved committed (not applied; see commit_held).
    held: Epoch | None = None
    seen: frozenset[int] = frozenset()  # every complete epoch read, committed or not (evidence for upstreams)
    backfill: BackfillReplay | None = None  # the backfill state after the last applied epoch


def roll_forward(settings: Settings, store: ViewStore, entry: CatalogEntry, idle_timeout: float = 1.5,
                 proven: Mapping[int, IndexEntry] | None = None,
                 downstreams: Sequence[CatalogEntry] = (), upto_epoch: int | None = None,
                 last_is_final: bool = False) -> LogTail:
    """Apply every committed epoch above the MCE to Redis (ChangelogTrimmedError when Redis has no MCE
    and retention deleted the start of the changelog, :func:`require_log_start`).

    The end of the log is where the reader goes idle for ``idle_timeout`` seconds, or ``upto_epoch``:
    a changelog whose writer is running never goes idle, so a caller that is not that writer (a rebuild
    of everything) stops at the epoch of its start, and the live writer rolls itself forward from there
    when its next commit finds Redis behind it.
    ``proven``: the barriers of the last epoch the caller (the changelog's live writer) committed, which
    the epoch index may have lost. It is used as proof while reading, never put in the index first:
    the index is only ever extended in epoch order, so no reader of a half-rebuilt index sees that last
    epoch alone and skips the ones before it.

    ``downstreams``: the views that read this changelog. When Redis had nothing of it (wiped) and the
    log's last complete epoch is proven neither by the index nor by a later barrier (its writer was not
    running to say so), a view that has an epoch of that number proves it committed: a view only ever
    computes an upstream epoch it saw committed. Without that proof the epoch is abandoned, as the
    chain rule requires; with it, no view is left holding an epoch its upstream dropped. That epoch is
    returned as ``held``: a caller that rolls the views forward afterwards (a rebuild of everything)
    finds the proof in their ``seen`` epochs without reading their changelogs twice (:func:`commit_held`).

    ``last_is_final``: the caller is the changelog's own writer at its start, after its transactional id
    fenced every earlier one, and its epochs are final once Kafka commits them (a table's: a source
    table's transaction also committed the input offsets it consumed, so abandoning the epoch would lose
    those messages for good). The log's last complete epoch is then in a committed transaction that no
    writer will redo or pass over, so it is applied: the writer's next barrier names it.
    """
    mce = store.mce(entry.name) or 0
    if mce == 0:
        require_log_start(settings, entry)
    last = mce
    applied = 0
    with ChangelogReader(settings, entry.name, entry.key_columns, entry.partitions, store.index,
                         after_epoch=mce, upto_epoch=upto_epoch, proven=proven) as reader:
        backfill = BackfillReplay(entry.sources, load_positions(store.backfill_state(entry.name), entry.sources))
        seen: set[int] = set()
        for epoch in reader.epochs(idle_timeout=idle_timeout):
            store.commit(entry.name, _commit_of(entry, epoch, backfill))
            last = epoch.epoch
            applied += 1
            seen.add(epoch.epoch)
        seen.update(reader.aligner.abandoned)
        held = reader.release_held() if (reader.aligner.held_epoch or 0) <= (upto_epoch or MAX_EPOCH) else None
        if held is not None:
            seen.add(held.epoch)
            proven_by_view = not last_is_final and mce == 0 and built_upon(settings, downstreams, held.epoch,
                                                                            idle_timeout)
            if last_is_final or proven_by_view:
                store.commit(entry.name, _commit_of(entry, held, backfill))
                last = held.epoch
                applied += 1
                held = None
                if proven_by_view:
                    log.warning("%s: its last epoch %d is proven committed by a view built on it", entry.name, last)
        max_seen = max(reader.max_seen_epoch, last)
    if applied:
        log.info("%s: rolled Redis forward by %d epoch(s) to %d", entry.name, applied, last)
    return LogTail(last, max_seen, held, frozenset(seen), backfill)


def commit_held(store: ViewStore, entry: CatalogEntry, tail: LogTail) -> int:
    """Apply the epoch ``tail`` held back, on the caller's proof that it committed (a view built on it,
    found after this roll-forward); returns it."""
    assert tail.held is not None and tail.backfill is not None
    store.commit(entry.name, _commit_of(entry, tail.held, tail.backfill))
    log.warning("%s: its last epoch %d is proven committed by a view built on it", entry.name, tail.held.epoch)
    return tail.held.epoch


def built_upon(settings: Settings, views: Sequence[CatalogEntry], epoch: int, idle_timeout: float = 1.5) -> bool:
    """Whether one of ``views`` has a complete epoch ``epoch`` in its changelog, committed or not."""
    for view in views:
        with ChangelogReader(settings, view.name, view.key_columns, view.partitions, None) as reader:
            for found in reader.epochs(idle_timeout=idle_timeout):
                if found.epoch == epoch:
                    return True
                if found.epoch > epoch:
                    break
            if epoch in reader.aligner.abandoned or reader.aligner.held_epoch == epoch:
                return True
    return False


def _commit_of(entry: CatalogEntry, epoch: Epoch, backfill: BackfillReplay) -> EpochCommit:
    """What the epoch committed to Redis when it was written, as far as its changelog says."""
    mutation = epoch.mutation
    if mutation is None or mutation.kind != BACKFILL_MUTATION:
        return commit_from_changes(entry.key_columns, epoch.epoch, epoch.changes, epoch.index)
    fields, journal = backfill.apply(epoch.epoch, mutation.payload)
    lifecycle = Lifecycle.LIVE if backfill.done else Lifecycle.BACKFILLING
    return commit_from_changes(entry.key_columns, epoch.epoch, epoch.changes, epoch.index, backfill=fields,
                               journal=journal, lifecycle=lifecycle.value)
