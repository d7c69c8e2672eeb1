"""A cache worker's feed (pure, over encoded records in consume batches): runs decoded once into Arrow IPC
messages, epochs aligned on barriers; an epoch is kept only up to the feed's budget (I4); past it, the
epoch still aligns and commits, and the cache skips it."""

from __future__ import annotations

import pyarrow as pa

from mvlog.barrier_alignment import EpochAligner
from mvlog.catalog import CatalogEntry
from mvlog.changes import Barrier, Change, Epoch, Op
from mvlog.log_cache import CachedEpoch, LogCache, RangeStatus
from mvlog.row_schema import RowSchema
from mvlog.schemas.codec import HEADER_TYPE, TYPE_BARRIER, TYPE_CHANGE, encode_barrier, encode_change, encode_key
from mvlog.services.log_cache.feed import IpcParts, Record, UpstreamFeed, partition_slices, reply_buffers

SCHEMA = RowSchema.of({"id": "int", "pad": "string"}, ["id"])
ENTRY = CatalogEntry("t1", "table", SCHEMA, 2)


class _Log:
    """Two partitions of a changelog written record by record, as a writer would."""

    def __init__(self) -> None:
        self.offsets = [0, 0]
        self.prev = 0

    def record(self, partition: int, kind: bytes, key: bytes, value: bytes) -> Record:
        record = Record(partition, self.offsets[partition], key, value, [(HEADER_TYPE, kind)])
        self.offsets[partition] += 1
        return record

    def change(self, partition: int, epoch: int, row_id: int, pad: int, txn: str) -> Record:
        change = Change(Op.CREATE, (row_id,), None, {"id": row_id, "pad": "x" * pad})
        return self.record(partition, TYPE_CHANGE, encode_key(("id",), change.key),
                           encode_change("t1", epoch, 0, change, 0, txn=txn))

    def epoch(self, epoch: int, rows: int, pad: int) -> list[Record]:
        records, counts = [], [0, 0]
        for i in range(rows):
            records.append(self.change(i % 2, epoch, epoch * 1000 + i, pad, f"tx{epoch}"))
            counts[i % 2] += 1
        for partition in (0, 1):
            barrier = Barrier("t1", epoch, self.prev, True, partition, counts[partition], 0, txn=f"tx{epoch}")
            records.append(self.record(partition, TYPE_BARRIER, b"", encode_barrier(barrier)))
        self.prev = epoch
        return records


def _table(parts: IpcParts) -> pa.Table:
    schema_message = UpstreamFeed(ENTRY, [0, 1]).schema.serialize()
    stream = reply_buffers([CachedEpoch(1, 0, {0: parts}, 0)], 0, schema_message)
    return pa.ipc.open_stream(b"".join(memoryview(b) for b in stream)).read_all()


def test_an_epoch_over_the_budget_commits_and_the_cache_skips_it() -> None:
    log = _Log()
    feed = UpstreamFeed(ENTRY, [0, 1], max_epoch_bytes=4000)
    cache: LogCache[IpcParts] = LogCache(1 << 20, 100)
    committed: list[Epoch] = []
    skipped: list[int] = []
    for number, rows in ((1, 4), (2, 200), (3, 4), (4, 4)):  # epoch 2: ~200 x 60 bytes, over 4000
        records = log.epoch(number, rows, pad=40)
        for start in range(0, len(records), 16):  # consume batches of 16 records
            for epoch in feed.take(records[start:start + 16]):
                committed.append(epoch)
                cached = feed.to_cached(epoch)  # at once, as the worker does
                if cached is None:
                    skipped.append(epoch.epoch)
                    cache.skip("t1", epoch.epoch, epoch.prev_epoch)
                else:
                    cache.put("t1", cached)
            # the complete epoch held for confirmation and the open one, each within the budget, and a run
            assert feed.held_bytes <= 2 * 4000 + 1000
    assert [e.epoch for e in committed] == [1, 2, 3] and skipped == [2]
    across = cache.lookup("t1", 0, 3)
    assert (across.status, across.floor) == (RangeStatus.EVICTED, 2)  # epochs 1-2 from Kafka, 3 from memory
    assert [e.epoch for e in cache.lookup("t1", 0, 1).epochs] == [1]  # the epoch before the hole stays
    hit = cache.lookup("t1", 2, 3)
    assert hit.status is RangeStatus.HIT and [e.epoch for e in hit.epochs] == [3]
    assert len(feed._open) <= 1  # only epoch 4's attempt, complete and held for confirmation


