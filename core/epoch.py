"""Epochs: int64, strictly increasing, surviving restarts.

An epoch is wall-clock milliseconds shifted left 16 bits plus a sequence number, so epochs of different
writers interleave by time and a restarted writer continues above the last epoch it committed even if
the clock stepped back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SEQUENCE_BITS = 16
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
MAX_EPOCH = (1 << 63) - 1


def epoch_from_millis(millis: int, sequence: int = 0) -> int:
    return (millis << SEQUENCE_BITS) | (sequence & SEQUENCE_MASK)


def epoch_millis(epoch: int) -> int:
    """Wall-clock time (ms) at which ``epoch`` was opened."""
    return epoch >> SEQUENCE_BITS


class EpochClock:
    """Hands out strictly increasing epochs, starting above ``last_epoch``."""

    def __init__(self, last_epoch: int = 0, now_ms: Callable[[], int] | None = None) -> None:
        self._last = last_epoch
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)

    @property
    def last(self) -> int:
        return self._last

    def observe(self, epoch: int) -> None:
        """Never hand out an epoch at or below one seen elsewhere (e.g. in the changelog)."""
        self._last = max(self._last, epoch)

    def next(self) -> int:
        epoch = max(epoch_from_millis(self._now_ms()), self._last + 1)
        if epoch > MAX_EPOCH:
            raise OverflowError("epoch exceeds int64")
        self._last = epoch
        return epoch
