"""Re-delivering a view's changelog to a consumer group from an epoch or a time (``mvlog replay redeliver``).

This is Kafka's offset reset expressed in epochs: the group's committed offset in every partition moves
to the first record of the target epoch, found in the epoch index (the record after the previous
epoch's barrier). A consumer of the group then receives exactly that epoch and everything after it,
on every partition, with no scan of the log and no use of the broker's high watermark.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from mvlog.config import Settings
from mvlog.connectors.kafka.consumer_groups import ConsumerGroups, GroupDescription
from mvlog.connectors.kafka.retention import low_watermarks, retained_epochs, starts_the_log
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.epoch import epoch_from_millis
from mvlog.replay import PartitionStart, ReplayRangeError, RetainedRange, partition_start


@dataclass(frozen=True)
class Target:
    """What the offsets are reset to: exactly one of an epoch, a time (epoch ms), earliest or latest."""

    epoch: int | None = None
    time_ms: int | None = None
    earliest: bool = False
    latest: bool = False


@dataclass
class RedeliveryPlan:
    view: str
    topic: str
    group: str
    group_state: str
    epoch: int | None  # the first re-delivered epoch (None: nothing to re-deliver, offsets go to the end)
    retained: RetainedRange
    partitions: list[PartitionStart]
    current: dict[int, int | None]
    executed: bool = False
    members: list[str] = field(default_factory=list)

    @property
    def offsets(self) -> dict[int, int]:
        return {p.partition: p.offset for p in self.partitions}

    def to_json(self) -> dict[str, Any]:
        return {
            "view": self.view, "topic": self.topic, "group": self.group, "group_state": self.group_state,
            "epoch": self.epoch, "retained": {"oldest": self.retained.oldest, "latest": self.retained.latest},
            "executed": self.executed, "dry_run": not self.executed,
            "partitions": [{**asdict(p), "records": p.records, "current_offset": self.current.get(p.partition)}
                           for p in self.partitions],
        }


def _first_epoch(index: EpochIndex, view: str, retained: RetainedRange, target: Target,
                 starts_the_log: bool) -> int | None:
    if target.earliest:
        return retained.oldest
    if target.latest:
        return None
    if target.time_ms is not None:
        epoch = epoch_from_millis(target.time_ms)
        if epoch < retained.oldest and starts_the_log:
            epoch = retained.oldest  # before the view's first epoch, nothing deleted: from the start (as Kafka)
        if epoch < retained.oldest:
            retained.check_time(target.time_ms)
    elif target.epoch is not None:
        retained.check_epoch(target.epoch)
        epoch = target.epoch
    else:
        raise ValueError("a re-delivery needs a target: an epoch, a time, earliest or latest")
    found = index.first_at_or_after(view, 0, epoch)
    return found.epoch if found is not None and found.epoch <= retained.latest else None


def plan_redelivery(settings: Settings, client: redis.Redis, view: str, group: str, target: Target,
                    groups: ConsumerGroups | None = None) -> RedeliveryPlan:
    """Where every partition's offset would go, what it re-delivers, and the group's current state."""
    entry = CatalogStore(settings, client).get(view)
    index = EpochIndex(client, settings.topic_prefix)
    parts = range(entry.partitions)
    retained = retained_epochs(settings, index, view, entry.partitions)
    topic = settings.changelog_topic(view)
    lows = low_watermarks(settings, topic, entry.partitions)
    first = _first_epoch(index, view, retained, target, starts_the_log(settings, index, view))
    starts: list[PartitionStart] = []
    for p in parts:
        if first is None:  # to the end: one past the last committed barrier
            latest = index.latest(view, p)
            starts.append(partition_start(p, latest, []))
            continue
        entries = index.between(view, p, first - 1, retained.latest)
        try:  # retention may have gone on since the range was read
            starts.append(partition_start(p, index.before(view, p, first), entries, lows[p]))
        except ReplayRangeError as error:
            raise ReplayRangeError(f"{view}: {error}") from None
    groups = groups or ConsumerGroups(settings)
    description: GroupDescription = groups.describe(group)
    return RedeliveryPlan(view, topic, group, description.state, first, retained, starts,
                          groups.committed(group, topic, entry.partitions),
                          members=[str(m) for m in description.members])


def execute_redelivery(settings: Settings, plan: RedeliveryPlan, groups: ConsumerGroups | None = None) -> None:
    """Move the group's offsets as planned (refused, naming the members, while the group is active)."""
    (groups or ConsumerGroups(settings)).reset(plan.group, plan.topic, plan.offsets)
    plan.executed = True