def test_consume_batches_are_cut_by_partition_and_decoded_into_the_readers_rows() -> None:
    """Whatever the batches' cut, the cached rows are the epoch's changes in offset order per partition,
    then its barrier row, in the data source's shape; records taken already are skipped."""
    log = _Log()
    records = log.epoch(1, 7, pad=3) + log.epoch(2, 5, pad=3)
    assert [p for p, _ in partition_slices(records[:4])] == [0, 1, 0, 1]
    feed = UpstreamFeed(ENTRY, [0, 1])
    cached: list[CachedEpoch[IpcParts]] = []
    for start in range(0, len(records), 5):
        batch = records[start:start + 5]
        grouped: list[Record] = sorted(batch, key=lambda r: r.partition_)  # as librdkafka groups them
        cached += [c for e in feed.take(grouped) if (c := feed.to_cached(e)) is not None]
        assert feed.take(batch[:2]) == []  # fetched again: skipped
    assert [c.epoch for c in cached] == [1]
    assert feed.records == len(records)
    one = cached[0]
    part0 = _table(one.parts[0]).to_pylist()
    assert [(r["_change_type"], r["id"], r["_offset"]) for r in part0] == [
        ("insert", 1000, 0), ("insert", 1002, 1), ("insert", 1004, 2), ("insert", 1006, 3), ("barrier", None, 4)]
    assert all(r["_epoch"] == 1 and r["_partition"] == 0 and r["_weight"] in (0, 1) for r in part0)
    assert one.nbytes == sum(m.size for parts in one.parts.values() for m in parts)


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


def test_a_feed_holds_open_epochs_as_arrow_and_forgets_aborted_ones() -> None:
    """An open epoch waits as IPC messages (not decoded objects); what an aborted attempt left is let go."""
    log = _Log()
    feed = UpstreamFeed(ENTRY, [0, 1], max_epoch_bytes=1 << 20)
    committed: list[Epoch] = []
    epoch_one = log.epoch(1, 6, pad=10)
    committed += feed.take([*epoch_one, log.change(0, 2, 99, 1, "aborted")])
    assert committed == [] and feed.held_bytes > 0  # epoch 1 is complete, held for confirmation
    held = feed.held_bytes
    committed += feed.take(log.epoch(2, 4, pad=10))
    assert [e.epoch for e in committed] == [1]  # epoch 2 names it: committed
    assert feed.peak_held_bytes >= held and feed.peak_take_bytes > 0
    one = feed.to_cached(committed[0])
    assert one is not None
    rows = sorted(r["id"] for p in one.parts.values() for r in _table(p).to_pylist() if r["_change_type"] == "insert")
    assert rows == [1000 + i for i in range(6)]
    epoch2 = feed.confirm(2, 0, log.offsets[0] - 1)
    assert [e.epoch for e in epoch2] == [2]
    two = feed.to_cached(epoch2[0])
    assert feed.held_bytes == 0 and not feed._open  # epoch 2 released, the aborted attempt at 2 let go
    assert two is not None and sum(_table(p).num_rows for p in two.parts.values()) == 4 + 2


def test_one_consume_batch_committing_many_epochs_caches_each_with_its_changes() -> None:
    """A backlog's consume batch spans many epochs: every one it commits is cached with its changes."""
    log = _Log()
    records = [r for number in range(1, 12) for r in log.epoch(number, 4, pad=3)]
    feed = UpstreamFeed(ENTRY, [0, 1])
    grouped: list[Record] = sorted(records, key=lambda r: r.partition_)
    committed = feed.take(grouped)
    assert [e.epoch for e in committed] == list(range(1, 11))
    for epoch in committed:
        one = feed.to_cached(epoch)
        assert one is not None
        assert sum(_table(p).num_rows for p in one.parts.values()) == 4 + 2
    assert feed.held_bytes > 0 and list(feed._open) == [(11, "tx11")]  # held for confirmation
