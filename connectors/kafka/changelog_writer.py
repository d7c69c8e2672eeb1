"""Writes a view's changelog: one Kafka transaction per epoch, changes then a barrier on every partition.

The transactional id fences a restarted or duplicated writer, and the transaction makes the epoch
atomic for ``read_committed`` consumers. Consumed input offsets (consume-transform-produce) commit in
the same transaction, so an epoch's input and output are either both done or both not.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from mvlog.changes import Barrier, IndexEntry, Mutation, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.kafka_security import RefusalWatch
from mvlog.connectors.kafka.topics import CHANGE_HEADER_BYTES, PRODUCER_LIMIT, changelog_record_limit
from mvlog.record_limits import RecordLimit, producer_max_bytes_for
from mvlog.schemas.arrow_rows import encode_rows
from mvlog.schemas.codec import (
    HEADER_TYPE,
    TYPE_BARRIER,
    TYPE_CHANGE,
    DecodeError,
    change_tail,
    decode_key,
    encode_barrier,
)
from mvlog.views.change_batch import ChangeBatch
from mvlog.vnode import VNODE_COUNT, partition_of_vnode, vnode_of

#: ``send_offsets_to_transaction``'s timeout, and how much longer the writer waits for it to return at all.
OFFSETS_TIMEOUT_S = 30.0
STUCK_GRACE_S = 10.0


class WriterFencedError(RuntimeError):
    """Another writer with the same transactional id took over; this one must stop."""


class EpochWriteError(RuntimeError):
    """The epoch's transaction was aborted; nothing of it is visible to read_committed consumers."""


class WriterStuckError(EpochWriteError):
    """A transactional call did not return within its bound (librdkafka's ``send_offsets_to_transaction``
    can wait forever for a group coordinator that went away with a broker restart: librdkafka issues
    #5456 and #5511). The producer is left behind, unusable; the caller starts a new writer with the same
    transactional id, whose ``init_transactions`` fences this one and aborts its open transaction."""


class RecordTooLargeError(EpochWriteError):
    """A change event above the changelog's record limit: its epoch was aborted, and redoing it fails the
    same way, so the message names the view, the key, the size and the limit (never a bare KafkaError)."""


def envelope_bytes(view: str) -> int:
    """The largest change event of ``view`` without its key and row images: two union branches and the
    tail (op and source) at its widest epoch, vnode, timestamp and transaction id (``_commit``'s form)."""
    widest = 2**63 - 1
    return 2 + len(change_tail(view, widest, VNODE_COUNT - 1, Op.UPDATE.value, widest, "f" * 12 + "-" + "9" * 19))


@dataclass(frozen=True)
class CommittedEpoch:
    epoch: int
    index: dict[int, IndexEntry]  # partition -> offset and record count of the epoch's barrier

    @property
    def records(self) -> int:
        return sum(e.records for e in self.index.values())


_NO_ROW, _A_ROW = pa.scalar(b"\x00", pa.binary()), pa.scalar(b"\x02", pa.binary())  # ["null", row] branches
_EMPTY = pa.scalar(b"", pa.binary())


@dataclass
class EncodedBatch:
    """A :class:`ChangeBatch` encoded column-wise, once: the change events' keys, vnodes and row bytes
    for :meth:`ChangelogWriter.commit_batches`, and the same bytes for Redis."""

    ops: list[str]  # Op value per change
    keys: list[bytes]  # encode_key of each change's key
    vnodes: list[int]
    before: pa.Array  # binary: encode_row(before), null without one
    after: pa.Array  # binary: encode_row(after), null without one
    row_puts: dict[bytes, bytes]  # key -> row after the epoch (the last change of a key decides)
    row_deletes: list[bytes]  # keys without a row after the epoch


