"""One upstream's records, as a worker's Faust stream delivers them, turned into cacheable epochs.

A worker starts reading its partitions wherever its consumer group left off (or at the start), which
may be in the middle of an epoch. So a partition's records before its first barrier are skipped (unless
it starts at offset 0, the log's start), and once every held partition has shown where it is whole,
alignment starts above the highest of those epochs:
every epoch after it is complete in every partition. From there on the :class:`EpochAligner` does the
work, with the commit rule (an epoch enters the cache when the next barrier names it as
``prev_epoch``, or when the epoch index has it, see :meth:`UpstreamFeed.confirm`).

Each committed epoch becomes one Arrow record batch per partition in the data source's row shape
(:class:`~mvlog.connectors.change_rows.SignedRowBuilder`), so serving it is a copy into an IPC stream.

Until an epoch commits, its changes are held as the records' encoded bytes, not decoded: a decoded
change is about 3.6 times its record (5.2 MiB of Python objects for a 1.45 MiB epoch of 6000 rows of
``bench/cache.py``). A record is decoded once as it arrives (to check it and learn its epoch and
transaction), then again by :meth:`UpstreamFeed.to_cached`, straight into Arrow columns. A feed keeps
the changes of an epoch only up to ``max_epoch_bytes`` of records (I4): past that, the epoch still aligns
and commits but comes out with ``Epoch.dropped`` set, and the cache skips it (its readers go to Kafka).
:attr:`UpstreamFeed.held_bytes` is what the feed holds now (records and their objects' overhead),
:attr:`UpstreamFeed.peak_held_bytes` its peak, part of the worker's measured I4 batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from mvlog.barrier_alignment import EpochAligner
from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, ChangeOrigin, Epoch, Op
from mvlog.connectors.change_rows import SignedRowBuilder
from mvlog.log_cache import CachedEpoch
from mvlog.schemas.codec import TYPE_BARRIER, TYPE_CHANGE, decode_barrier, decode_change

# What the aligner buffers for a change held as its record's bytes (see UpstreamFeed.to_cached).
HELD = Change(Op.CREATE, (), None, {})
# Python's overhead for a held record besides its bytes: two bytes objects, the origin tuple, dict entries.
HELD_RECORD_OVERHEAD = 256
RELEASED_KEPT = 4  # committed epochs whose records wait for to_cached (the worker calls it at once)


class FeedError(RuntimeError):
    """A record that cannot be part of an mvlog changelog."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    partition: int
    offset: int
    kind: bytes | None  # the mvlog.type header
    key: bytes
    value: bytes


