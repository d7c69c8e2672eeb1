"""Replay arithmetic without I/O: retained ranges, where a partition's re-delivery starts, times and durations."""

from __future__ import annotations

import pytest

from mvlog.changes import IndexEntry
from mvlog.epoch import epoch_from_millis
from mvlog.replay import (
    ReplayRangeError,
    parse_datetime_ms,
    parse_duration_ms,
    partition_start,
    retained_range,
)

E1, E2, E3 = epoch_from_millis(1_000), epoch_from_millis(2_000), epoch_from_millis(3_000)


def test_retained_range_is_what_every_partition_serves() -> None:
    oldest = {0: IndexEntry(E1, 4, 1), 1: IndexEntry(E2, 9, 0)}  # partition 1 lost E1 to retention
    latest = {0: IndexEntry(E3, 40, 2), 1: IndexEntry(E3, 50, 1)}
    retained = retained_range("v", oldest, latest)
    assert (retained.oldest, retained.latest) == (E2, E3)
    retained.check_epoch(E2)
    with pytest.raises(ReplayRangeError, match=f"older than the oldest retained epoch {E2}"):
        retained.check_epoch(E1)
    with pytest.raises(ReplayRangeError, match="above the last committed epoch"):
        retained.check_epoch(E3 + 1)
    with pytest.raises(ReplayRangeError, match=f"before retention: the oldest retained epoch is {E2}"):
        retained.check_time(1_500)
    retained.check_time(2_000)  # the millisecond of the oldest epoch is still retained
    with pytest.raises(ReplayRangeError, match="no committed epoch yet"):
        retained_range("v", {0: None}, {0: None})
    with pytest.raises(ReplayRangeError, match="retention deleted every indexed epoch"):
        retained_range("v", {0: None}, {0: IndexEntry(E3, 20, 2)})


def test_partition_start_is_the_record_after_the_previous_barrier() -> None:
    entries = [IndexEntry(E2, 12, 3), IndexEntry(E3, 20, 2)]
    start = partition_start(1, IndexEntry(E1, 7, 1), entries)
    assert (start.offset, start.end_offset, start.epochs, start.changes, start.records) == (8, 21, 2, 5, 13)
    first = partition_start(0, None, [IndexEntry(E1, 3, 3)], log_start=0)
    assert (first.offset, first.records) == (0, 4)
    to_end = partition_start(0, IndexEntry(E3, 20, 2), [])
    assert (to_end.offset, to_end.records, to_end.epochs) == (21, 0, 0)


def test_partition_start_when_retention_took_the_previous_epoch_and_its_commit_marker() -> None:
    """E1's barrier at 7 and its commit marker at 8 are gone (the log starts at 9, E2's first change):
    E2 is whole and starts at the log's start; a log starting at 10 lost one of E2's changes."""
    entries = [IndexEntry(E2, 12, 3), IndexEntry(E3, 20, 2)]
    start = partition_start(1, IndexEntry(E1, 7, 1), entries, log_start=9)
    assert (start.offset, start.epochs, start.changes) == (9, 2, 5)
    with pytest.raises(ReplayRangeError, match="starts at offset 9 of partition 1, which retention deleted"):
        partition_start(1, IndexEntry(E1, 7, 1), entries, log_start=10)


def test_times_and_durations() -> None:
    assert parse_duration_ms("10m") == 600_000 and parse_duration_ms("1.5s") == 1_500
    assert parse_duration_ms(" 2 h ") == 7_200_000 and parse_duration_ms("500ms") == 500
    with pytest.raises(ValueError, match="expected a number and a unit"):
        parse_duration_ms("ten minutes")
    assert parse_datetime_ms("1970-01-01T00:00:01") == 1_000  # UTC without an offset
    assert parse_datetime_ms("1970-01-01T01:00:01+01:00") == 1_000
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_datetime_ms("yesterday")