def encode_batch(key_columns: Sequence[str], batch: ChangeBatch) -> EncodedBatch:
    """Encode each change's key and rows column-wise (the bytes ``encode_key`` and ``encode_row`` give)."""
    count = len(batch)
    has_before, has_after = batch.has_before, batch.has_after
    key_values = [(c, pc.if_else(has_after, batch.after.column(c), batch.before.column(c))) for c in key_columns]
    keys: list[bytes] = encode_rows(key_values, count).to_pylist()
    none = pa.scalar(None, pa.binary())
    before = pc.if_else(has_before, encode_rows([(c, batch.before.column(c)) for c in batch.before.column_names],
                                                count), none)
    after = pc.if_else(has_after, encode_rows([(c, batch.after.column(c)) for c in batch.after.column_names],
                                              count), none)
    afters: list[bytes | None] = after.to_pylist()
    puts: dict[bytes, bytes] = {}
    deletes: dict[bytes, None] = {}
    for key, row in zip(keys, afters, strict=True):
        if row is None:
            puts.pop(key, None)
            deletes[key] = None
        else:
            deletes.pop(key, None)
            puts[key] = row
    return EncodedBatch(batch.ops.to_pylist(), keys, [vnode_of(key) for key in keys], before, after, puts,
                        list(deletes))


def change_values(view: str, epoch: int, batch: EncodedBatch, ts_ms: int, txn: str) -> list[bytes]:
    """The change events (Kafka values) of an encoded batch, column-wise: what ``encode_change_rows``
    gives each change (before, after, then the tail shared by the changes of one op and vnode)."""
    slots: dict[tuple[int, str], int] = {}
    tails: list[bytes] = []
    positions: list[int] = []
    for vnode, op in zip(batch.vnodes, batch.ops, strict=True):
        slot = slots.get((vnode, op))
        if slot is None:
            slot = slots[(vnode, op)] = len(tails)
            tails.append(change_tail(view, epoch, vnode, op, ts_ms, txn))
        positions.append(slot)
    tail = pa.array(tails, pa.binary()).take(pa.array(positions, pa.int32()))
    values = pc.binary_join_element_wise(
        pc.if_else(pc.is_valid(batch.before), _A_ROW, _NO_ROW), batch.before.fill_null(_EMPTY),
        pc.if_else(pc.is_valid(batch.after), _A_ROW, _NO_ROW), batch.after.fill_null(_EMPTY), tail, _EMPTY)
    encoded: list[bytes] = values.to_pylist()
    return encoded


@dataclass(frozen=True)
class ConsumedInput:
    """Input offsets an epoch consumed, committed inside the epoch's own transaction
    (``send_offsets_to_transaction``): the epoch's changes and its input position commit together or not
    at all. ``mutation`` goes on the epoch's barriers, so the changelog itself says what it consumed."""

    offsets: Sequence[TopicPartition]  # the next offset to read, per partition
    group_metadata: Any  # Consumer.consumer_group_metadata() of the consumer that read them
    mutation: Mutation | None = None


Headers = list[tuple[str, str | bytes | None]]
_CHANGE_HEADERS: Headers = [(HEADER_TYPE, TYPE_CHANGE)]
_BARRIER_HEADERS: Headers = [(HEADER_TYPE, TYPE_BARRIER)]