class UpstreamFeed:
    """Alignment state of one upstream over the partitions this worker holds."""

    def __init__(self, entry: CatalogEntry, partitions: Iterable[int], max_epoch_bytes: int | None = None) -> None:
        self.entry = entry
        self.max_epoch_bytes = max_epoch_bytes
        self.partitions = sorted(set(partitions))
        if not self.partitions:
            raise ValueError(f"{entry.name}: a feed needs at least one partition")
        self.aligner: EpochAligner | None = None
        self._first_barrier: dict[int, int] = {}
        self._warmup: list[RawRecord] = []
        self.records = 0  # records fetched from Kafka (for the fan-out count)
        self.bytes = 0
        self._next_offset: dict[int, int] = {}  # per partition: the offset after the last record taken
        self._open_bytes: dict[tuple[int, str], int] = {}  # (epoch, txn) -> bytes of the changes kept
        self._over_budget: set[tuple[int, str]] = set()
        self._last_barrier: dict[int, int] = {}  # partition -> epoch of its last barrier
        # (epoch, txn) -> (partition, offset) -> the change record's value, until the epoch commits
        self._held: dict[tuple[int, str], dict[tuple[int, int], bytes]] = {}
        self._held_sizes: dict[tuple[int, str], int] = {}
        self._released: dict[int, dict[tuple[int, int], bytes]] = {}  # committed epoch -> values, for to_cached
        self.held_bytes = 0
        self.peak_held_bytes = 0

    @property
    def ready(self) -> bool:
        return self.aligner is not None

    def add(self, record: RawRecord) -> list[Epoch]:
        """Feed one record; returns the epochs it commits (in order)."""
        if record.offset < self._next_offset.get(record.partition, 0):
            return []  # fetched again after a seek back (see resume_offsets)
        self._next_offset[record.partition] = record.offset + 1
        self.records += 1
        self.bytes += len(record.key) + len(record.value)
        if self.aligner is not None:
            return self._release(self._feed(self.aligner, record))
        if record.partition not in self._first_barrier:
            if record.offset == 0:
                self._first_barrier[record.partition] = 0  # the log's start: every epoch is whole
            else:
                if record.kind == TYPE_BARRIER:
                    self._first_barrier[record.partition] = decode_barrier(record.value).epoch
                return []
        self._warmup.append(record)
        if len(self._first_barrier) < len(self.partitions):
            return []
        aligner = EpochAligner(self.entry.name, self.partitions, after_epoch=max(self._first_barrier.values()))
        self.aligner = aligner
        warmup, self._warmup = self._warmup, []
        return self._release([epoch for r in warmup for epoch in self._feed(aligner, r)])

    def _feed(self, aligner: EpochAligner, record: RawRecord) -> list[Epoch]:
        if record.kind == TYPE_CHANGE:
            change, source = decode_change(self.entry.key_columns, record.key, record.value)
            attempt: tuple[int, str] = (source["epoch"], source["txn"])
            if source["epoch"] <= aligner.after_epoch:
                return []
            del change  # held as the record's bytes until the epoch commits (decoded: ~3.6x larger)
            if self._within_budget(aligner, attempt, len(record.key) + len(record.value)):
                self._hold(attempt, record)
                aligner.add_change(record.partition, source["epoch"], HELD, source["txn"],
                                   ChangeOrigin(record.partition, record.offset, record.key))
            else:
                aligner.count_change(record.partition, *attempt)
            return []
        if record.kind == TYPE_BARRIER:
            barrier = decode_barrier(record.value)
            committed = aligner.add_barrier(record.partition, barrier, record.offset)
            self._forget_sealed(record.partition, barrier.epoch)
            return committed
        raise FeedError(f"{self.entry.name} partition {record.partition} offset {record.offset}: "
                        f"not an mvlog changelog record (header mvlog.type is {record.kind!r})")

    def _within_budget(self, aligner: EpochAligner, attempt: tuple[int, str], size: int) -> bool:
        """Whether a change of ``attempt`` (epoch, txn) is kept; the first one past the budget drops
        the attempt's changes kept so far."""
        if self.max_epoch_bytes is None:
            return True
        if attempt in self._over_budget:
            return False
        total = self._open_bytes.get(attempt, 0) + size
        if total <= self.max_epoch_bytes:
            self._open_bytes[attempt] = total
            return True
        aligner.drop(*attempt)
        self._unhold(attempt)
        self._open_bytes.pop(attempt, None)
        self._over_budget.add(attempt)
        return False

    def _hold(self, attempt: tuple[int, str], record: RawRecord) -> None:
        self._held.setdefault(attempt, {})[(record.partition, record.offset)] = record.value
        size = len(record.key) + len(record.value) + HELD_RECORD_OVERHEAD
        self._held_sizes[attempt] = self._held_sizes.get(attempt, 0) + size
        self.held_bytes += size
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def _unhold(self, attempt: tuple[int, str]) -> dict[tuple[int, int], bytes]:
        self.held_bytes -= self._held_sizes.pop(attempt, 0)
        return self._held.pop(attempt, {})

    def _release(self, committed: list[Epoch]) -> list[Epoch]:
        """The committed epochs' records go to :meth:`to_cached`; attempts at or below the last committed
        epoch that are still held were aborted (their barriers never came, or the chain rule dropped them)."""
        for epoch in committed:
            txn = next(iter(epoch.barriers.values())).txn
            values = self._unhold((epoch.epoch, txn))
            if values:
                self._released[epoch.epoch] = values
            while len(self._released) > RELEASED_KEPT:  # a caller that never built them (not the worker)
                del self._released[min(self._released)]
            for stale in [a for a in self._held if a[0] <= epoch.epoch]:
                self._unhold(stale)
        return committed

    def _forget_sealed(self, partition: int, epoch: int) -> None:
        """Budget bookkeeping of the epochs every partition has sealed is no longer needed."""
        self._last_barrier[partition] = epoch
        if len(self._last_barrier) < len(self.partitions):
            return
        floor = min(self._last_barrier.values())
        for attempt in [a for a in self._open_bytes if a[0] <= floor]:
            del self._open_bytes[attempt]
        self._over_budget = {a for a in self._over_budget if a[0] > floor}

    def resume_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """Where to seek ``partitions`` before resuming them: right after the last record taken.

        Faust drops the records it had fetched for a partition that was paused meanwhile (its getmany
        filters them out, yet the fetch position has moved past them), so a paused partition must be
        sought back before it resumes; records taken already are skipped if they come again.
        """
        return {p: self._next_offset[p] for p in partitions if p in self._next_offset}

    def held(self) -> tuple[int, int] | None:
        """The complete epoch waiting for confirmation and its barrier offset in the first partition."""
        if self.aligner is None or self.aligner.held_epoch is None:
            return None
        return self.aligner.held_epoch, self.partitions[0]

    def confirm(self, epoch: int, partition: int, barrier_offset: int) -> list[Epoch]:
        """The epoch index has ``epoch`` with its barrier at ``barrier_offset`` in ``partition``."""
        if self.aligner is None:
            return []
        return self._release(self.aligner.confirm(epoch, {partition: barrier_offset}))

    def to_cached(self, epoch: Epoch) -> CachedEpoch[pa.RecordBatch]:
        """``epoch`` as the cache holds it: one record batch per partition in the data source's shape.

        Its changes are decoded here from the records held since they arrived (one at a time, straight
        into the builders' columns); ``epoch`` must be one that the last :meth:`add` or :meth:`confirm`
        committed."""
        values = self._released.pop(epoch.epoch, {})
        key_columns = self.entry.key_columns
        builders = {p: SignedRowBuilder(self.entry.schema, p) for p in self.partitions}
        for change, origin in zip(epoch.changes, epoch.origins, strict=True):
            if change is HELD:
                change = decode_change(key_columns, origin.key, values[(origin.partition, origin.offset)])[0]
            builders[origin.partition].add_change(epoch.epoch, origin.offset, origin.key, change)
        for partition, builder in builders.items():
            builder.add_barrier(epoch.epoch, epoch.offsets[partition])
        parts = {p: b.flush() for p, b in builders.items()}
        return CachedEpoch(epoch.epoch, epoch.prev_epoch, parts, sum(b.nbytes for b in parts.values()))


def serve_range(epochs: Sequence[CachedEpoch[pa.RecordBatch]], partition: int, schema: pa.Schema) -> bytes:
    """One partition's batches of ``epochs`` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for epoch in epochs:
            writer.write_batch(epoch.parts[partition])
    return bytes(sink.getvalue().to_pybytes())
