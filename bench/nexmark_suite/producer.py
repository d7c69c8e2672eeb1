"""Writes the generator's events to the three Nexmark topics (the I/O side of :mod:`.generator`).

Run from the repository root (the venv has confluent-kafka)::

    .venv/bin/python -m bench.nexmark_suite.producer --bootstrap 127.0.0.1:9092 --events 100000 \
        [--rate 0] [--seed 0] [--partitions 1] [--topic-prefix nexmark-] [--event-rate 10000]

``--rate`` paces the writes at that many events/s of wall-clock time (0 = as fast as possible); event
time then advances at the same rate from the wall clock at the start, as in the reference generator's
paced mode. Unpaced, event time advances at ``--event-rate`` (default 10,000 events/s) from
``--base-time-ms`` (default: a fixed instant, so the same seed gives byte-identical topics).

The producer is idempotent (``enable.idempotence``: no duplicates on retries), so every engine reads
exactly the generated stream. Topics are created with ``--partitions`` partitions when missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from .generator import DEFAULT_EVENT_RATE, Event, GeneratorConfig, NexmarkGenerator
from .model import NexmarkTopics
from .peer import SteadyPhase, SteadyProduced

_PACE_CHECK = 64  # events between two looks at the clock when pacing


@dataclass
class ProduceStats:
    """What a run wrote: counts per table, bytes, and its wall-clock span."""

    counts: dict[str, int] = field(default_factory=lambda: {"person": 0, "auction": 0, "bid": 0})
    wire_bytes: int = 0  # keys + values
    started: float = 0.0  # time.time() of the first produce call
    finished: float = 0.0  # time.time() once every message was acknowledged
    last_event_time_ms: int = 0  # date_time of the last event

    @property
    def events(self) -> int:
        return sum(self.counts.values())

    @property
    def seconds(self) -> float:
        return self.finished - self.started


def ensure_topics(bootstrap: str, topics: NexmarkTopics, timeout: float = 30.0) -> None:
    """Create the three topics with ``topics.partitions`` partitions where missing; an existing topic with
    another partition count is refused (its data would be spread differently than asked)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=timeout).topics
    for name in topics.all():
        found = existing.get(name)
        if found is not None and found.error is None and len(found.partitions) != topics.partitions:
            raise ValueError(f"topic {name!r} has {len(found.partitions)} partition(s), not {topics.partitions}: "
                             "delete it or pass its partition count")
    missing = [NewTopic(name, topics.partitions, 1) for name in topics.all() if name not in existing]
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items() if missing else ():
        try:
            future.result()
        except KafkaException as error:
            if "TOPIC_ALREADY_EXISTS" not in str(error):
                raise RuntimeError(f"cannot create topic {name!r} on {bootstrap}: {error}") from error


def encode(event: Event) -> tuple[bytes, bytes]:
    """(message key, message value) of an event: the JSON text of its key field, and its JSON object."""
    key = str(event.row[event.table.message_key]).encode()
    return key, json.dumps(event.row, separators=(",", ":")).encode()


