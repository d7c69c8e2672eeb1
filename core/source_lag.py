"""How far a source table is behind its topic: records and seconds, and what is wrong with the topic.

A view's lag is measured against its upstream's MCE; a source table's upstream is a topic mvlog does
not own, so its lag is measured against the topic itself, per partition, from three numbers Kafka
keeps whether or not the ingester runs (so a stopped ingester shows a growing lag instead of none):

* **records**: the topic's end offset minus the offset the table's consumer group committed (in the
  epoch's own transaction: what the table holds). A partition the group never committed lags from the
  topic's start (the ingester starts there).
* **seconds**: the age, at the moment of the sample, of the oldest message the table has not ingested
  (the first message at or after the committed offset), over the partitions that lag; 0 when none lags.
  An age rather than "newest message minus newest ingested": a topic that stopped receiving messages
  while the ingester is down still shows the wait of what it holds. Message timestamps are the
  producer's (CreateTime) unless the topic says LogAppendTime; a clock ahead of ours counts as 0.
* **problems**: a committed offset below the topic's start (retention deleted messages the table never
  ingested) or a topic that no longer exists, each with what to do. They are reported, never skipped.

Pure: the Kafka side (:mod:`mvlog.connectors.redis.source_status`) gathers the offsets and timestamps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PartitionPosition:
    """One partition of a source topic as Kafka reports it: the group's committed offset (None: never
    committed), the topic's start and end offsets, and the timestamp of the first message at or after
    the committed offset (None when nothing is unread or it could not be read in time)."""

    partition: int
    committed: int | None
    start: int
    end: int
    first_unread_ts_ms: int | None = None

    @property
    def next_offset(self) -> int:
        """Where the ingester reads next: the committed offset, else the topic's start."""
        return self.start if self.committed is None else self.committed

    @property
    def records(self) -> int:
        """Messages in the topic the table has not ingested (those retention deleted are not counted)."""
        return max(0, self.end - max(self.next_offset, self.start))

    @property
    def lost(self) -> int:
        """Messages retention deleted before the table ingested them (committed below the start)."""
        return max(0, self.start - self.committed) if self.committed is not None else 0


@dataclass(frozen=True, slots=True)
class SourceLag:
    """A source table's lag behind its topic at wall-clock ``ts_ms``."""

    table: str
    topic: str
    ts_ms: int
    records: int
    seconds: float | None  # None: some partition lags but none of its messages could be read in time
    partitions: int
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "topic": self.topic, "ts_ms": self.ts_ms, "records": self.records,
                "seconds": self.seconds, "partitions": self.partitions, "problems": list(self.problems)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceLag:
        return cls(data["table"], data["topic"], data["ts_ms"], data["records"], data["seconds"],
                   data["partitions"], tuple(data.get("problems", ())))


@dataclass(frozen=True, slots=True)
class SourceState:
    """A source table as ``mvlog status`` shows it: its topic, how many bad records it dead-lettered
    (committed), why its ingester stopped (None while fine) and its lag as last measured."""

    topic: str
    format: str
    dead_letters: int
    dead_letter_topic: str
    problem: str | None
    lag: SourceLag | None

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "format": self.format, "dead_letters": self.dead_letters,
                "dead_letter_topic": self.dead_letter_topic, "problem": self.problem,
                "lag": self.lag.to_json() if self.lag is not None else None, "problems": self.problems}

    def with_lag(self, lag: SourceLag | None) -> SourceState:
        return SourceState(self.topic, self.format, self.dead_letters, self.dead_letter_topic, self.problem, lag)

    @property
    def problems(self) -> list[str]:
        """The ingester's problem and those the lag measurement found (a topic gone, offsets deleted)."""
        found = [self.problem] if self.problem else []
        return found + [p for p in (self.lag.problems if self.lag else ()) if p not in found]


def source_lag(table: str, topic: str, group: str, ts_ms: int, positions: Sequence[PartitionPosition]) -> SourceLag:
    """The lag of ``table`` (consumer group ``group``) from the positions of its topic's partitions."""
    records = sum(p.records for p in positions)
    ages = [max(0, ts_ms - p.first_unread_ts_ms) / 1000 for p in positions
            if p.records and p.first_unread_ts_ms is not None]
    unknown = any(p.records and p.first_unread_ts_ms is None for p in positions)
    seconds = max(ages) if ages else (None if unknown else 0.0)
    problems = tuple(
        f"{topic}[{p.partition}]: retention deleted offsets {p.committed} to {p.start - 1} before the table "
        f"ingested them ({p.lost} message(s)); the ingester stops there: reset group {group} on that partition "
        f"to where the table should go on (kafka-consumer-groups --reset-offsets) or recreate the table"
        for p in positions if p.lost)
    return SourceLag(table, topic, ts_ms, records, seconds, len(positions), problems)


def missing_topic(table: str, topic: str, ts_ms: int) -> SourceLag:
    """The lag record of a source whose topic does not exist (deleted, or never created)."""
    return SourceLag(table, topic, ts_ms, 0, None, 0, (
        f"source topic {topic!r} does not exist: recreate it (its producer may create it) or drop the table; "
        "the ingester cannot start without it",))


__all__ = ["PartitionPosition", "SourceLag", "SourceState", "missing_topic", "source_lag"]
