"""A cache worker's feed (pure, over encoded records): an epoch is kept decoded only up to the feed's
budget (I4); past it, the epoch still aligns and commits, marked as dropped, and the cache skips it."""

from __future__ import annotations

from mvlog.barrier_alignment import EpochAligner
from mvlog.catalog import CatalogEntry
from mvlog.changes import Barrier, Change, Epoch, Op
from mvlog.log_cache import LogCache, RangeStatus
from mvlog.row_schema import RowSchema
from mvlog.schemas.codec import TYPE_BARRIER, TYPE_CHANGE, encode_barrier, encode_change, encode_key
from mvlog.services.log_cache.feed import RawRecord, UpstreamFeed

SCHEMA = RowSchema.of({"id": "int", "pad": "string"}, ["id"])
ENTRY = CatalogEntry("t1", "table", SCHEMA, 2)


class _Log:
    """Two partitions of a changelog written record by record, as a writer would."""

    def __init__(self) -> None:
        self.offsets = [0, 0]
        self.prev = 0

    def _record(self, partition: int, kind: bytes, key: bytes, value: bytes) -> RawRecord:
        record = RawRecord(partition, self.offsets[partition], kind, key, value)
        self.offsets[partition] += 1
        return record

    def epoch(self, epoch: int, rows: int, pad: int) -> list[RawRecord]:
        records, counts = [], [0, 0]
        for i in range(rows):
            partition = i % 2
            change = Change(Op.CREATE, (epoch * 1000 + i,), None, {"id": epoch * 1000 + i, "pad": "x" * pad})
            records.append(self._record(partition, TYPE_CHANGE, encode_key(("id",), change.key),
                                        encode_change("t1", epoch, 0, change, 0, txn=f"tx{epoch}")))
            counts[partition] += 1
        for partition in (0, 1):
            barrier = Barrier("t1", epoch, self.prev, True, partition, counts[partition], 0, txn=f"tx{epoch}")
            records.append(self._record(partition, TYPE_BARRIER, b"", encode_barrier(barrier)))
        self.prev = epoch
        return records


def test_an_epoch_over_the_budget_commits_dropped_and_the_cache_skips_it() -> None:
    log = _Log()
    feed = UpstreamFeed(ENTRY, [0, 1], max_epoch_bytes=4000)
    cache: LogCache[object] = LogCache(1 << 20, 100)
    committed: list[Epoch] = []
    for number, rows in ((1, 4), (2, 200), (3, 4), (4, 4)):  # epoch 2: ~200 x 60 bytes, over 4000
        for record in log.epoch(number, rows, pad=40):
            committed += feed.add(record)
        if feed.aligner is not None:
            assert feed.aligner.buffered_changes() <= 4000 // 40  # never more than the budget's worth
    assert [(e.epoch, len(e.changes), e.dropped) for e in committed] == [(1, 4, 0), (2, 0, 200), (3, 4, 0)]
    for epoch in committed:
        if epoch.dropped:
            cache.skip("t1", epoch.epoch, epoch.prev_epoch)
        else:
            cache.put("t1", feed.to_cached(epoch))
    assert cache.lookup("t1", 0, 3).status is RangeStatus.EVICTED  # epochs 1-2: from Kafka
    hit = cache.lookup("t1", 2, 3)
    assert hit.status is RangeStatus.HIT and [e.epoch for e in hit.epochs] == [3]
    assert not feed._open_bytes and not feed._over_budget  # bookkeeping of sealed epochs is gone


def test_aligner_counts_dropped_changes_towards_the_barrier() -> None:
    aligner = EpochAligner("v", range(2))
    c = Change(Op.CREATE, (1,), None, {"id": 1})
    aligner.add_change(0, 10, c, "a")
    aligner.add_change(0, 10, c, "a")
    aligner.add_barrier(0, Barrier("v", 10, 0, True, 0, 2, 0, txn="a"), offset=2)
    aligner.add_change(1, 10, c, "a")
    aligner.drop(10, "a")  # sealed in partition 0, open in partition 1: both dropped
    aligner.count_change(1, 10, "a")
    assert aligner.buffered_changes() == 0
    aligner.add_barrier(1, Barrier("v", 10, 0, True, 1, 2, 0, txn="a"), offset=2)
    (epoch,) = aligner.confirm(10, {0: 2, 1: 2})
    assert (epoch.changes, epoch.dropped) == ([], 4)


def test_a_feed_holds_records_undecoded_until_the_epoch_commits_and_forgets_aborted_ones() -> None:
    """Changes wait as their records' bytes (I4: a decoded change is ~3.6x its record); the cached
    batches are decoded from them at commit, and what an aborted attempt left is let go."""
    log = _Log()
    feed = UpstreamFeed(ENTRY, [0, 1], max_epoch_bytes=1 << 20)
    committed: list[Epoch] = []
    epoch_one = log.epoch(1, 6, pad=10)
    aborted = [RawRecord(0, log.offsets[0], TYPE_CHANGE, encode_key(("id",), (99,)),
                         encode_change("t1", 2, 0, Change(Op.CREATE, (99,), None, {"id": 99, "pad": "y"}), 0,
                                       txn="aborted"))]
    log.offsets[0] += 1
    for record in epoch_one + aborted:
        committed += feed.add(record)
    assert committed == [] and feed.held_bytes > 0  # epoch 1 is complete, held for confirmation
    held = feed.held_bytes
    for record in log.epoch(2, 4, pad=10):
        committed += feed.add(record)
    assert [e.epoch for e in committed] == [1]  # epoch 2 names it: committed
    assert feed.peak_held_bytes >= held and 0 < feed.held_bytes < held
    batches = feed.to_cached(committed[0]).parts
    rows = sorted(r["id"] for b in batches.values() for r in b.to_pylist() if r["_change_type"] == "insert")
    assert rows == [1000 + i for i in range(6)]
    assert (epoch2 := feed.confirm(2, 0, log.offsets[0] - 1)) and epoch2[0].epoch == 2
    assert feed.held_bytes == 0 and not feed._held  # epoch 2 released, the aborted attempt at 2 let go
    assert sum(b.num_rows for b in feed.to_cached(epoch2[0]).parts.values()) == 4 + 2
