"""How many messages a source table's epoch may take so that epochs keep being cut every interval.

The ingester cuts an epoch when the barrier interval has passed. That alone keeps epochs on time while
the topic is quiet, but not while it catches up on a backlog (a lagging partition, a restart after a
pause): everything read during the interval must then be applied and committed, and the commit of a
large epoch (change events, Redis before-images and rows) can take several intervals, so the table's
epochs, and every view above it, fall behind the barrier interval. The rule here: **measure the seconds
an epoch's work takes per message (apply + commit, a moving average), and cap the next epoch at the
messages that fit in most of the interval.** Epochs stay near the interval; a backlog is ingested in
more, smaller epochs (a fixed cost per epoch: one transaction, a barrier per changelog partition).

Pure, so the rule is unit-tested without Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EpochPace:
    """``interval_s``: the barrier interval; ``share``: the part of it the work of one epoch may take
    (the rest is the consume wait and the unforeseen); ``min_messages``: never cap below this (an epoch
    must make progress even on a machine slower than the interval)."""

    interval_s: float
    share: float = 0.7
    min_messages: int = 200
    per_message_s: float | None = None  # moving average of an epoch's work per message

    def observe(self, messages: int, seconds: float) -> None:
        """Record an epoch of ``messages`` whose apply and commit took ``seconds``. Small epochs say little
        about the cost per message (their fixed cost dominates): they are left out."""
        if messages < self.min_messages // 2 or seconds <= 0:
            return
        sample = seconds / messages
        self.per_message_s = sample if self.per_message_s is None else 0.5 * self.per_message_s + 0.5 * sample

    def max_messages(self) -> int | None:
        """The cap of the next epoch, None until an epoch was measured (the interval alone cuts it)."""
        if self.per_message_s is None:
            return None
        return max(self.min_messages, int(self.interval_s * self.share / self.per_message_s))


__all__ = ["EpochPace"]
