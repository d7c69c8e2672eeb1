"""Ingesting a source table's topic into the table, exactly once (``mvlog run-source``).

:class:`SourceIngester` consumes the topic and writes its messages through the table's
:class:`~mvlog.services.tables.writer.Table`: the epoch being read is :class:`.epoch_reader.EpochReader`'s,
each cut epoch is committed behind the reading (:class:`.commit_behind.CommitBehind`). Exactly once
comes from one rule: **the offsets an epoch consumed commit in the epoch's own Kafka transaction**
(``send_offsets_to_transaction`` with the consumer group ``<prefix>.<table>.source``), so the changelog
and the source position are both committed or both not. The ingester runs the epoch loop itself (the
table's writer does not cut epochs in the background), so an epoch holds exactly the changes of the
messages below the offsets it commits.

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
from collections.abc import Mapping
from dataclasses import dataclass

import redis
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import FOLLOW_FETCH_WAIT_MS, reader_consumer
from mvlog.connectors.kafka.changelog_writer import ConsumedInput
from mvlog.connectors.kafka.dead_letter import DLQ_MAX_VALUE_BYTES, DeadLetterRecord
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.source_status import SourceStatusStore
from mvlog.gc_pause import heap_frozen
from mvlog.row_schema import Key, Row
from mvlog.services.sources.commit_behind import CommitBehind
from mvlog.services.sources.committed import committed_dead_letters, committed_positions
from mvlog.services.sources.declare import SourceError, avro_resolver, source_topic_partitions
from mvlog.services.sources.epoch_reader import EpochReader, IngestProgress
from mvlog.services.tables.writer import Table
from mvlog.source_dedupe import PositionFilter
from mvlog.source_formats import decoder_for
from mvlog.source_offsets import offsets_mutation
from mvlog.source_pace import EpochPace
from mvlog.source_spec import SourceSpec, source_group

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
        decode = decoder_for(spec, entry.schema, avro_resolver(settings, spec) if spec.format.is_avro else None,
                             accept_schemas)
        try:
            partitions = source_topic_partitions(settings, spec.topic)
        except SourceError as error:
            self.status.set_problem(name, str(error))
            raise
        # First the table's writer: its init_transactions aborts the epoch a killed ingester left open,
        # offsets included, so the committed offsets read next are stable.
        self.table = Table(settings, entry, self._redis, auto_commit=False)
        self._seen = PositionFilter()
        if spec.format.kind == "debezium":
            self._seen.load(committed_positions(settings, name))
        # A bounded prefetch per partition: librdkafka's one queue is first in, first out, so a partition's
        # backlog fetched ahead in bulk would put another partition's new messages behind all of it.
        self._consumer = reader_consumer(settings, {"group.id": self.group, "auto.offset.reset": "error",
                                                    "queued.min.messages": _PREFETCH_MESSAGES,
                                                    "max.partition.fetch.bytes": _PREFETCH_PARTITION_BYTES,
                                                    "fetch.queue.backoff.ms": _PREFETCH_BACKOFF_MS},
                                         fetch_wait_ms=FOLLOW_FETCH_WAIT_MS)
        self.positions: dict[int, int] = {}  # partition -> the next offset to read (committed, then as read)
        self.reader = EpochReader(
            name, spec, self.table, decode, seen=self._seen, positions=self.positions, partitions=partitions,
            progress=self.progress, group=self.group, dead_letter_topic=self.dead_letter_topic,
            dead_letter_value_bytes=max(0, min(DLQ_MAX_VALUE_BYTES, self.table.record_limit_bytes - _DLQ_HEADROOM)),
            before_table_write=self._settle)
        # The epoch being committed on its own thread while the next one is read, if any.
        self._commits: CommitBehind[_Cut] = CommitBehind(self._commit_cut, f"mvlog-source-{name}-commit")
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
            self.positions.update({tp.partition: tp.offset for tp in committed if tp.offset >= 0})
            self._consumer.assign([TopicPartition(spec.topic, p, self.positions.get(p, OFFSET_BEGINNING))
                                   for p in range(partitions)])
        except BaseException:
            self.close()
            raise
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

        **Pipelined**: each epoch is committed on a thread of its own (:meth:`_commit_cut`, through
        :class:`.commit_behind.CommitBehind`) while the next one is consumed and decoded; at most one commit is
        in flight, and the next cut waits for it, so epochs
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
                    if self._commits.ended:
                        self._settle()  # a commit that failed stops the loop now
                    cap = pace.max_messages()
                    want = _BATCH if cap is None else max(1, min(_BATCH, cap - taken))
                    timeout = max(0.0, min(_DRAIN_POLL_S if draining else 0.5, next_cut - time.monotonic()))
                    messages = self._consumer.consume(want, timeout)
                    started = time.monotonic()
                    try:
                        self.reader.apply(messages)
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
        # Its apply, and its wait for the one before.
        cut.taken, cut.cycle_s = taken, work_s + self._commits.take_waited_s()
        self._commits.start(cut)

    def _settle(self) -> None:
        """Wait for the epoch in flight to be committed; raise what its commit raised."""
        self._commits.settle()

    def _cut(self, *, idle: bool) -> _Cut | None:
        """End the epoch being read (no epoch in flight): its held changes, dead letters and offsets, for
        :meth:`_commit_cut`. None when nothing was read since the last cut and not ``idle``."""
        if not self.reader.uncommitted and not idle:
            return None
        self.table.wait_for_downstreams()  # backpressure: no epoch is cut (nor read) while a downstream lags
        held, dead = self.reader.take()
        total = self.dead_letters + len(dead)
        offsets = [TopicPartition(self.spec.topic, p, o) for p, o in sorted(self.positions.items())]
        consumed = ConsumedInput(offsets, self._consumer.consumer_group_metadata(),
                                 offsets_mutation(self.name, self.spec.topic, self.positions,
                                                  self._seen.take_changed(), total))
        return _Cut(held, consumed, dead, total, dict(self.positions), self.progress.messages)

    def _commit_cut(self, cut: _Cut) -> int:
        """Commit a cut epoch: its held changes join the table's pending writes (which only this epoch's
        reading queued: the next epoch waits, see ``EpochReader._hand_over_held``), then one Kafka transaction with the
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
        if topic is None or topic.error is not None or len(topic.partitions) <= self.reader.partitions:
            return []  # a topic that is gone is reported by the consumer's own error
        added = list(range(self.reader.partitions, len(topic.partitions)))
        committed = self._consumer.committed([TopicPartition(self.spec.topic, p) for p in added], 30.0)
        self._consumer.incremental_assign([TopicPartition(self.spec.topic, tp.partition,
                                                          tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                                           for tp in committed])
        self.reader.partitions = len(topic.partitions)
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
        self._commits.close()  # its commit uses the table's producer: let it end first (its error is moot)
        self._consumer.close()
        self.reader.discard()
        self.table.discard()
        self.table.close()

    def __enter__(self) -> SourceIngester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["IngestProgress", "SourceIngester"]
