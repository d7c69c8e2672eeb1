"""The epoch being read from a source topic: its messages decoded into the table's pending writes, its bad
records into dead letters, and the source offsets it has read past.

A plain message goes the fast way (:mod:`mvlog.source_fast`: straight into the table's normalized rows,
held here, last change of each key, until the epoch is cut or the reference way needs the table); any other
through the reference decoder (:mod:`mvlog.source_formats`). Debezium's redeliveries are dropped by their
source position (:class:`~mvlog.source_dedupe.PositionFilter`). What the :class:`EpochReader` gathers is
handed to the ingester's cut by :meth:`EpochReader.take`; the ingester commits it (:mod:`.ingester`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from mvlog.connectors.kafka.changelog_records import PoisonRecord
from mvlog.connectors.kafka.dead_letter import DeadLetterRecord, dead_letter_record
from mvlog.row_schema import Key, Row
from mvlog.services.sources.declare import SourceError
from mvlog.services.tables.writer import RowValidationError, Table
from mvlog.source_avro import SchemaChangeError
from mvlog.source_dedupe import PositionFilter
from mvlog.source_fast import fast_debezium_decoder_for, fast_decoder_for
from mvlog.source_formats import Decoder
from mvlog.source_records import BadRecordError, RowChange, SourceMessage
from mvlog.source_spec import SourceSpec

log = logging.getLogger(__name__)


@dataclass
class IngestProgress:
    """What an ingester did so far (for its log line and the tests)."""

    messages: int = 0
    changes: int = 0
    epochs: int = 0
    last_epoch: int | None = None
    redelivered: int = 0  # Debezium changes skipped as redeliveries (position at or below the key's last)
    dead_letters: int = 0  # bad records this run dead-lettered (committed with their epochs)

    def plus(self, other: IngestProgress) -> IngestProgress:
        """Both runs together (``run-source`` starting an ingester again; messages of an epoch that failed
        are counted by both, as both read them)."""
        return IngestProgress(self.messages + other.messages, self.changes + other.changes,
                              self.epochs + other.epochs, other.last_epoch if other.last_epoch is not None
                              else self.last_epoch, self.redelivered + other.redelivered,
                              self.dead_letters + other.dead_letters)



class EpochReader:
    """Decodes a source topic's messages into the epoch being read (see module doc).

    ``positions`` (partition -> next offset) is the ingester's: it moves past each message queued or
    dead-lettered. ``before_table_write`` is called before anything is queued in the table itself: the
    table's pending writes belong to the epoch being committed while one is in flight."""

    def __init__(self, name: str, spec: SourceSpec, table: Table, decode: Decoder, *, seen: PositionFilter,
                 positions: dict[int, int], partitions: int, progress: IngestProgress, group: str,
                 dead_letter_topic: str, dead_letter_value_bytes: int,
                 before_table_write: Callable[[], None]) -> None:
        self.name, self.spec, self.table, self.group = name, spec, table, group
        self._decode = decode
        self._fast = fast_decoder_for(spec, table.entry.schema, table.text_limit)
        self._fast_debezium = fast_debezium_decoder_for(spec, table.entry.schema, table.text_limit)
        self._seen = seen
        self.positions = positions
        self.partitions = partitions  # of the topic: the ingester raises it when the topic gains some
        self.progress = progress
        self.dead_letter_topic = dead_letter_topic
        self._dlq_value_bytes = dead_letter_value_bytes
        self._before_table_write = before_table_write
        self.uncommitted = False  # a message was read since the last cut
        self._dead: list[DeadLetterRecord] = []  # dead letters of the epoch being read
        # The fast path's changes of the epoch being read, not handed to the table yet (see take): the table's
        # pending writes belong to the epoch being committed while one is in flight.
        self._held: dict[Key, Row | None] = {}

    def take(self) -> tuple[dict[Key, Row | None], list[DeadLetterRecord]]:
        """End the epoch being read: the fast path's changes still held and its dead letters (its table
        writes are the table's pending ones, its offsets ``positions``)."""
        held, self._held = self._held, {}
        dead, self._dead = self._dead, []
        self.uncommitted = False
        return held, dead

    def discard(self) -> None:
        """Forget the epoch being read (the ingester closes; its messages are read again next time)."""
        self._held, self._dead = {}, []

    def apply(self, messages: Sequence[Message]) -> None:
        """Decode and queue the messages in order; ``positions`` moves past each one queued or
        dead-lettered. A plain message goes the fast way (:mod:`mvlog.source_fast`: its change straight
        into the table's normalized rows, queued a batch at a time; a Debezium change's source position goes
        through the redelivery rule first, as in :meth:`_apply_one`); any other, and every message of a
        format without a fast decoder, through the reference decoder (:mod:`mvlog.source_formats`)."""
        fast, debezium, seen = self._fast, self._fast_debezium, self._seen
        run: list[RowChange] = []
        origins: list[SourceMessage] = []  # the message of each change of ``run``
        # Fast changes not handed to the table yet (the last of each key), all of them older than ``run``'s:
        # :meth:`_queue` hands them over before it queues a run.
        held = self._held
        handled = fast_changes = 0
        try:
            for message in messages:
                error = message.error()
                if error is not None:
                    self._queue(run, origins)
                    self._advance(messages, handled)
                    handled = 0
                    self._raise_consumer_error(error, message)
                handled += 1
                if fast is not None:
                    change = fast(message)
                    if change is not None:
                        if run:
                            self._queue(run, origins)
                        held[change[0]] = change[1]
                        fast_changes += 1
                        continue
                elif debezium is not None:
                    positioned = debezium(message)
                    if positioned is not None:
                        if run:
                            self._queue(run, origins)
                        key, row, position = positioned
                        if position is None or seen.admit(key, position):  # (as _apply_one: redeliveries)
                            held[key] = row
                            fast_changes += 1
                        else:
                            self.progress.redelivered += 1
                        continue
                try:
                    self._apply_one(message, run, origins)
                except (SchemaChangeError, SourceError) as stop:
                    handled -= 1  # not passed: the next ingester stops at it again
                    self._queue(run, origins)
                    if isinstance(stop, SourceError):
                        raise
                    raise SourceError(self._schema_stop(stop)) from None
            self._queue(run, origins)
        finally:
            self._advance(messages, handled)
            self.progress.changes += fast_changes

    def _apply_one(self, message: Message, run: list[RowChange], origins: list[SourceMessage]) -> None:
        """The reference way: decode one message, drop Debezium's redeliveries, and add its changes to
        ``run`` (queued whenever the kind of change flips), or dead-letter it."""
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None
        source = SourceMessage(self.spec.topic, partition, offset, message.key(), message.value())
        try:
            changes = self._decode(source)
        except BadRecordError as bad:
            self._dead_letter(source, bad.field, bad.problem, message.headers())
            return
        if any(change.position is not None for change in changes):
            admitted = [change for change in changes if self._seen.admit(change.key, change.position)]
            self.progress.redelivered += len(changes) - len(admitted)
            changes = admitted
        for change in changes:  # (an update that changes the key is a delete, then an upsert)
            if run and change.is_delete != run[-1].is_delete:
                self._queue(run, origins)
            run.append(change)
            origins.append(source)

    def _schema_stop(self, change: SchemaChangeError) -> str:
        """What a schema change that stops the source says (with what the operator does)."""
        return (f"{self.name}: source stopped at {change.where} (topic {self.spec.topic}): writer schema id "
                f"{change.schema_id}, field {change.field!r}: {change.problem}. Nothing after it is ingested. "
                "To go on: recreate the table (drop-table, create-table) with columns this schema has, or accept "
                "the schema with "
                f"`mvlog run-source {self.name} --accept-schema {change.schema_id}` (its missing nullable "
                "columns become NULL, records it cannot type are dead-lettered)")

    def _hand_over_held(self) -> None:
        """Before the ingester queues writes in the table itself (a run of the reference path): the epoch in
        flight must have taken the table's pending writes (``before_table_write``), and the fast path's changes
        held so far go first, so the changes of each key stay in the order they came."""
        self._before_table_write()
        if self._held:
            self.table.queue_normalized(self._held)
            self._held.clear()  # (the same dict: _apply holds it)

    def _advance(self, messages: Sequence[Message], count: int) -> None:
        """``positions`` past the first ``count`` of ``messages`` (each partition's last one of them is its
        highest offset), which are then part of the epoch being read."""
        if count <= 0:
            return
        self.uncommitted = True
        self.progress.messages += count
        positions, seen = self.positions, set()
        for index in range(count - 1, -1, -1):
            message = messages[index]
            partition = message.partition()
            if partition not in seen:
                offset = message.offset()
                assert partition is not None and offset is not None
                seen.add(partition)
                positions[partition] = offset + 1
                if len(seen) == self.partitions:
                    break

    def _queue(self, run: list[RowChange], origins: list[SourceMessage]) -> None:
        """One call of the table's upsert or delete for a run of changes of one kind (order is kept). A
        change the table refuses (a row too large for a record of its changelog) is dead-lettered: the
        table queued the others, and a later change of the same key still wins."""
        if not run:
            return
        self._hand_over_held()
        try:
            if run[0].is_delete:
                keys: list[Key] = [change.key for change in run]
                self.table.delete(keys)
            else:
                rows: list[Row] = [change.row for change in run if change.row is not None]
                self.table.upsert(rows)  # typed by the decoder: only a row too large for a record is refused
            self.progress.changes += len(run)
        except RowValidationError as refused:
            bad = {error.row_index: error for error in refused.errors}
            self.progress.changes += len(run) - len(bad)
            for index, error in sorted(bad.items()):
                source = origins[index]
                self._dead_letter(source, error.field, f"the table refuses the row: {error.problem}")
        run.clear()
        origins.clear()

    def _dead_letter(self, source: SourceMessage, field: str | None, problem: str, headers: object = None) -> None:
        """Queue ``source`` for the dead-letter topic, in the epoch being read (see module doc)."""
        what = f"field {field!r}: " if field else ""
        poison = PoisonRecord(source.topic, source.partition, source.offset, f"{self.name}: {what}{problem}")
        log.warning("%s: bad record %s dead-lettered to %s: %s%s", self.name, source.where, self.dead_letter_topic,
                    what, problem)
        self._dead.append(dead_letter_record(self.dead_letter_topic, poison, source.key, source.value, headers,
                                             self._dlq_value_bytes))

    def _raise_consumer_error(self, error: KafkaError, message: Message) -> None:
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            raise SourceError(f"{self.name}: the committed offset of {self.spec.topic}[{message.partition()}] is "
                              "no longer in the topic (retention deleted messages the table never ingested): "
                              f"reset the group {self.group} to where the table should go on ({error.str()})")
        if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise SourceError(f"{self.name}: source topic {self.spec.topic!r} no longer exists: recreate it (its "
                              f"producer may) and restart `mvlog run-source {self.name}`, or drop the table "
                              f"({error.str()})")
        raise SourceError(f"{self.name}: reading {self.spec.topic}: {error.str()}")