class ChangelogWriter:
    def __init__(self, settings: Settings, view: str, key_columns: Sequence[str], partitions: int,
                 transactional_id: str | None = None, producer_config: dict[str, Any] | None = None,
                 partition: int | None = None) -> None:
        """``partition``: write that partition of each epoch only (its changes and its barrier), as one
        Spark task of a view whose operator runs in tasks does (``transactional_id`` then names the
        partition's writer); a change of another partition aborts the epoch."""
        self.view = view
        self.partition = partition
        self.topic = settings.changelog_topic(view)
        self.partitions = partitions
        self.key_columns = tuple(key_columns)
        self.transactional_id = transactional_id or f"{settings.topic_prefix}.{view}.writer"
        # What the broker, the topic and the readers allow: the producer refuses exactly what they would.
        self.limit: RecordLimit = changelog_record_limit(settings, self.topic)
        self.envelope_bytes = envelope_bytes(view)
        config: dict[str, Any] = {
            # Connect to the brokers the metadata names as soon as it names them. Sparse (librdkafka's
            # default), the transaction coordinator's look-up often finds no connected broker yet and
            # waits for librdkafka's fixed 500 ms timer: init_transactions took 55-516 ms on a local
            # broker, 6-17 ms eagerly (docs/scaling.md, "A partition writer's init_transactions"). A task
            # of a view in tasks makes such a writer whenever its Python worker kept none. On a cluster of
            # many brokers, where a connection to each costs more than the wait, ``MVLOG_KAFKA`` may set
            # it back to true.
            "enable.sparse.connections": False,
            **settings.kafka_client_config(),
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "transaction.timeout.ms": settings.transaction_timeout_ms,
            # Batches of 50 ms: the broker spends its CPU per batch too (bench/ingest.py, 200k change events:
            # 0.78 s of broker CPU at 5 ms, 0.57 s at 50 ms). No latency cost: commit_transaction flushes at once.
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
            "queue.buffering.max.kbytes": 262144,
            PRODUCER_LIMIT: producer_max_bytes_for(self.limit, CHANGE_HEADER_BYTES),
        }
        config.update(producer_config or {})
        self._refusals = RefusalWatch(settings.bootstrap_servers)
        self._producer = Producer({"error_cb": self._refusals, **config})
        self._partition_of_vnode = [partition_of_vnode(v, partitions) for v in range(VNODE_COUNT)]
        self._closed = False
        self._stuck = False  # a transactional call never returned: the producer is abandoned
        self._session = uuid.uuid4().hex[:12]
        self._transactions = 0
        self._connect()
        self._init_transactions(60.0)

    @property
    def barrier_partitions(self) -> list[int]:
        """The partitions this writer puts each epoch's barrier on: all, or its one partition."""
        return list(range(self.partitions)) if self.partition is None else [self.partition]

    def commit_records(self, epoch: int, prev_epoch: int,
                       chunks: Callable[[int, str], Iterable[Iterable[tuple[bytes, int, bytes]]]], *,
                       checkpoint: bool = True, consumed: ConsumedInput | None = None) -> CommittedEpoch:
        """:meth:`commit_batches` of change events the caller encodes (a table writer's, with the compiled
        codec, row by row as it validates them): ``chunks(ts_ms, txn)`` yields lists of
        (key, vnode, ``encode_change_rows(view, epoch, vnode, ..., ts_ms, txn)``) inside the transaction,
        so a writer that also needs each key's vnode and rows for Redis computes them once. ``consumed``:
        input offsets that commit in the same transaction (a source table's topic)."""
        if consumed is None:
            return self._commit(epoch, prev_epoch, chunks, checkpoint, None, None, None)
        return self._commit(epoch, prev_epoch, chunks, checkpoint, consumed.mutation, consumed.offsets,
                            consumed.group_metadata)

    def commit_batches(self, epoch: int, prev_epoch: int, batches: Iterable[EncodedBatch], *,
                       mutation: Mutation | None = None) -> CommittedEpoch:
        """Write the epoch's changes, encoded by :func:`encode_batch` in one or more batches, and its
        barriers in one transaction and commit it.

        ``batches`` may be a generator (a snapshot load stages each batch in Redis as it goes): it is
        consumed inside the epoch's transaction, so an error it raises aborts the epoch."""
        view = self.view

        def chunks(ts_ms: int, txn: str) -> Iterator[Iterable[tuple[bytes, int, bytes]]]:
            for batch in batches:
                yield zip(batch.keys, batch.vnodes, change_values(view, epoch, batch, ts_ms, txn), strict=True)

        return self._commit(epoch, prev_epoch, chunks, True, mutation, None, None)

    def _commit(self, epoch: int, prev_epoch: int,
                chunks: Callable[[int, str], Iterable[Iterable[tuple[bytes, int, bytes]]]],
                checkpoint: bool, mutation: Mutation | None, consumed_offsets: Sequence[TopicPartition] | None,
                group_metadata: Any) -> CommittedEpoch:
        if epoch <= prev_epoch:
            raise ValueError(f"epoch {epoch} must be above the previous epoch {prev_epoch}")
        producer = self._producer
        self._transactions += 1
        txn = f"{self._session}-{self._transactions}"
        self._run(producer.begin_transaction)
        try:
            ts_ms = int(time.time() * 1000)
            counts = [0] * self.partitions
            partition_of = self._partition_of_vnode
            produce, topic = producer.produce, self.topic
            for chunk in chunks(ts_ms, txn):
                for key, vnode, value in chunk:
                    partition = partition_of[vnode]
                    counts[partition] += 1
                    try:
                        produce(topic, value, key, partition=partition, headers=_CHANGE_HEADERS)
                    except BufferError:
                        self._produce(key, value, partition, _CHANGE_HEADERS)
                    except KafkaException as error:  # checked by librdkafka at no cost to the other records
                        if error.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                            raise
                        raise self._too_large(epoch, key, value) from error
            if self.partition is not None and sum(counts) != counts[self.partition]:
                raise ValueError(f"a change of epoch {epoch} belongs to another partition than {self.partition}")
            barrier_offsets: dict[int, int] = {}

            def on_barrier(err: KafkaError | None, msg: Message) -> None:
                partition, offset = msg.partition(), msg.offset()
                if err is None and partition is not None and offset is not None:
                    barrier_offsets[partition] = offset

            for partition in self.barrier_partitions:
                barrier = Barrier(self.view, epoch, prev_epoch, checkpoint, partition, counts[partition],
                                  ts_ms, mutation, txn)
                self._produce(None, encode_barrier(barrier), partition, _BARRIER_HEADERS, on_barrier)
            if consumed_offsets:
                self._run_bounded(producer.send_offsets_to_transaction, OFFSETS_TIMEOUT_S, list(consumed_offsets),
                                  group_metadata, OFFSETS_TIMEOUT_S)
            self._run(producer.commit_transaction, 60.0)
        except (WriterFencedError, WriterStuckError):
            raise  # nothing to abort with: fenced, or a call still runs in the stuck producer
        except RecordTooLargeError:
            self._abort()
            raise
        except KafkaException as exc:
            # A produce() after the producer learnt it was fenced raises librdkafka's fatal error (_FATAL),
            # not the fencing itself: the same end as a fenced commit, and nothing to abort with either.
            if (fenced := fenced_error(self.view, self.transactional_id, exc.args[0])) is not None:
                raise fenced from exc
            self._abort()
            raise EpochWriteError(f"{self.view}: epoch {epoch} was aborted: {exc}") from exc
        except Exception as exc:
            self._abort()
            raise EpochWriteError(f"{self.view}: epoch {epoch} was aborted: {exc}") from exc
        if len(barrier_offsets) != len(self.barrier_partitions):
            raise EpochWriteError(f"{self.view}: epoch {epoch} committed without all barrier offsets")
        index = {p: IndexEntry(epoch, barrier_offsets[p], counts[p]) for p in self.barrier_partitions}
        return CommittedEpoch(epoch, index)

    def _too_large(self, epoch: int, key: bytes, value: bytes) -> RecordTooLargeError:
        try:
            shown: object = decode_key(self.key_columns, key)
        except DecodeError:
            shown = key[:64]
        return RecordTooLargeError(
            f"{self.view}: epoch {epoch} was aborted: the change event of key {shown!r} is {len(key) + len(value)} "
            f"bytes (key and value), above the {self.limit.bytes}-byte limit of changelog {self.topic} set by "
            f"{self.limit.reason}")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush and release the producer now, while the broker is up (a transactional producer left to
        the garbage collector can block interpreter exit once the broker is gone)."""
        if not self._closed:
            self._closed = True
            if self._stuck:  # a call still runs inside it: releasing the producer would pull it from under it
                return
            # A fenced (or otherwise failed) producer raises its fatal error here: nothing it holds can
            # commit any more (its open transaction is aborted by the broker), so it is released all the same.
            with contextlib.suppress(KafkaException):
                self._producer.flush(10)
            with warnings.catch_warnings():  # a fenced producer's close cannot abort what the broker aborts
                warnings.filterwarnings("ignore", "Producer abort_transaction failed during close", RuntimeWarning)
                self._producer.close()

    def _produce(self, key: bytes | None, value: bytes, partition: int, headers: Headers,
                 on_delivery: Any = None) -> None:
        while True:
            try:
                self._producer.produce(self.topic, value, key, partition=partition, headers=headers,
                                       on_delivery=on_delivery)
                return
            except BufferError:
                self._producer.poll(0.05)  # the local queue is full: let deliveries drain it

    def _abort(self) -> None:
        with contextlib.suppress(KafkaException):
            self._producer.abort_transaction(30.0)

    def _connect(self) -> None:
        """Have a broker connection up before ``init_transactions``. Otherwise librdkafka's first query
        for the transaction coordinator often finds no broker up yet ("No brokers available for
        Transactions") and is retried only by its 500 ms timer. Eager connections (the writer's default)
        mostly settle that race; this metadata request narrows it where a user's ``MVLOG_KAFKA`` makes them
        sparse again: 5-10 of 16 new sparse producers took ~510 ms to initialise, 1 of 16 after it
        (docs/scaling.md, sessions 20 and 42). Best effort: an unreachable or refusing broker is
        :meth:`_init_transactions`' to report."""
        with contextlib.suppress(KafkaException):
            self._producer.list_topics(self.topic, timeout=1.0)

    def _init_transactions(self, timeout: float) -> None:
        """``init_transactions`` in 1 s slices (librdkafka allows retrying one that timed out), so a broker
        refusing the login or TLS handshake raises KafkaAccessError at once instead of after ``timeout``.
        Retriable errors are retried too: a broker just started answers COORDINATOR_LOAD_IN_PROGRESS while
        it loads its transaction log."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                self._run(self._producer.init_transactions, max(0.1, min(1.0, remaining)))
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.code() != KafkaError._TIMED_OUT and not error.retriable():
                    raise
                self._producer.poll(0)  # serves error_cb
                self._refusals.check()
                if remaining <= 1.0:
                    raise

    def _run_bounded(self, call: Any, bound_s: float, *args: Any) -> Any:
        """:meth:`_run` on a helper thread, waiting at most ``bound_s`` (plus a grace) for it: for calls whose
        own timeout librdkafka does not always honour. Past it the writer is stuck for good
        (:class:`WriterStuckError`)."""
        outcome: list[Any] = []

        def call_it() -> None:
            try:
                outcome.append((True, self._run(call, *args)))
            except BaseException as error:  # handed to the caller's thread
                outcome.append((False, error))

        thread = threading.Thread(target=call_it, name=f"{self.view}-txn-call", daemon=True)
        thread.start()
        thread.join(bound_s + STUCK_GRACE_S)
        if not outcome:
            self._stuck = True
            raise WriterStuckError(f"{self.view}: {getattr(call, '__name__', call)} did not return within "
                                   f"{bound_s + STUCK_GRACE_S:.0f} s (librdkafka lost the group coordinator); this "
                                   "writer is abandoned and a new one fences it")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _run(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except KafkaException as exc:
            if (fenced := fenced_error(self.view, self.transactional_id, exc.args[0])) is not None:
                raise fenced from exc
            raise


def fenced_error(view: str, transactional_id: str | None, error: KafkaError) -> WriterFencedError | None:
    """A writer's end when ``error`` says its producer can write no more: fenced by a newer instance of its
    transactional id, or any fatal error (librdkafka's ``_FATAL`` stands for the fencing on a produce()
    after it learnt of it); None for an error a retry or an abort can handle."""
    if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError._FATAL) or error.fatal():
        return WriterFencedError(f"{view}: writer {transactional_id} was fenced by a newer instance (or failed "
                                 f"fatally): {error}")
    return None
