"""The pure side of snapshots: netting, retention of snapshots, the Kafka retention check, --backfill auto."""

from __future__ import annotations

import random

import pytest

from mvlog.changes import Change, IndexEntry, Op
from mvlog.epoch import epoch_from_millis
from mvlog.snapshot_plan import (
    KAFKA_DEFAULT_RETENTION_MS,
    RetentionCheck,
    SnapshotError,
    SnapshotRecord,
    choose_backfill,
    first_needed_offset,
    net_changes,
    retention_ms_of,
    snapshot_age_ms,
    snapshots_to_drop,
    uncovered_partitions,
)


def _record(epoch: int, view: str = "t1") -> SnapshotRecord:
    return SnapshotRecord(view, epoch, f"/s/{view}/epoch={epoch}", 10, 0, 1)


def test_net_changes_last_write_wins_and_deletes_remove() -> None:
    base = {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": 2}}
    changes = [Change(Op.UPDATE, (1,), {"id": 1, "v": 1}, {"id": 1, "v": 10}),
               Change(Op.DELETE, (2,), {"id": 2, "v": 2}, None),
               Change(Op.CREATE, (3,), None, {"id": 3, "v": 3}),
               Change(Op.UPDATE, (1,), {"id": 1, "v": 10}, {"id": 1, "v": 11}),
               Change(Op.CREATE, (2,), None, {"id": 2, "v": 20}),
               Change(Op.DELETE, (3,), {"id": 3, "v": 3}, None)]
    assert net_changes(base, changes) == {(1,): {"id": 1, "v": 11}, (2,): {"id": 2, "v": 20}}
    assert base == {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": 2}}  # not modified


def test_net_changes_is_associative_over_a_split_log() -> None:
    """snapshot(E2) = snapshot(E1) + changelog(E1, E2] for any split point E1."""
    rng = random.Random(3)
    rows: dict[tuple[int], dict[str, int]] = {}
    log: list[Change] = []
    for _ in range(400):
        key = (rng.randrange(30),)
        if key in rows and rng.random() < 0.3:
            log.append(Change(Op.DELETE, key, rows.pop(key), None))
        else:
            after = {"id": key[0], "v": rng.randrange(100)}
            log.append(Change(Op.UPDATE, key, rows[key], after) if key in rows else Change(Op.CREATE, key, None, after))
            rows[key] = after
    for split in (0, 1, 137, 399, 400):
        assert net_changes(net_changes({}, log[:split]), log[split:]) == rows == net_changes({}, log)


def test_snapshots_beyond_keep_are_dropped_oldest_first() -> None:
    records = [_record(e) for e in (30, 10, 40, 20)]
    assert [r.epoch for r in snapshots_to_drop(records, 2)] == [20, 10]
    assert snapshots_to_drop(records, 4) == []
    with pytest.raises(ValueError):
        snapshots_to_drop(records, 0)


def test_record_round_trips_through_json() -> None:
    record = SnapshotRecord("mv1", 1 << 40, "/x/epoch=1", 7, 3, 99)
    assert SnapshotRecord.from_json(record.to_json()) == record


def test_retention_warning_when_retention_is_shorter_than_the_interval() -> None:
    hour = 3_600_000
    short = RetentionCheck("p.t1.changelog", 5000, hour).warning()
    assert short is not None and "p.t1.changelog" in short and "5 s" in short and "1 h" in short
    assert RetentionCheck("p.t1.changelog", 2 * hour, hour).warning() is None
    assert RetentionCheck("p.t1.changelog", None, hour).warning() is None  # unlimited
    # Long enough for the interval, but the last snapshot is older than retention.
    late = RetentionCheck("p.t1.changelog", 2 * hour, hour, since_last_ms=3 * hour).warning()
    assert late is not None and "since the last snapshot (3 h)" in late
    unread = RetentionCheck("p.t1.changelog", None, hour, unknown="denied").warning()
    assert unread is not None and "could not read" in unread and "denied" in unread


def test_retention_of_a_topic_config() -> None:
    assert retention_ms_of({"retention.ms": "5000"}) == 5000
    assert retention_ms_of({"retention.ms": "-1"}) is None
    assert retention_ms_of({}) == KAFKA_DEFAULT_RETENTION_MS


def test_snapshot_age_from_epochs() -> None:
    assert snapshot_age_ms(epoch_from_millis(1000, 3), epoch_from_millis(61_000)) == 60_000
    assert snapshot_age_ms(epoch_from_millis(5000), epoch_from_millis(1000)) == 0


def test_uncovered_partitions() -> None:
    assert uncovered_partitions({0: 0, 1: 11, 2: 5}, {0: 4, 1: 11, 2: 4}) == [2]
    assert uncovered_partitions({0: 0}, {0: None}) == [0]


def test_first_needed_offset_skips_the_commit_markers_retention_may_delete() -> None:
    """E1's barrier at 10, its commit marker at 11, an aborted attempt at 12-14 and its abort marker at 15;
    the next epoch's two changes at 16-17, its barrier at 18: the log must hold 16 on."""
    epoch = epoch_from_millis(1000)
    e1, e2 = IndexEntry(epoch, 10, 4), IndexEntry(epoch + 1, 18, 2)
    needed = first_needed_offset(e1, e2)
    assert needed == 16
    assert uncovered_partitions({0: 12, 1: 16, 2: 17}, {0: needed, 1: needed, 2: needed}) == [2]
    assert first_needed_offset(e1, None) == 11  # no epoch after E1 yet: everything after its barrier
    assert first_needed_offset(None, e2) is None  # E1 not indexed in that partition


def test_auto_picks_snapshot_only_for_a_large_upstream_with_a_snapshot() -> None:
    snap = {"t1": _record(5)}
    assert choose_backfill("auto", ("t1",), snap, {"t1": 101}, 100).method == "snapshot"
    assert choose_backfill("auto", ("t1",), snap, {"t1": 100}, 100).method == "chunked"
    assert choose_backfill("auto", ("t1",), {"t1": None}, {"t1": 10**6}, 100).method == "chunked"
    assert choose_backfill("auto", ("t1", "t2"), {"t1": _record(5), "t2": _record(5, "t2")},
                           {"t1": 10**6, "t2": 10**6}, 100).method == "chunked"
    assert choose_backfill("snapshot", ("t1",), snap, {"t1": 1}, 100).method == "snapshot"
    assert choose_backfill("changelog", ("t1",), {}, {}, 100).method == "changelog"
    with pytest.raises(SnapshotError, match="no snapshot"):
        choose_backfill("snapshot", ("t1",), {"t1": None}, {"t1": 1}, 100)
    with pytest.raises(SnapshotError, match="cannot backfill a join"):
        choose_backfill("snapshot", ("t1", "t2"), snap, {}, 100)
    # A self-join reads one upstream, but its state holds two sides: never from a snapshot.
    with pytest.raises(SnapshotError, match=r"cannot backfill a join .* use chunked"):
        choose_backfill("snapshot", ("t1",), snap, {"t1": 10**6}, 100, join=True)
    assert choose_backfill("auto", ("t1",), snap, {"t1": 10**6}, 100, join=True).method == "chunked"
    # A view whose state a seed does not build (a top-N): chunked, saying why.
    with pytest.raises(SnapshotError, match=r"cannot backfill view 'v' is a top-N.*: use chunked"):
        choose_backfill("snapshot", ("t1",), snap, {"t1": 10**6}, 100, unseedable="view 'v' is a top-N")
    auto = choose_backfill("auto", ("t1",), snap, {"t1": 10**6}, 100, unseedable="view 'v' is a top-N")
    assert (auto.method, auto.reason) == ("chunked", "view 'v' is a top-N")
    with pytest.raises(SnapshotError, match="unknown"):
        choose_backfill("fast", ("t1",), snap, {}, 100)
