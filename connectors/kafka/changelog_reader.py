"""Reads a view's changelog as complete epochs, in order, with ``read_committed``.

The reader seeks each partition to just after the barrier of the last epoch before its start (looked up
in the epoch index), aligns barriers across partitions and yields :class:`~mvlog.changes.Epoch` objects.
Records it cannot use go to the view's dead-letter topic (see :mod:`mvlog.connectors.kafka.dead_letter`).
It never uses the broker's high watermark to decide where an epoch ends: barriers do that (Tansu
reports the watermark of the last batch's base offset, not of the log's end). An epoch is handed out
once it is committed: named by its successor's barrier, or present in the epoch index.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from mvlog.barrier_alignment import EpochAligner
from mvlog.changes import Epoch, IndexEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_records import BarrierRecord, ChangeRecord, decode_record
from mvlog.connectors.kafka.dead_letter import DeadLetterQueue
from mvlog.connectors.kafka.kafka_security import RefusalWatch
from mvlog.connectors.redis.epoch_index import EpochIndex


class ChangelogReadError(RuntimeError):
    """A record that cannot be part of an mvlog changelog; names topic, partition and offset."""


#: How long the broker may hold a fetch that finds too little (Kafka's default is 500 ms). mvlog's readers
#: read ranges to an end: with the default, reading a changelog of small epochs waited about half a second
#: between fetched batches (a 300-epoch changelog: 2.0 s -> 0.75 s at 50 ms; 10 ms gives no more). An idle
#: reader then fetches 20 times a second.
READ_FETCH_WAIT_MS = 50
#: The same for a reader that follows a live topic (a source table's ingester): new records end a held
#: fetch at once, so a short wait gains nothing there and costs the broker a request every 50 ms while idle.
FOLLOW_FETCH_WAIT_MS = 500


def reader_consumer(settings: Settings, extra: dict[str, Any] | None = None, *,
                    fetch_wait_ms: int = READ_FETCH_WAIT_MS) -> Consumer:
    """A read_committed consumer used with ``assign()`` only: no group membership, no offset commits.
    ``fetch_wait_ms``: :data:`READ_FETCH_WAIT_MS` for range reads, :data:`FOLLOW_FETCH_WAIT_MS` for a
    follower; the settings' ``kafka`` client options override it."""
    config: dict[str, Any] = {
        "fetch.wait.max.ms": fetch_wait_ms,
        **settings.kafka_client_config(),
        "group.id": f"{settings.topic_prefix}.reader.{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 16 * 1024 * 1024,
        "queued.max.messages.kbytes": 32768,
    }
    config.update(extra or {})
    return Consumer(config)


def next_records(consumer: Consumer, wait: float = 0.05, most: int = 2000) -> list[Message]:
    """Up to ``most`` records already queued, without waiting; when none is, the next record, waiting at
    most ``wait`` seconds for it (an empty list: nothing came).

    ``consume(n, timeout)`` waits its whole timeout whenever fewer than ``n`` records are queued, which
    made every read wait at its end and whenever it caught up with the fetcher (a quarter of a second per
    call for the readers of small epochs)."""
    return consumer.consume(num_messages=most, timeout=0) or consumer.consume(num_messages=1, timeout=wait)


