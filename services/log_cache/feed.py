"""One upstream's records, as a worker's Kafka consumer delivers them in batches, turned into cacheable epochs.

A worker starts reading its partitions wherever its consumer group left off (or at the start), which
may be in the middle of an epoch. So a partition's records before its first barrier are skipped (unless
it starts at offset 0, the log's start), and once every held partition has shown where it is whole,
alignment starts above the highest of those epochs: every epoch after it is complete in every partition.
From there on the :class:`EpochAligner` does the work, with the commit rule (an epoch enters the cache
when the next barrier names it as ``prev_epoch``, or when the epoch index has it, see
:meth:`UpstreamFeed.confirm`).

Why it is built this way: the worker must keep up with the table writers it caches (hundreds of
thousands of changes per second), so no Python code runs per record once the feed is aligned. A consume
batch is cut into per-partition slices (C-level ``map``/``compress``), each slice is decoded a run of one
(epoch, transaction) at a time by the compiled codec the Kafka readers use
(:func:`~mvlog.connectors.kafka.changelog_records.decode_change_run`), each record once, and each run goes
straight into Arrow columns (:class:`~mvlog.connectors.spark.change_rows.SignedRowBuilder`, the data source's
row shape) and is serialized at once into an Arrow IPC message. The aligner only counts the run's changes
towards their barrier (:meth:`EpochAligner.count_changes`). Barriers, and records the compiled run
refuses, go through :func:`~mvlog.connectors.kafka.changelog_records.decode_record` one by one (a few per epoch).

So an open epoch is held as IPC messages (about its records' size, not the ~3.6x of decoded Python
objects), and a committed epoch is cached as those messages plus one barrier message per partition:
serving a range is writing the cached buffers after a schema message, with no copy (:func:`reply_buffers`).
A feed keeps an epoch only up to ``max_epoch_bytes`` of Arrow messages (I4): past that, the epoch still
aligns and commits but :meth:`UpstreamFeed.to_cached` returns None, and the cache skips it (its readers go
to Kafka). :attr:`UpstreamFeed.held_bytes` is what the feed holds now, :attr:`UpstreamFeed.peak_held_bytes`
its peak, and :attr:`UpstreamFeed.peak_take_bytes` the Arrow bytes one consume batch made (its decoded
objects, transient, are a few times that): parts of the worker's measured I4 batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, pairwise
from operator import methodcaller, ne
from typing import Any, Protocol

import pyarrow as pa

from mvlog.barrier_alignment import EpochAligner
from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch
from mvlog.connectors.kafka.changelog_records import BarrierRecord, ChangeRecord, decode_change_run, decode_record
from mvlog.connectors.spark.change_rows import SignedRowBuilder, arrow_schema
from mvlog.log_cache import CachedEpoch
from mvlog.row_schema import Row
from mvlog.schemas.codec import TYPE_BARRIER, decode_barrier, record_type

EOS = pa.py_buffer(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # the end-of-stream marker of the IPC stream format
NO_RECORD_LIMIT = 1 << 62

IpcParts = tuple[pa.Buffer, ...]  # one partition's part of a cached epoch: IPC record batch messages


class FeedError(RuntimeError):
    """A record that cannot be part of an mvlog changelog."""


class KafkaMessage(Protocol):
    """What the feed reads of a consumed record: confluent-kafka's ``Message`` (or :class:`Record`)."""

    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...
    def error(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A record given by its fields, with the accessors of confluent-kafka's ``Message`` (which cannot be
    constructed from Python): what unit tests feed."""

    partition_: int
    offset_: int
    key_: bytes | None
    value_: bytes | None
    headers_: list[tuple[str, bytes]] | None

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.headers_

    def error(self) -> None:
        return None


@dataclass
class _Attempt:
    """The IPC messages of one (epoch, transaction) read so far, per partition."""

    parts: dict[int, list[pa.Buffer]] = field(default_factory=dict)
    nbytes: int = 0
    over: bool = False  # past the feed's budget: nothing kept, the epoch is skipped by the cache


_NO_CHANGES = _Attempt()  # an epoch none of whose changes were read here (never changed: see to_cached)


def partition_slices(messages: Sequence[KafkaMessage]) -> list[tuple[int, Sequence[KafkaMessage]]]:
    """``messages`` cut into runs of one partition, in order (a consume batch holds one fetch's records
    of a partition together). Only C-level iteration: ``map``, ``compress``, slicing."""
    count = len(messages)
    if not count:
        return []
    partitions = list(map(methodcaller("partition"), messages))
    starts = [0, *compress(range(1, count), map(ne, partitions, partitions[1:])), count]
    return [(partitions[a], messages[a:b]) for a, b in pairwise(starts)]


class UpstreamFeed:
    """Alignment state of one upstream over the partitions this worker holds."""

    def __init__(self, entry: CatalogEntry, partitions: Iterable[int], max_epoch_bytes: int | None = None,
                 max_record_bytes: int = NO_RECORD_LIMIT) -> None:
        self.entry = entry
        self.max_epoch_bytes = max_epoch_bytes
        self.max_record_bytes = max_record_bytes
        self.partitions = sorted(set(partitions))
        if not self.partitions:
            raise ValueError(f"{entry.name}: a feed needs at least one partition")
        self.schema = arrow_schema(entry.schema)
        self.aligner: EpochAligner | None = None
        self._where = f"{entry.name}'s changelog"
        self._builders = {p: SignedRowBuilder(entry.schema, p) for p in self.partitions}
        self._first_barrier: dict[int, int] = {}
        self._warmup: list[tuple[int, Sequence[KafkaMessage]]] = []
        self.records = 0  # records taken from Kafka (for the fan-out count)
        self._next_offset: dict[int, int] = {}  # per partition: the offset after the last record taken
        self._open: dict[tuple[int, str], _Attempt] = {}  # (epoch, txn) -> its messages so far
        self._released: dict[int, _Attempt] = {}  # committed epoch -> its messages, for to_cached
        self.held_bytes = 0
        self.peak_held_bytes = 0
        self.peak_take_bytes = 0
        self._take_bytes = 0
        self.consumer_errors = 0  # error events the consumer delivered (skipped)
        self.last_consumer_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.aligner is not None

    # --- taking records ---------------------------------------------------------------------------

    def take(self, messages: Sequence[KafkaMessage]) -> list[Epoch]:
        """Feed one consume batch (any partitions held, each in offset order); returns the epochs it
        commits, in order."""
        self._forget_released()
        committed: list[Epoch] = []
        self._take_bytes = 0
        for partition, records in partition_slices(messages):
            if partition not in self._builders:
                if all(r.error() is not None for r in records):
                    self._consumer_errors(records)
                    continue
                raise FeedError(f"{self._where}: a record of partition {partition}, not held by this feed")
            records = self._new_only(partition, records)
            if not records:
                continue
            self.records += len(records)
            if self.aligner is not None:
                committed += self._feed(self.aligner, partition, records)
            else:
                committed += self._warm_up(partition, records)
        self.peak_take_bytes = max(self.peak_take_bytes, self._take_bytes)
        return committed

    def _new_only(self, partition: int, records: Sequence[KafkaMessage]) -> Sequence[KafkaMessage]:
        """Drop records taken already (fetched again after a seek back, see :meth:`resume_offsets`)."""
        after = self._next_offset.get(partition, 0)
        if (records[0].offset() or 0) < after:
            records = [r for r in records if (r.offset() or 0) >= after]  # rare: after a seek back only
        if records:
            self._next_offset[partition] = (records[-1].offset() or 0) + 1
        return records

    def _warm_up(self, partition: int, records: Sequence[KafkaMessage]) -> list[Epoch]:
        """Before alignment: find each partition's first barrier (one Python step per record, only until
        that barrier), keep what follows it, and start aligning once every partition has shown one."""
        if partition not in self._first_barrier:
            if records[0].offset() == 0:
                self._first_barrier[partition] = 0  # the log's start: every epoch is whole
            else:
                for i, record in enumerate(records):
                    if record_type(record.headers()) == TYPE_BARRIER:
                        self._first_barrier[partition] = decode_barrier(record.value() or b"").epoch
                        records = records[i + 1:]
                        break
                else:
                    return []
        if records:
            self._warmup.append((partition, records))
        if len(self._first_barrier) < len(self.partitions):
            return []
        aligner = EpochAligner(self.entry.name, self.partitions, after_epoch=max(self._first_barrier.values()))
        self.aligner = aligner
        warmup, self._warmup = self._warmup, []
        return [epoch for p, held in warmup for epoch in self._feed(aligner, p, held)]

    def _feed(self, aligner: EpochAligner, partition: int, records: Sequence[KafkaMessage]) -> list[Epoch]:
        committed: list[Epoch] = []
        view, key_columns = self.entry.name, self.entry.key_columns
        messages = records if isinstance(records, list) else list(records)
        i, count = 0, len(messages)
        while i < count:
            # The usual records: a run of well-formed change events of one (epoch, txn), in one compiled call.
            epoch, txn, run, i = decode_change_run(view, key_columns, messages, i, self.max_record_bytes)
            if run and epoch is not None and txn is not None:
                self._add_run(aligner, partition, epoch, txn, run)
                continue
            message = messages[i]
            i += 1
            if message.error() is not None:  # the consumer's, not the log's: librdkafka retries by itself
                self._consumer_errors([message])
                continue
            offset = message.offset() or 0
            record = decode_record(view, key_columns, self._where, partition, offset, message.key(),
                                   message.value(), message.headers(), self.max_record_bytes)
            if isinstance(record, ChangeRecord):
                self._add_run(aligner, partition, record.epoch, record.txn,
                              [(offset, message.key() or b"", record.change.before, record.change.after)])
            elif isinstance(record, BarrierRecord):
                committed += self._release(aligner.add_barrier(partition, record.barrier, offset))
            else:  # the readers, reading Kafka, dead-letter it and name it; the cache of this upstream restarts
                raise FeedError(record.reason)
        return committed

    def _consumer_errors(self, messages: Sequence[KafkaMessage]) -> None:
        self.consumer_errors += len(messages)
        self.last_consumer_error = str(messages[-1].error())

    def _add_run(self, aligner: EpochAligner, partition: int, epoch: int, txn: str,
                 run: list[tuple[int, bytes, Row | None, Row | None]]) -> None:
        """A run of changes of one (epoch, txn) in one partition: counted by the aligner, kept as one IPC
        message (unless the attempt is over the budget)."""
        if epoch <= aligner.after_epoch:
            return
        aligner.count_changes(partition, epoch, txn, len(run))
        attempt = self._open.get((epoch, txn))
        if attempt is None:
            attempt = self._open[(epoch, txn)] = _Attempt()
        if attempt.over:
            return
        builder = self._builders[partition]
        builder.add_changes(epoch, run)
        message = builder.flush().serialize()
        attempt.parts.setdefault(partition, []).append(message)
        attempt.nbytes += message.size
        self.held_bytes += message.size
        self._take_bytes += message.size
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        if self.max_epoch_bytes is not None and attempt.nbytes > self.max_epoch_bytes:
            self.held_bytes -= attempt.nbytes
            attempt.parts, attempt.nbytes, attempt.over = {}, 0, True

    def _release(self, committed: list[Epoch]) -> list[Epoch]:
        """The committed epochs' messages go to :meth:`to_cached`; attempts at or below the last committed
        epoch that are still open were aborted (their barriers never came, or the chain rule dropped them)."""
        for epoch in committed:
            txn = next(iter(epoch.barriers.values())).txn
            self._released[epoch.epoch] = self._open.pop((epoch.epoch, txn), _NO_CHANGES)
            for stale in [a for a in self._open if a[0] <= epoch.epoch]:
                self.held_bytes -= self._open.pop(stale).nbytes
        return committed

    # --- confirming and caching -------------------------------------------------------------------

    def resume_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """Where the feed got to in ``partitions``: right after the last record taken (what the worker
        commits for its consumer group, and where a resumed partition must continue)."""
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
        self._forget_released()
        return self._release(self.aligner.confirm(epoch, {partition: barrier_offset}))

    def _forget_released(self) -> None:
        """Epochs the previous :meth:`take` or :meth:`confirm` committed whose :meth:`to_cached` was not
        called (not the worker: it caches each at once, however many one consume batch commits)."""
        for attempt in self._released.values():
            self.held_bytes -= attempt.nbytes
        self._released.clear()

    def to_cached(self, epoch: Epoch) -> CachedEpoch[IpcParts] | None:
        """``epoch`` as the cache holds it: per partition, its IPC record batch messages in the data
        source's row shape and one for its barrier row; None if it went over the budget (the cache skips
        it). ``epoch`` must be one that the last :meth:`take` or :meth:`confirm` committed (any number of
        them: a consume batch may span many epochs)."""
        attempt = self._released.pop(epoch.epoch, _NO_CHANGES)
        self.held_bytes -= attempt.nbytes
        if attempt.over:
            return None
        parts: dict[int, IpcParts] = {}
        for partition, builder in self._builders.items():
            builder.add_barrier(epoch.epoch, epoch.offsets[partition])
            parts[partition] = (*attempt.parts.get(partition, ()), builder.flush().serialize())
        return CachedEpoch(epoch.epoch, epoch.prev_epoch, parts,
                           sum(m.size for messages in parts.values() for m in messages))


def reply_buffers(epochs: Sequence[CachedEpoch[IpcParts]], partition: int, schema_message: pa.Buffer
                  ) -> list[pa.Buffer]:
    """One partition's messages of ``epochs`` as an Arrow IPC stream: the schema message, the cached
    record batch messages themselves (not copies), the end-of-stream marker."""
    return [schema_message, *(m for epoch in epochs for m in epoch.parts[partition]), EOS]
