"""Snapshots of a view's rows at an epoch, and the choices around them (pure: no I/O).

A snapshot of view ``v`` at epoch ``E`` is ``rows(v, E)`` as Parquet, one folder per vnode, each sorted
by primary key. It is built incrementally: snapshot(E2) = snapshot(E1) + changelog(E1, E2], netted per
key (the last change of a key wins; a key whose last change is a delete is gone). That only works while
Kafka still holds changelog(E1, E2]: its retention must cover the time between two snapshots, which
:func:`retention_warning` checks. :func:`choose_backfill` is the ``--backfill auto`` rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from mvlog.changes import Change, IndexEntry, Op
from mvlog.epoch import epoch_millis
from mvlog.row_schema import Key, Row

#: Kafka's broker default ``log.retention.ms`` (7 days): what a topic without its own retention.ms gets.
KAFKA_DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000


class SnapshotError(RuntimeError):
    """A snapshot that cannot be built or used (the message says why and what to do)."""


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot as recorded in Redis: where it is and what it holds."""

    view: str
    epoch: int
    path: str
    rows: int
    base_epoch: int  # the snapshot it was built from (0: built from the changelog's start)
    created_ms: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SnapshotRecord:
        data = json.loads(text)
        return cls(str(data["view"]), int(data["epoch"]), str(data["path"]), int(data["rows"]),
                   int(data["base_epoch"]), int(data["created_ms"]))