class ChangelogReader:
    """Complete epochs of one changelog after ``after_epoch`` up to ``upto_epoch`` (inclusive)."""

    def __init__(self, settings: Settings, view: str, key_columns: Sequence[str], partitions: int,
                 index: EpochIndex | None = None, after_epoch: int = 0, upto_epoch: int | None = None,
                 dead_letter: bool = True, proven: Mapping[int, IndexEntry] | None = None) -> None:
        """``dead_letter``: poison records go to the view's dead-letter topic and reading goes on; when
        False the first one raises :class:`ChangelogReadError` (naming topic, partition and offset).
        ``proven``: the barriers (partition -> index entry) of an epoch known to be committed otherwise
        than by the index (its live writer committed it), confirmed as if the index had it."""
        self.view = view
        self.topic = settings.changelog_topic(view)
        self.key_columns = tuple(key_columns)
        self.upto_epoch = upto_epoch
        self.aligner = EpochAligner(view, range(partitions), after_epoch)
        self._index = index
        self._proven = dict(proven or {})
        self._max_bytes = settings.max_record_bytes
        self.dead_letters = DeadLetterQueue(settings, view) if dead_letter else None
        self.max_seen_epoch = after_epoch  # including epochs abandoned by a killed writer
        # A refused login or TLS handshake reaches only error_cb: without it the reader would idle, not fail.
        self._refusals = RefusalWatch(settings.bootstrap_servers)
        self._consumer = reader_consumer(settings, {"error_cb": self._refusals})
        self._paused: set[int] = set()
        self._consumer.assign([TopicPartition(self.topic, p, self._start_offset(index, p, after_epoch))
                               for p in range(partitions)])

    def _start_offset(self, index: EpochIndex | None, partition: int, after_epoch: int) -> int:
        if index is None or after_epoch <= 0:
            return OFFSET_BEGINNING
        entry = index.before(self.view, partition, after_epoch + 1)
        return entry.offset + 1 if entry is not None else OFFSET_BEGINNING

    @property
    def last_epoch(self) -> int:
        return self.aligner.last_epoch

    def done(self) -> bool:
        return self.upto_epoch is not None and self.aligner.last_epoch >= self.upto_epoch

    def epochs(self, idle_timeout: float | None = None, poll_timeout: float = 0.2) -> Iterator[Epoch]:
        """Yield complete epochs; stop at ``upto_epoch``, or after ``idle_timeout`` s without a record.
        Raises :class:`~mvlog.connectors.kafka.kafka_security.KafkaAccessError` if the broker refuses the reader."""
        last_record = time.monotonic()
        while not self.done():
            messages = next_records(self._consumer, poll_timeout)
            if messages:
                last_record = time.monotonic()
            else:
                self._refusals.check()
                if idle_timeout is not None and time.monotonic() - last_record >= idle_timeout:
                    return
            committed = [e for message in messages for e in self._handle(message)]
            committed += self._confirm_from_index()
            for epoch in committed:
                if self.upto_epoch is not None and epoch.epoch > self.upto_epoch:
                    return
                yield epoch
            self._apply_pauses()

    def release_held(self) -> Epoch | None:
        """The complete epoch still waiting for confirmation at the end of the log, released on the
        caller's proof that it committed (see :meth:`EpochAligner.release_held`)."""
        return self.aligner.release_held()

    def _confirm_from_index(self) -> list[Epoch]:
        """Release a complete epoch without waiting for its successor when the index has it."""
        held = self.aligner.held_epoch
        if held is None:
            return []
        partition = self.aligner.partitions[0]
        entry = self._index.at(self.view, partition, held) if self._index is not None else None
        if entry is None and (proven := self._proven.get(partition)) is not None and proven.epoch == held:
            entry = proven
        if entry is None:
            return []
        return self.aligner.confirm(held, {partition: entry.offset})

    def _handle(self, message: Any) -> list[Epoch]:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return []
            raise ChangelogReadError(f"{self.topic}: {error}")
        partition, offset = message.partition(), message.offset()
        record = decode_record(self.view, self.key_columns, self.topic, partition, offset, message.key(),
                               message.value(), message.headers(), self._max_bytes)
        if isinstance(record, ChangeRecord):
            self.aligner.add_change(partition, record.epoch, record.change, record.txn)
            return []
        if isinstance(record, BarrierRecord):
            self.max_seen_epoch = max(self.max_seen_epoch, record.barrier.epoch)
            return self.aligner.add_barrier(partition, record.barrier, offset)
        if self.dead_letters is None:
            raise ChangelogReadError(record.reason)
        self.dead_letters.send(record, message.key(), message.value(), message.headers())
        if record.announced_change:
            self.aligner.add_poison(partition)
        return []

    def _apply_pauses(self) -> None:
        wanted = self.aligner.partitions_to_pause()
        if wanted == self._paused:
            return
        if resume := self._paused - wanted:
            self._consumer.resume([TopicPartition(self.topic, p) for p in resume])
        if pause := wanted - self._paused:
            self._consumer.pause([TopicPartition(self.topic, p) for p in pause])
        self._paused = wanted

    def close(self) -> None:
        self._consumer.close()
        if self.dead_letters is not None:
            self.dead_letters.close()

    def __enter__(self) -> ChangelogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
