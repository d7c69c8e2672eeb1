"""The Redis view store's epoch commit: atomic, chunked for large epochs, never applied twice."""

from __future__ import annotations

import redis

from mvlog.changes import IndexEntry
from mvlog.config import Settings
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.view_store import EpochCommit, ViewStore


def test_commit_applies_large_epochs_once_and_refuses_epochs_at_or_below_the_mce(
        settings: Settings, redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    puts = {f"k{i}".encode(): f"v{i}".encode() for i in range(50_000)}  # many Lua chunks
    assert store.commit("v", EpochCommit(10, puts, [], {0: IndexEntry(10, 5, 1)}, {b"s": b"x"}))
    assert store.row_count("v") == 50_000 and store.mce("v") == 10
    assert store.get_rows("v", [b"k49999"]) == {b"k49999": b"v49999"}

    deletes = [f"k{i}".encode() for i in range(1_000)]
    assert store.commit("v", EpochCommit(11, {b"new": b"1"}, deletes, {0: IndexEntry(11, 7, 1)},
                                         state_deletes=[b"s"]))
    assert store.row_count("v") == 49_001 and store.get_state("v", [b"s"]) == {}

    # A retry of an applied epoch (or an older one) changes nothing.
    assert not store.commit("v", EpochCommit(11, {b"zombie": b"1"}, [], {0: IndexEntry(11, 7, 1)}))
    assert not store.commit("v", EpochCommit(9, {b"zombie": b"1"}, [], {0: IndexEntry(9, 1, 1)}))
    assert store.get_rows("v", [b"zombie"]) == {} and store.mce("v") == 11
    assert [e.epoch for e in store.index.between("v", 0, 0, 100)] == [10, 11]


def test_epoch_index_counts_epochs_and_records_after_an_epoch(redis_client: redis.Redis, settings: Settings) -> None:
    index = EpochIndex(redis_client, settings.topic_prefix)
    epochs = [(1 << 60) + i * 65536 for i in range(5)]  # beyond a double's exact integers
    for n, epoch in enumerate(epochs):
        index.add("v", {0: IndexEntry(epoch, 10 * n, n), 1: IndexEntry(epoch, 20 * n, 2 * n)})

    assert index.count_after("v", None) == 5
    assert index.count_after("v", epochs[1]) == 3
    assert index.count_after("v", epochs[4]) == 0
    assert index.count_after("v", epochs[1] + 1) == 3  # an epoch between two indexed ones
    assert index.records_after("v", 2, epochs[2]) == (3 + 4) * 3
    assert index.records_after("v", 2, None) == sum(range(5)) * 3


def test_first_retained_is_the_oldest_epoch_whose_changes_are_all_above_the_low_watermark(
        redis_client: redis.Redis, settings: Settings) -> None:
    """Each epoch: 3 changes, its barrier, the transaction's commit marker (6 offsets per epoch)."""
    index = EpochIndex(redis_client, settings.topic_prefix)
    epochs = [(1 << 60) + i * 65536 for i in range(50)]
    for n, epoch in enumerate(epochs):
        index.add("r", {0: IndexEntry(epoch, 6 * n + 3, 3)})
    assert index.first_retained("r", 0, 0) == IndexEntry(epochs[0], 3, 3)
    for n in (1, 17, 49):
        start = 6 * n
        assert index.first_retained("r", 0, start) == IndexEntry(epochs[n], start + 3, 3)  # marker gone too
        assert index.first_retained("r", 0, start - 1) == IndexEntry(epochs[n], start + 3, 3)  # only the marker left
        after = IndexEntry(epochs[n + 1], start + 9, 3) if n < 49 else None
        assert index.first_retained("r", 0, start + 1) == after  # one change of epoch n deleted
    assert index.first_retained("r", 0, 6 * 50) is None
    assert index.first_retained("none", 0, 0) is None
