"""Source tables: a root table fed by a topic the user already has, exactly once.

:func:`create_source_table` declares one (the catalog entry's options say which topic, which format);
:class:`SourceIngester` (``mvlog run-source``) consumes the topic and writes its messages through the
table's :class:`~mvlog.services.table_writer.Table`. Exactly once comes from one rule: **the offsets an
epoch consumed commit in the epoch's own Kafka transaction** (``send_offsets_to_transaction`` with the
consumer group ``<prefix>.<table>.source``), so the changelog and the source position are both
committed or both not. The ingester runs the epoch loop itself (the table's writer does not cut epochs
in the background), so an epoch holds exactly the changes of the messages below the offsets it commits.

After a SIGKILL the next ingester's ``Table`` fences the old transactional producer (aborting an open
epoch), rolls Redis forward from the changelog if the kill fell between the Kafka and the Redis commit
(Kafka is the truth), and the consumer resumes from the group's committed offsets: nothing is lost or
applied twice. Each epoch's barriers also carry those offsets (:mod:`mvlog.source_offsets`).

A ``debezium-json`` source also drops Debezium's own redeliveries (a restarted Kafka Connect worker
sends again what came after its last flushed offset): each key's last applied source position
(:mod:`mvlog.source_dedupe`) is committed on the epoch's barriers with the offsets, and folded back from
the table's changelog when an ingester starts.

**Bad records** (undecodable, no key, wrong types, a row the table refuses) never stop the source: each
goes to the table's dead-letter topic ``<prefix>.<table>.dlq`` with the headers of
:mod:`mvlog.connectors.kafka.dead_letter`, produced **inside the epoch's transaction** by the table's own
transactional producer, and the offsets move past it. So a bad record is dead-lettered exactly when the
epoch that skips it commits: a SIGKILL before that aborts both and the next ingester reads it again; a
``read_committed`` reader of the dead-letter topic sees each one once. The running total goes on the
epoch's barrier too (:func:`mvlog.source_offsets.dead_letters_of`) and from there to Redis, for
``mvlog status`` and ``/metrics``.

**What stops a source** (with what to do, in its error, in Redis for ``mvlog status``, never silently):
a topic that does not exist, a committed offset that retention deleted, a broker error on the topic, an
Avro writer schema the table's columns cannot take (:class:`mvlog.source_avro.SchemaChangeError`: the
epoch before it commits, its offset is not passed, so nothing after it is ingested until an operator
accepts the schema id or recreates the table), a Schema Registry that does not answer.

**Avro formats** find each message's writer schema by its id: first among the ``.avsc`` files the table
was created with (kept in its catalog entry), then in the Schema Registry (the table's URL, else
``MVLOG_SCHEMA_REGISTRY_URL``), cached by id (:mod:`mvlog.connectors.kafka.schema_registry`).

**Idle and lagging partitions** hold nothing back: an epoch is cut every barrier interval from whatever
the consumer returned, from any partitions; no partition waits for another (there is no per-partition
alignment: the source's offsets are the only position). A partition that gets no messages simply keeps
its committed offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import reader_consumer
from mvlog.connectors.kafka.changelog_records import PoisonRecord
from mvlog.connectors.kafka.changelog_writer import ConsumedInput
from mvlog.connectors.kafka.dead_letter import DLQ_MAX_VALUE_BYTES, DeadLetterRecord, dead_letter_record
from mvlog.connectors.kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.source_status import SourceStatusStore
from mvlog.gc_pause import heap_frozen
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.services.source_committed import committed_dead_letters, committed_positions
from mvlog.services.table_writer import RowValidationError, Table
from mvlog.source_avro import SchemaChangeError, SchemaResolver, derive_columns
from mvlog.source_dedupe import PositionFilter
from mvlog.source_fast import fast_debezium_decoder_for, fast_decoder_for
from mvlog.source_formats import decoder_for
from mvlog.source_offsets import offsets_mutation
from mvlog.source_pace import EpochPace
from mvlog.source_records import BadRecordError, RowChange, SourceMessage
from mvlog.source_spec import SourceFormat, SourceSpec, SourceSpecError, source_group

log = logging.getLogger(__name__)

_BATCH = 5000  # messages per consume() call
_PREFETCH_MESSAGES = 5000  # librdkafka's queued.min.messages: messages fetched ahead per partition
_PREFETCH_PARTITION_BYTES = 256 * 1024  # max.partition.fetch.bytes: one partition's share of a fetch
# fetch.queue.backoff.ms: how long librdkafka postpones a partition's next fetch once its queue reached the
# prefetch bound above. Its default (1 s) left the ingester waiting in consume() for most of a backlog
# (bench/ingest.py: 3.1-4.1 s to consume 50k records against 0.06 s without the bound); 5 ms keeps the bound
# and fetches again as soon as the queue drains.
_PREFETCH_BACKOFF_MS = 5
_FIRST_PACE_S = 50e-6  # an epoch's work per message assumed before one is measured (loaded 2-core machine: 25-35)
# While a backlog is read (the last epoch was cut by the pace's cap), how long a consume() waits for a full batch:
# librdkafka returns fewer messages than asked for only at the timeout, so a short one tells soon that the backlog
# is read to its end, and that epoch is cut then rather than at the interval (see run).
_DRAIN_POLL_S = 0.05
_PARTITIONS_CHECK_S = 10.0  # how often a running ingester asks whether the topic gained partitions
_DLQ_HEADROOM = 8192  # bytes under the producer's record limit kept for a dead letter's key and headers


class SourceError(RuntimeError):
    """A source that cannot be read (not a source table, topic gone, offsets deleted by retention)."""


def source_topic_partitions(settings: Settings, topic: str) -> int:
    """The partition count of the source topic; a missing topic is named with what to do.

    Asks for the metadata of all topics: a metadata request naming the topic would have a broker with
    ``auto.create.topics.enable`` (the default) create it, and the missing topic would go unnoticed."""
    admin = AdminClient(settings.kafka_client_config())
    found = admin.list_topics(timeout=15.0).topics.get(topic)
    if found is None or found.error is not None:
        raise SourceError(f"source topic {topic!r} does not exist on {settings.bootstrap_servers}: create it (or "
                          "let its producer create it) first, or check the name")
    return len(found.partitions)


def avro_resolver(settings: Settings, spec: SourceSpec) -> SchemaResolver:
    """Schema id -> writer schema JSON of an Avro source: its ``.avsc`` schemas, then its registry's.
    A registry that does not answer stops the source (:class:`SourceError`); an id nobody knows is a
    bad record (the resolver returns None)."""
    url = spec.schema_registry or settings.schema_registry_url
    registry = SchemaRegistryClient(url) if url else None

    def resolve(schema_id: int) -> str | None:
        text = spec.avro_schemas.get(schema_id)
        if text is not None or registry is None:
            return text
        try:
            return registry.schema(schema_id)
        except SchemaRegistryError as error:
            raise SourceError(f"{spec.topic}: the writer schema id {schema_id} cannot be fetched: {error}") from None

    return resolve


def latest_value_schema(settings: Settings, spec: SourceSpec) -> str:
    """The writer schema columns are derived from when ``create-table`` names none: the registry's latest
    ``<topic>-value`` schema, else the ``.avsc`` schema of the highest id."""
    url = spec.schema_registry or settings.schema_registry_url
    if url:
        subject = f"{spec.topic}-value"
        try:
            found = SchemaRegistryClient(url).latest(subject)
        except SchemaRegistryError as error:
            raise SourceError(str(error)) from None
        if found is None:
            raise SourceError(f"the Schema Registry {url} has no subject {subject!r}: register the topic's value "
                              "schema, or declare the columns (-c NAME:TYPE)")
        return found[1]
    if spec.avro_schemas:
        return spec.avro_schemas[max(spec.avro_schemas)]
    raise SourceError("no columns (-c) and no Avro schema to derive them from: give a Schema Registry URL "
                      "(--schema-registry or MVLOG_SCHEMA_REGISTRY_URL) or --avro-schema ID=FILE.avsc")


def create_source_table(settings: Settings, name: str, columns: Mapping[str, str] | None,
                        primary_key: Sequence[str], topic: str, format: str | SourceFormat, *,
                        generated_key: str | None = None, partitions: int | None = None,
                        client: redis.Redis | None = None, schema_registry: str | None = None,
                        avro_schemas: Mapping[int, str] | None = None) -> SourceSpec:
    """Declare table ``name`` fed by ``topic`` in ``format`` (the Python side of
    ``mvlog create-table NAME --from-topic TOPIC --format FORMAT``); ``mvlog run-source`` ingests it.
    For an Avro format ``columns`` may be None: they are derived from the latest value schema
    (:func:`mvlog.source_avro.derive_columns`)."""
    spec = SourceSpec(topic, SourceFormat.parse(format) if isinstance(format, str) else format, generated_key,
                      schema_registry, dict(avro_schemas or {}))
    if columns is None:
        if not spec.format.is_avro:
            raise SourceSpecError(f"{spec.format.value} needs its columns declared (-c NAME:TYPE)")
        try:
            derived = derive_columns(latest_value_schema(settings, spec), spec.format.kind == "debezium")
        except ValueError as error:
            raise SourceSpecError(f"columns cannot be derived from the Avro schema: {error}") from None
        columns = {n: t.value for n, t in derived.items()}
    spec.check(RowSchema.of(columns, primary_key))
    source_topic_partitions(settings, topic)
    table = Table.create(settings, name, columns, primary_key, partitions=partitions, client=client,
                         options=spec.to_options(), auto_commit=False)
    SourceStatusStore(table.store.redis, settings.topic_prefix).forget(name)  # a dropped namesake's
    table.close()
    return spec


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


@dataclass
class _Cut:
    """An epoch cut by the ingester, to commit: the fast path's changes it still holds, the offsets (with the
    barrier's mutation), its dead letters and the running total, and for the pace and the hook: the source
    positions, the messages read until the cut, and how many of them it took at what cost."""

    held: dict[Key, Row | None]
    consumed: ConsumedInput
    dead: list[DeadLetterRecord]
    total: int
    positions: dict[int, int]
    messages: int
    taken: int = 0
    cycle_s: float = 0.0


@dataclass
class _InFlight:
    """The epoch whose commit runs on its own thread; ``error`` what the commit raised."""

    cut: _Cut
    thread: threading.Thread = field(default_factory=threading.Thread)
    error: BaseException | None = None


class SourceIngester:
    """Consumes a source table's topic into the table, one epoch per barrier interval (see module doc)."""

    def __init__(self, settings: Settings, name: str, client: redis.Redis | None = None, *,
                 accept_schemas: frozenset[int] = frozenset()) -> None:
        self.settings = settings
        self._redis = client or redis_client.connect(settings)
        entry = CatalogStore(settings, self._redis).get(name)
        spec = SourceSpec.from_options(entry.options) if entry.kind == "table" else None
        if spec is None:
            raise SourceError(f"{entry.kind} {name!r} has no source topic: declare one with "
                              "`mvlog create-table NAME --from-topic TOPIC --format FORMAT ...`")
        self.spec = spec
        self.name = name
        self.group = source_group(settings.topic_prefix, name)
        self.progress = IngestProgress()
        self.status = SourceStatusStore(self._redis, settings.topic_prefix)
        self.dead_letter_topic = settings.dead_letter_topic_of(name)
        self._decode = decoder_for(spec, entry.schema, avro_resolver(settings, spec) if spec.format.is_avro
                                   else None, accept_schemas)
        try:
            partitions = source_topic_partitions(settings, spec.topic)
        except SourceError as error:
            self.status.set_problem(name, str(error))
            raise
        # First the table's writer: its init_transactions aborts the epoch a killed ingester left open,
        # offsets included, so the committed offsets read next are stable.
        self.table = Table(settings, entry, self._redis, auto_commit=False)
        self._fast = fast_decoder_for(spec, entry.schema, self.table.text_limit)
        self._fast_debezium = fast_debezium_decoder_for(spec, entry.schema, self.table.text_limit)
        self._partition_count = partitions
        self._seen = PositionFilter()
        if spec.format.kind == "debezium":
            self._seen.load(committed_positions(settings, name))
        # A bounded prefetch per partition: librdkafka's one queue is first in, first out, so a partition's
        # backlog fetched ahead in bulk would put another partition's new messages behind all of it.
        self._consumer = reader_consumer(settings, {"group.id": self.group, "auto.offset.reset": "error",
                                                    "queued.min.messages": _PREFETCH_MESSAGES,
                                                    "max.partition.fetch.bytes": _PREFETCH_PARTITION_BYTES,
                                                    "fetch.queue.backoff.ms": _PREFETCH_BACKOFF_MS})
        try:
            # The running total of dead letters, from the last committed epoch (Kafka is the truth).
            dead_letters = committed_dead_letters(settings, self.table)
            if dead_letters is None:
                raise SourceError(f"{name}: the barrier of its last committed epoch (its running total of dead "
                                  "letters) was not read from its changelog within 30 s: is the broker answering?")
            self.dead_letters = dead_letters
            self.status.set_dead_letters(name, self.dead_letters)
            self.status.set_problem(name, None)
            ensure_topic(settings, self.dead_letter_topic, 1, {"cleanup.policy": "compact"})
            committed = self._consumer.committed([TopicPartition(spec.topic, p) for p in range(partitions)], 30.0)
            # The topic's metadata before the assignment: librdkafka looks up a logical offset (the beginning
            # of a partition without a committed offset) only once it knows the partition's leader, else it
            # retries 500 ms later, which delayed the first messages of a new source table by half a second.
            self._consumer.list_topics(spec.topic, timeout=15.0)
            self.positions: dict[int, int] = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
            self._consumer.assign([TopicPartition(spec.topic, p, self.positions.get(p, OFFSET_BEGINNING))
                                   for p in range(partitions)])
        except BaseException:
            self.close()
            raise
        self._uncommitted = False
        self._dead: list[DeadLetterRecord] = []  # dead letters of the epoch being read
        # The fast path's changes of the epoch being read, not handed to the table yet (see _cut): the table's
        # pending writes belong to the epoch being committed while one is in flight.
        self._held: dict[Key, Row | None] = {}
        self._inflight: _InFlight | None = None  # the epoch being committed on its own thread, if any
        self._waited_s = 0.0  # seconds the epoch being read waited for the one in flight
        self._dlq_value_bytes = max(0, min(DLQ_MAX_VALUE_BYTES, self.table.record_limit_bytes - _DLQ_HEADROOM))
        # Until an epoch is measured, assume _FIRST_PACE_S seconds of work per message: a restart in front of a
        # backlog then commits its first epoch within about the interval (unbounded, a fast read of a large
        # backlog made one epoch too large to commit before the next kill in the SIGKILL test).
        self.pace = EpochPace(settings.barrier_interval_ms / 1000, per_message_s=_FIRST_PACE_S)
        log.info("%s: ingesting %s (%s) from %s", name, spec.topic, spec.format.value,
                 {p: self.positions.get(p, "beginning") for p in range(partitions)})

    # --- the loop -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, *, until_caught_up: bool = False) -> IngestProgress:
        """Ingest until ``stop`` is set (or, with ``until_caught_up``, until every partition is read to its
        end), committing an epoch every barrier interval (an empty one when nothing came). Bad records go
        to the dead-letter topic; a source that cannot be read (:class:`SourceError`) stops after
        committing what came before, its problem recorded for ``mvlog status``.

        The interval is measured from the last cut whatever the partitions do: an idle partition returns
        nothing and a lagging one returns what it has, and neither delays the cut (the consume timeout
        never runs past it). While a backlog is read, :class:`~mvlog.source_pace.EpochPace` caps each
        epoch at the messages its work can apply and commit within the interval, so epochs stay on time
        instead of growing with the backlog; and the epoch that reads the backlog to its end (a consume
        returning less than a full batch right after a capped epoch) is cut then, not at the interval: its
        messages are already as old as they get, so waiting would only delay them (once per backlog; a quiet
        or steady topic's epochs are cut by the interval as before).

        **Pipelined**: each epoch is committed on a thread of its own (:meth:`_commit_cut`) while the next one
        is consumed and decoded; at most one commit is in flight, and the next cut waits for it, so epochs
        commit one after the other, each with its own offsets in its own transaction (a failed commit stops
        the loop, and the epoch being read, never committed, is read again by the next ingester)."""
        stop = stop or threading.Event()
        interval = self.settings.barrier_interval_ms / 1000
        pace = self.pace
        next_cut = time.monotonic() + interval
        next_partitions_check = time.monotonic() + _PARTITIONS_CHECK_S
        taken, work_s = 0, 0.0  # messages of the epoch being read, and the seconds spent applying them
        draining = False  # the last epoch was cut by the cap: a backlog is being read
        # Full collections skip the heap found here (mvlog.gc_pause: 40-50 ms each, every few thousand records).
        with heap_frozen():
            try:
                while not stop.is_set():
                    inflight = self._inflight
                    if inflight is not None and not inflight.thread.is_alive():
                        self._settle()  # a commit that failed stops the loop now
                    cap = pace.max_messages()
                    want = _BATCH if cap is None else max(1, min(_BATCH, cap - taken))
                    timeout = max(0.0, min(_DRAIN_POLL_S if draining else 0.5, next_cut - time.monotonic()))
                    messages = self._consumer.consume(want, timeout)
                    started = time.monotonic()
                    try:
                        self._apply(messages)
                    except SourceError:
                        self.commit()  # the messages before the unreadable position
                        raise
                    taken += len(messages)
                    work_s += time.monotonic() - started
                    capped = cap is not None and taken >= cap
                    drained = draining and taken > 0 and len(messages) < want
                    if time.monotonic() >= next_cut or capped or drained:
                        self._commit_behind(taken, work_s)
                        taken, work_s = 0, 0.0
                        draining = capped
                        if time.monotonic() >= next_partitions_check:
                            self.follow_new_partitions()
                            next_partitions_check = time.monotonic() + _PARTITIONS_CHECK_S
                        next_cut = time.monotonic() + interval
                        if until_caught_up and not messages and self.caught_up():
                            break
                self.commit()
            except SourceError as error:
                self.status.set_problem(self.name, str(error))
                raise
        return self.progress

    def _apply(self, messages: Sequence[Message]) -> None:
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
        flight must have taken the table's pending writes (:meth:`_settle`), and the fast path's changes held
        so far go first, so the changes of each key stay in the order they came."""
        self._settle()
        if self._held:
            self.table.queue_normalized(self._held)
            self._held.clear()  # (the same dict: _apply holds it)

    def _advance(self, messages: Sequence[Message], count: int) -> None:
        """``positions`` past the first ``count`` of ``messages`` (each partition's last one of them is its
        highest offset), which are then part of the epoch being read."""
        if count <= 0:
            return
        self._uncommitted = True
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
                if len(seen) == self._partition_count:
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

    def commit(self, *, idle: bool = False) -> int | None:
        """Commit the queued changes, the dead letters and the offsets they came from as one epoch, now, on
        this thread (after the epoch in flight, if any); returns the epoch. When no message was consumed since
        the last one there is nothing to do, unless ``idle``: then an empty epoch is committed all the same,
        as a written table's epoch loop does every interval. A table that cuts no epoch while its topic is
        quiet would hold back every view that joins it with another: a join follows its inputs only up to
        the epoch they have all reached."""
        self._settle()
        cut = self._cut(idle=idle)
        return None if cut is None else self._commit_cut(cut)

    def epoch_committed(self, epoch: int, positions: Mapping[int, int], messages: int) -> None:
        """Called once each epoch committed (Kafka and Redis), on the thread that committed it, in epoch
        order: ``positions`` the source offsets it committed, ``messages`` those read until its cut. For
        subclasses that time epochs (the benchmark, the tests); does nothing here."""

    def _commit_behind(self, taken: int, work_s: float) -> None:
        """The run loop's cut: wait for the epoch in flight, then commit the one just read on a thread of its
        own while the loop reads the next. ``taken`` messages took ``work_s`` seconds to apply."""
        self._settle()
        cut = self._cut(idle=True)
        assert cut is not None
        cut.taken, cut.cycle_s = taken, work_s + self._waited_s  # its apply, and its wait for the one before
        self._waited_s = 0.0
        inflight = _InFlight(cut)
        inflight.thread = threading.Thread(target=self._commit_in_flight, args=(inflight,),
                                           name=f"mvlog-source-{self.name}-commit", daemon=True)
        self._inflight = inflight
        inflight.thread.start()

    def _commit_in_flight(self, inflight: _InFlight) -> None:
        try:
            self._commit_cut(inflight.cut)
        except BaseException as error:  # raised on the loop's thread by _settle
            inflight.error = error

    def _settle(self) -> None:
        """Wait for the epoch in flight to be committed; raise what its commit raised."""
        inflight = self._inflight
        if inflight is None:
            return
        started = time.monotonic()
        inflight.thread.join()
        self._waited_s += time.monotonic() - started
        self._inflight = None
        if inflight.error is not None:
            raise inflight.error

    def _cut(self, *, idle: bool) -> _Cut | None:
        """End the epoch being read (no epoch in flight): its held changes, dead letters and offsets, for
        :meth:`_commit_cut`. None when nothing was read since the last cut and not ``idle``."""
        if not self._uncommitted and not idle:
            return None
        self.table.wait_for_downstreams()  # backpressure: no epoch is cut (nor read) while a downstream lags
        dead, self._dead = self._dead, []
        total = self.dead_letters + len(dead)
        offsets = [TopicPartition(self.spec.topic, p, o) for p, o in sorted(self.positions.items())]
        consumed = ConsumedInput(offsets, self._consumer.consumer_group_metadata(),
                                 offsets_mutation(self.name, self.spec.topic, self.positions,
                                                  self._seen.take_changed(), total))
        held, self._held = self._held, {}
        self._uncommitted = False
        return _Cut(held, consumed, dead, total, dict(self.positions), self.progress.messages)

    def _commit_cut(self, cut: _Cut) -> int:
        """Commit a cut epoch: its held changes join the table's pending writes (which only this epoch's
        reading queued: the next epoch's wait, see _hand_over_held), then one Kafka transaction with the
        offsets and dead letters, then Redis (:meth:`Table.commit_epoch`)."""
        started = time.monotonic()
        if cut.held:
            self.table.queue_normalized(cut.held)
        committed = self.table.commit_epoch(cut.consumed, cut.dead)
        self.dead_letters = cut.total
        if cut.dead:
            self.status.set_dead_letters(self.name, cut.total)
        self.progress.dead_letters += len(cut.dead)
        self.progress.epochs += 1
        self.progress.last_epoch = committed.epoch
        if cut.taken:
            # What the epoch cost the loop: its own apply plus its wait for the epoch before, or its commit
            # where that took longer (the loop then waits for it at the next cut).
            self.pace.observe(cut.taken, max(cut.cycle_s, time.monotonic() - started))
        self.epoch_committed(committed.epoch, cut.positions, cut.messages)
        return committed.epoch

    def follow_new_partitions(self) -> list[int]:
        """Start reading the partitions added to the topic since this ingester started (an operator's
        ``kafka-topics --alter --partitions``), from their committed offsets or their beginning: a
        producer may write to them at once, and nothing it writes there may be missed. Returns them."""
        try:
            topic = self._consumer.list_topics(self.spec.topic, timeout=5.0).topics.get(self.spec.topic)
        except KafkaException as error:  # asked again at the next check
            log.warning("%s: the partitions of %s could not be listed: %s", self.name, self.spec.topic, error)
            return []
        if topic is None or topic.error is not None or len(topic.partitions) <= self._partition_count:
            return []  # a topic that is gone is reported by the consumer's own error
        added = list(range(self._partition_count, len(topic.partitions)))
        committed = self._consumer.committed([TopicPartition(self.spec.topic, p) for p in added], 30.0)
        self._consumer.incremental_assign([TopicPartition(self.spec.topic, tp.partition,
                                                          tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                                           for tp in committed])
        self._partition_count = len(topic.partitions)
        log.info("%s: %s gained partition(s) %s; reading them from their start", self.name, self.spec.topic, added)
        return added

    def caught_up(self) -> bool:
        """Every partition read to its end (the high watermark at this moment)."""
        assigned = self._consumer.assignment()
        for tp, position in zip(assigned, self._consumer.position(assigned), strict=True):
            _, high = self._consumer.get_watermark_offsets(tp, 10.0, False)
            if max(position.offset, self.positions.get(tp.partition, 0)) < high:
                return False
        return True

    def close(self) -> None:
        """Release the consumer and the table's producer. Commits nothing (:meth:`run` does): what is
        still queued was interrupted and is read again from the committed offsets next time."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:  # its commit uses the table's producer: let it end first (its error is moot)
            inflight.thread.join()
        self._consumer.close()
        self._dead = []
        self._held = {}
        self.table.discard()
        self.table.close()

    def __enter__(self) -> SourceIngester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["IngestProgress", "SourceError", "SourceIngester", "SourceSpecError", "create_source_table",
           "source_topic_partitions"]
