"""Kafka consumer groups as ``mvlog replay`` sees them: state, members, committed offsets, offset reset.

Offsets of a group can only be moved while it has no live member (as ``kafka-consumer-groups
--reset-offsets`` insists): a member would overwrite them with its next commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from mvlog.config import Settings

_ACTIVE_STATES = {ConsumerGroupState.STABLE, ConsumerGroupState.PREPARING_REBALANCING,
                  ConsumerGroupState.COMPLETING_REBALANCING}


class ConsumerGroupError(RuntimeError):
    """The group cannot be reset (it is active, or the broker refused)."""


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str

    def __str__(self) -> str:
        return f"{self.member_id} (client {self.client_id} on {self.host})"


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: str
    members: tuple[GroupMember, ...]

    @property
    def active(self) -> bool:
        return bool(self.members) or self.state in {s.name.lower() for s in _ACTIVE_STATES}

    def refusal(self) -> str:
        members = ", ".join(str(m) for m in self.members) or "none listed by the broker"
        return (f"consumer group {self.group} is active (state {self.state}; members: {members}); "
                "stop its consumers first, then reset its offsets")


class ConsumerGroups:
    def __init__(self, settings: Settings, timeout: float = 15.0) -> None:
        self._admin = AdminClient(settings.kafka_client_config())
        self._timeout = timeout

    def describe(self, group: str) -> GroupDescription:
        try:
            found = self._admin.describe_consumer_groups([group], request_timeout=self._timeout)[group]
            description = found.result(self._timeout)
        except KafkaException as exc:
            raise ConsumerGroupError(f"cannot describe consumer group {group}: {exc}") from exc
        members = tuple(GroupMember(m.member_id, m.client_id, m.host) for m in description.members or ())
        state = description.state.name.lower() if description.state is not None else "unknown"
        return GroupDescription(group, state, members)

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int | None]:
        """The group's committed offset per partition (None where it has none)."""
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
        try:
            result = self._admin.list_consumer_group_offsets([request])[group].result(self._timeout)
        except KafkaException as exc:
            raise ConsumerGroupError(f"cannot read the offsets of consumer group {group}: {exc}") from exc
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result.topic_partitions}

    def reset(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Move the group's committed offsets (refused while the group is active)."""
        description = self.describe(group)
        if description.active:
            raise ConsumerGroupError(description.refusal())
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in offsets.items()])
        try:
            result = self._admin.alter_consumer_group_offsets([request])[group].result(self._timeout)
        except KafkaException as exc:
            raise ConsumerGroupError(f"cannot reset the offsets of consumer group {group}: {exc}") from exc
        failed = [tp for tp in result.topic_partitions if tp.error is not None]
        if failed:
            raise ConsumerGroupError(f"consumer group {group}: the broker refused offsets of "
                                     f"{', '.join(f'partition {tp.partition}: {tp.error}' for tp in failed)}")