def snapshots_to_drop(records: Sequence[SnapshotRecord], keep: int) -> list[SnapshotRecord]:
    """The snapshots beyond the newest ``keep`` (by epoch): retention deletes them."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    return sorted(records, key=lambda r: r.epoch, reverse=True)[keep:]


def net_changes(base: Mapping[Key, Row], changes: Iterable[Change]) -> dict[Key, Row]:
    """``base`` with ``changes`` (in log order) applied: last write per key wins, deletes remove.

    The reference for what the Spark job computes with a window per key.
    """
    rows = dict(base)
    for change in changes:
        if change.op is Op.DELETE:
            rows.pop(change.key, None)
        else:
            assert change.after is not None
            rows[change.key] = change.after
    return rows


def net_sql(table: str) -> str:
    """Spark SQL over ``table`` (signed rows: the base snapshot as +1 rows at ``_epoch`` E1 and the
    changelog's rows after it, with ``_key``, ``_epoch``, ``_offset``, ``_weight``): each key's last row.

    A key's changes all sit in one partition, so (epoch, offset) orders them; the pre- and post-image of
    an update share their offset and the post-image (+1) wins. A last row of weight -1 is a delete.
    """
    return (f"SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY `_key` "
            f"ORDER BY `_epoch` DESC, `_offset` DESC, `_weight` DESC) AS `_rank` FROM `{table}`) "
            f"WHERE `_rank` = 1 AND `_weight` > 0")


def uncovered_partitions(low_watermarks: Mapping[int, int], needed: Mapping[int, int | None]) -> list[int]:
    """Partitions whose log no longer holds every change after the base snapshot's epoch E1, so
    changelog(E1, ...] is incomplete. ``needed``: per partition, the first offset that must still be
    there (:func:`first_needed_offset`; None: E1 is not indexed there)."""
    return [partition for partition, low in sorted(low_watermarks.items())
            if (offset := needed.get(partition)) is None or low > offset]


def first_needed_offset(barrier: IndexEntry | None, after: IndexEntry | None) -> int | None:
    """The first offset of a partition that changelog(E1, ...] needs: the first change of the epoch after
    E1 (``after``; its commit marker and E1's may be gone, :attr:`IndexEntry.first_offset`), or the
    offset after E1's barrier (``barrier``) when no epoch followed yet; None when E1 is not indexed."""
    if barrier is None:
        return None
    return after.first_offset if after is not None else barrier.offset + 1


def _duration(ms: int) -> str:
    if ms % 3_600_000 == 0 and ms >= 3_600_000:
        return f"{ms // 3_600_000} h"
    if ms % 60_000 == 0 and ms >= 60_000:
        return f"{ms // 60_000} min"
    return f"{ms / 1000:g} s"


def snapshot_age_ms(snapshot_epoch: int, now_epoch: int) -> int:
    """Time between two epochs (epochs carry wall-clock milliseconds)."""
    return max(0, epoch_millis(now_epoch) - epoch_millis(snapshot_epoch))


@dataclass(frozen=True)
class RetentionCheck:
    """Does the changelog's retention cover the time between two snapshots?"""

    topic: str
    retention_ms: int | None  # the topic's retention.ms; None: unlimited (-1)
    interval_ms: int  # the configured snapshot interval
    since_last_ms: int | None = None  # time since the last snapshot's epoch (None: no snapshot yet)
    unknown: str = ""  # why the topic's retention could not be read ("" when it was)

    @property
    def needed_ms(self) -> int:
        return max(self.interval_ms, self.since_last_ms or 0)

    def warning(self) -> str | None:
        """A message saying what goes wrong and what to do, or None when retention is long enough."""
        if self.unknown:
            return (f"could not read the Kafka retention of {self.topic} ({self.unknown}): make sure it covers "
                    f"the snapshot interval ({_duration(self.interval_ms)})")
        if self.retention_ms is None or self.retention_ms >= self.needed_ms:
            return None
        what = (f"the snapshot interval ({_duration(self.interval_ms)})" if self.needed_ms == self.interval_ms
                else f"the time since the last snapshot ({_duration(self.needed_ms)})")
        return (f"Kafka retention of {self.topic} ({_duration(self.retention_ms)}) is shorter than {what}: "
                f"changes may be deleted before a snapshot folds them in, and then the next snapshot cannot "
                f"be built from the last one nor a view be backfilled from it. Raise the topic's retention.ms "
                f"to at least {self.needed_ms} or take snapshots more often (MVLOG_SNAPSHOT_INTERVAL_MS).")


def retention_ms_of(config: Mapping[str, str]) -> int | None:
    """A topic's retention from its configuration (absent: the broker default, 7 days; -1: unlimited)."""
    value = config.get("retention.ms")
    if value is None:
        return KAFKA_DEFAULT_RETENTION_MS
    ms = int(value)
    return None if ms < 0 else ms


#: Backfill methods a user can ask for; ``auto`` resolves to one of the others at create time.
CONCRETE_BACKFILLS: tuple[str, ...] = ("chunked", "changelog", "snapshot")


@dataclass(frozen=True)
class BackfillChoice:
    method: str
    reason: str


def choose_backfill(requested: str, sources: Sequence[str], snapshots: Mapping[str, SnapshotRecord | None],
                    upstream_rows: Mapping[str, int], threshold: int, *, join: bool = False,
                    unseedable: str | None = None) -> BackfillChoice:
    """The backfill method of a new view: as requested, or for ``auto`` snapshot when its one upstream
    has a snapshot and holds more than ``threshold`` rows, else chunked.

    ``snapshot`` itself is refused when it cannot work: a join (of two views, or of one view with
    itself: its state holds both sides, which one snapshot does not seed), a view whose state no seed
    builds (``unseedable`` says why, e.g. a top-N), or no snapshot of the upstream."""
    if requested not in (*CONCRETE_BACKFILLS, "auto"):
        raise SnapshotError(f"unknown backfill method {requested!r}; known: "
                            f"{', '.join((*CONCRETE_BACKFILLS, 'auto'))}")
    if requested in ("chunked", "changelog"):
        return BackfillChoice(requested, "requested")
    if len(sources) != 1 or join:
        if requested == "snapshot":
            raise SnapshotError("--backfill snapshot cannot backfill a join (its state holds both sides at one "
                                "epoch; snapshot backfill seeds a view from one upstream's snapshot): use chunked")
        return BackfillChoice("chunked", "a join: snapshot backfill seeds a view from one upstream's snapshot")
    if unseedable is not None:
        if requested == "snapshot":
            raise SnapshotError(f"--backfill snapshot cannot backfill {unseedable}: use chunked")
        return BackfillChoice("chunked", unseedable)
    (source,) = sources
    snapshot = snapshots.get(source)
    if snapshot is None:
        if requested == "snapshot":
            raise SnapshotError(f"{source} has no snapshot: take one first (mvlog snapshot {source})")
        return BackfillChoice("chunked", f"{source} has no snapshot")
    if requested == "snapshot":
        return BackfillChoice("snapshot", "requested")
    rows = upstream_rows.get(source, 0)
    if rows > threshold:
        return BackfillChoice("snapshot", f"{source} has a snapshot at epoch {snapshot.epoch} and {rows} rows "
                                          f"(more than {threshold})")
    return BackfillChoice("chunked", f"{source} has {rows} rows (at most {threshold})")
