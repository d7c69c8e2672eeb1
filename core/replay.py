"""Replay arithmetic: which epochs a request names, whether they are retained, where each partition starts.

Pure logic shared by ``mvlog replay`` (both forms) and its tests. Positions come from the epoch index
(epoch -> barrier offset per partition): the first record of epoch ``e`` in a partition is the record
after the barrier of the epoch before ``e``, so "re-deliver from epoch e" is an offset per partition
that never needs a scan and never trusts the broker's high watermark.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from mvlog.changes import IndexEntry
from mvlog.epoch import epoch_from_millis, epoch_millis


class ReplayRangeError(ValueError):
    """A replay request outside what the changelog retains (the message names the retained range)."""


class ReplayTargetError(ValueError):
    """Where the replay would write is not acceptable (an existing view's changelog, a used name)."""


def describe(epoch: int) -> str:
    moment = datetime.fromtimestamp(epoch_millis(epoch) / 1000, tz=UTC)
    return f"{epoch} ({moment.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} UTC)"


@dataclass(frozen=True)
class RetainedRange:
    """The epochs a changelog can replay: ``oldest`` to ``latest`` (both committed and indexed)."""

    view: str
    oldest: int
    latest: int

    def check_epoch(self, epoch: int, what: str = "epoch") -> None:
        if epoch < self.oldest:
            raise ReplayRangeError(
                f"{self.view}: {what} {describe(epoch)} is older than the oldest retained epoch "
                f"{describe(self.oldest)}; the retained range is {self.oldest} to {self.latest}")
        if epoch > self.latest:
            raise ReplayRangeError(
                f"{self.view}: {what} {describe(epoch)} is above the last committed epoch {describe(self.latest)}; "
                f"the retained range is {self.oldest} to {self.latest}")

    def check_time(self, millis: int) -> None:
        if epoch_from_millis(millis + 1) <= self.oldest:
            moment = datetime.fromtimestamp(millis / 1000, tz=UTC).isoformat()
            raise ReplayRangeError(
                f"{self.view}: {moment} is before retention: the oldest retained epoch is {describe(self.oldest)}")


def retained_range(view: str, oldest: Mapping[int, IndexEntry | None],
                   latest: Mapping[int, IndexEntry | None]) -> RetainedRange:
    """The range every partition can serve, from each partition's oldest retained and latest index entries.

    ``oldest``: per partition, the first indexed epoch whose records Kafka still holds whole
    (``connectors.retention.retained_epochs`` compares the index with the low watermarks; None when
    retention deleted them all).
    """
    if not latest or any(e is None for e in latest.values()):
        raise ReplayRangeError(f"{view}: no committed epoch yet, nothing to replay")
    if not oldest or any(e is None for e in oldest.values()):
        raise ReplayRangeError(f"{view}: retention deleted every indexed epoch, nothing to replay")
    first = max(e.epoch for e in oldest.values() if e is not None)
    last = min(e.epoch for e in latest.values() if e is not None)
    return RetainedRange(view, first, last)


@dataclass(frozen=True)
class PartitionStart:
    """Where one partition's re-delivery starts and how much it re-delivers."""

    partition: int
    offset: int  # the first record of the target epoch in this partition
    end_offset: int  # one past the last committed barrier
    epochs: int  # committed epochs re-delivered
    changes: int  # their change events (barriers not counted)

    @property
    def records(self) -> int:
        """Records from ``offset`` to the end: changes, barriers, and any aborted records in between."""
        return max(0, self.end_offset - self.offset)


def partition_start(partition: int, previous: IndexEntry | None, entries: list[IndexEntry],
                    log_start: int = 0) -> PartitionStart:
    """``entries``: the index entries from the target epoch on; ``previous``: the one before it;
    ``log_start``: the partition's low watermark.

    The re-delivery starts after the previous barrier, or at the log's start when retention deleted that
    barrier's commit marker (and the aborted attempts after it) but none of the target epoch's records;
    ReplayRangeError when it deleted some of those (:attr:`IndexEntry.first_offset`).
    """
    if entries and entries[0].first_offset < log_start:
        raise ReplayRangeError(f"epoch {entries[0].epoch} starts at offset {entries[0].first_offset} of partition "
                               f"{partition}, which retention deleted (the log starts at offset {log_start})")
    offset = max(previous.offset + 1, log_start) if previous is not None else log_start
    end = entries[-1].offset + 1 if entries else offset
    return PartitionStart(partition, offset, end, len(entries), sum(e.records for e in entries))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``90s``, ``10m``, ``2h``, ``1d``, ``500ms`` as milliseconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"duration {text!r}: expected a number and a unit (ms, s, m, h, d), e.g. 10m")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)])


def parse_datetime_ms(text: str) -> int:
    """An ISO 8601 date-time (UTC when it has no offset) as epoch milliseconds."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"date-time {text!r}: expected ISO 8601, e.g. 2026-11-23T11:20:00 (UTC) "
                         "or 2026-11-23T12:20:00+01:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