def produce(bootstrap: str, topics: NexmarkTopics, config: GeneratorConfig, rate: float = 0.0,
            on_event: Callable[[Event, float], None] | None = None, producer_config: dict[str, object] | None = None,
            skip: int = 0, only: Collection[str] | None = None) -> ProduceStats:
    """Generate ``config.events`` events into ``topics``; paced at ``rate`` events/s when ``rate > 0`` (then
    event time starts at the wall clock and advances at ``rate``). ``on_event(event, produce_time)`` is
    called after each ``produce`` call, with ``time.time()`` at that call (the message's timestamp).
    ``skip``: the first ``skip`` events are generated but not written (a second wave of the same stream,
    unpaced only: paced event times start at the wall clock); ``only``: write the events of these tables
    alone (of person / auction / bid). Returns once every message is acknowledged."""
    if skip and rate > 0:
        raise ValueError("skip is for unpaced waves: a paced run's event times start at the wall clock")
    if rate < 0:
        raise ValueError(f"rate must be >= 0 events/s (0 = as fast as possible), got {rate}")
    ensure_topics(bootstrap, topics)
    generator = NexmarkGenerator(config)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5 if rate else 50,
                         "batch.size": 1 << 20, "compression.type": "none",
                         "queue.buffering.max.messages": 500_000, **(producer_config or {})})
    stats = ProduceStats()
    topic_of = {"person": topics.person, "auction": topics.auction, "bid": topics.bid}
    errors: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is not None:
            errors.append(str(error))

    stats.started = start = time.time()
    if rate > 0:  # event time from now on, at the pace of the writes (the generator's tables are built)
        generator.config = replace(config, event_rate=rate, base_time_ms=int(start * 1000))
    for event in generator:
        if event.number < skip or (only is not None and event.table.name not in only):
            continue
        if rate > 0 and event.number % _PACE_CHECK == 0:
            ahead = start + event.number / rate - time.time()
            if ahead > 0:
                producer.poll(0)
                time.sleep(ahead)
        key, value = encode(event)
        topic = topic_of[event.table.name]
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if on_event is not None:
            on_event(event, time.time())
        stats.counts[event.table.name] += 1
        stats.wire_bytes += len(key) + len(value)
        stats.last_event_time_ms = event.date_time
        if event.number % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    stats.finished = time.time()
    if remaining or errors:
        raise RuntimeError(f"{remaining} message(s) not delivered, {len(errors)} delivery error(s): {errors[:3]}")
    return stats


def steady_phase(bootstrap: str, topics: NexmarkTopics, rate: float, events: int, warmup_events: int,
                 seed: int = 1) -> SteadyPhase:
    """A :class:`~.peer.SteadyPhase` whose ``produce()`` writes ``events`` events paced at ``rate`` into
    ``topics`` (created now, so a job can start on them before anything is written)."""
    if rate <= 0:
        raise ValueError(f"the steady phase needs a rate > 0 events/s, got {rate}")
    ensure_topics(bootstrap, topics)
    config = GeneratorConfig(seed=seed, events=events)

    def run() -> SteadyProduced:
        times: list[float] = []
        base: list[int] = []

        def record(event: Event, produced: float) -> None:
            if not base:
                base.append(event.date_time)
            times.append(produced)

        produce(bootstrap, topics, config, rate=rate, on_event=record)
        return SteadyProduced(times, base[0] if base else 0, rate, warmup_events)

    return SteadyPhase(topics, rate, events, warmup_events, run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, e.g. 127.0.0.1:9092")
    parser.add_argument("--events", type=int, default=100_000, help="events to write (default 100000)")
    parser.add_argument("--rate", type=float, default=0.0, help="events/s of wall-clock time (0 = as fast as possible)")
    parser.add_argument("--event-rate", type=float, default=DEFAULT_EVENT_RATE,
                        help="events/s of event time when --rate is 0 (default 10000, the reference's)")
    parser.add_argument("--base-time-ms", type=int, default=GeneratorConfig.base_time_ms,
                        help="event time of the first event when --rate is 0 (epoch ms)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=1, help="partitions of each topic (default 1)")
    parser.add_argument("--topic-prefix", default="nexmark-",
                        help="topics <prefix>person, <prefix>auction, <prefix>bid (default nexmark-)")
    args = parser.parse_args(argv)
    if args.partitions < 1:
        parser.error("--partitions must be >= 1")
    topics = NexmarkTopics.with_prefix(args.topic_prefix, args.partitions)
    config = GeneratorConfig(seed=args.seed, events=args.events, event_rate=args.event_rate,
                             base_time_ms=args.base_time_ms)
    stats = produce(args.bootstrap, topics, config, rate=args.rate)
    print(f"wrote {stats.events:,} events ({stats.counts['person']:,} persons, {stats.counts['auction']:,} auctions, "
          f"{stats.counts['bid']:,} bids; {stats.wire_bytes / 1e6:.1f} MB) to {', '.join(topics.all())} in "
          f"{stats.seconds:.1f} s ({stats.events / max(stats.seconds, 1e-9):,.0f} events/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
