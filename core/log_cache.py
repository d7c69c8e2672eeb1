"""The bounded log cache: the most recent complete, committed epochs of each upstream, in memory.

A Faust log-cache worker puts every committed epoch it aligns into this cache; readers (Spark
executors) ask for an epoch range of one upstream. The cache holds, per upstream, a *contiguous* run of
committed epochs: the first one's ``prev_epoch`` is the run's ``floor``, and by the chain rule (a
barrier names the previous committed epoch) every committed epoch in ``(floor, tail]`` is in the run.
So a range ``(after, upto]`` is fully served from memory iff ``floor <= after`` and ``upto <= tail``;
below the floor the epochs were evicted (read them from Kafka), above the tail they are not there yet.

An epoch too large to keep (over the byte bound, or over the worker's per-epoch budget) leaves a
*hole*: the epochs before it stay, and a range that spans the hole is answered like an eviction whose
floor is the hole (the reader takes everything up to it from Kafka, the rest from memory). So one large
epoch costs its readers that epoch's range, not every epoch the cache held.

Bounds are in bytes (over all upstreams) and in epochs (per upstream); whichever is reached first
evicts the oldest epochs. Payloads are opaque (the worker stores Arrow record batches per partition),
so this module stays pure and unit-testable.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")


class RangeStatus(StrEnum):
    HIT = "hit"  # every committed epoch of the range is in the cache
    EVICTED = "evicted"  # the range starts below the floor (or spans a hole): up to the floor, Kafka only
    NOT_YET = "not_yet"  # the range ends above the tail: the cache has not aligned those epochs yet
    EMPTY = "empty"  # the cache holds nothing of this upstream


@dataclass(frozen=True)
class CachedEpoch(Generic[T]):
    """One complete committed epoch: a payload per partition, and its size in bytes."""

    epoch: int
    prev_epoch: int
    parts: Mapping[int, T]  # partition -> payload
    nbytes: int


@dataclass(frozen=True)
class RangeLookup(Generic[T]):
    status: RangeStatus
    floor: int | None  # every committed epoch above it and up to ``upto`` (up to ``tail`` unless EVICTED) is cached
    tail: int | None
    epochs: list[CachedEpoch[T]] = field(default_factory=list)  # the range's epochs when status is HIT


class CacheError(ValueError):
    """An epoch that would break the run's contiguity (not the successor of the tail)."""


@dataclass
class _Run(Generic[T]):
    epochs: deque[CachedEpoch[T]] = field(default_factory=deque)
    numbers: deque[int] = field(default_factory=deque)  # epoch numbers, ascending, for bisect
    floor: int | None = None
    holes: deque[int] = field(default_factory=deque)  # skipped epochs above the floor, ascending
    nbytes: int = 0

    @property
    def tail(self) -> int | None:
        """The newest committed epoch put or skipped (the floor when the run holds neither)."""
        ends = [d[-1] for d in (self.numbers, self.holes) if d]
        return max(ends) if ends else self.floor


class LogCache(Generic[T]):
    """Recent epochs of every upstream, within ``max_bytes`` overall and ``max_epochs`` per upstream."""

    def __init__(self, max_bytes: int, max_epochs: int) -> None:
        if max_bytes < 1 or max_epochs < 1:
            raise ValueError("cache bounds must be at least 1")
        self.max_bytes = max_bytes
        self.max_epochs = max_epochs
        self._runs: dict[str, _Run[T]] = {}
        self.nbytes = 0
        self.evicted_epochs = 0

    # --- writing ----------------------------------------------------------------------------------

    def put(self, upstream: str, epoch: CachedEpoch[T]) -> None:
        """Append the next committed epoch of ``upstream`` (its ``prev_epoch`` must be the tail).

        An epoch larger than the whole byte bound is not kept: it is skipped (a hole, see :meth:`skip`),
        so its readers go to Kafka and the bound holds.
        """
        if epoch.nbytes > self.max_bytes:
            self.skip(upstream, epoch.epoch, epoch.prev_epoch)
            return
        run = self._check_follows(upstream, epoch.epoch, epoch.prev_epoch)
        if run.floor is None:
            run.floor = epoch.prev_epoch
        run.epochs.append(epoch)
        run.numbers.append(epoch.epoch)
        run.nbytes += epoch.nbytes
        self.nbytes += epoch.nbytes
        while len(run.epochs) > self.max_epochs:
            self._evict_oldest(upstream)
        while self.nbytes > self.max_bytes:
            self._evict_oldest(self._oldest_upstream())

    def skip(self, upstream: str, epoch: int, prev_epoch: int) -> None:
        """The next committed epoch of ``upstream`` is not kept (too large): a hole in the run, which
        readers of a range across it take from Kafka up to it; the epochs before it stay (a run holding
        none restarts after it)."""
        run = self._check_follows(upstream, epoch, prev_epoch)
        if run.epochs:
            run.holes.append(epoch)
        else:
            run.floor = epoch
            run.holes.clear()
        self.evicted_epochs += 1

    def _check_follows(self, upstream: str, epoch: int, prev_epoch: int) -> _Run[T]:
        run = self._runs.setdefault(upstream, _Run())
        tail = run.tail
        if tail is not None and prev_epoch != tail:
            raise CacheError(f"{upstream}: epoch {epoch} follows {prev_epoch}, the cache's tail is {tail}")
        return run

    def reset(self, upstream: str) -> None:
        """Forget an upstream (its partitions were reassigned: the next epoch starts a new run)."""
        self._drop_run(upstream)

    def _drop_run(self, upstream: str) -> None:
        run = self._runs.pop(upstream, None)
        if run is not None:
            self.nbytes -= run.nbytes

    def _oldest_upstream(self) -> str:
        # Epochs are wall-clock based, so the smallest head epoch is the oldest data in memory.
        return min((u for u, r in self._runs.items() if r.epochs), key=lambda u: self._runs[u].numbers[0])

    def _evict_oldest(self, upstream: str) -> None:
        run = self._runs[upstream]
        oldest = run.epochs.popleft()
        run.numbers.popleft()
        run.floor = oldest.epoch
        # Holes right above the new floor go with it: the floor's successor is a cached epoch, or nothing.
        while run.holes and (not run.numbers or run.holes[0] < run.numbers[0]):
            run.floor = run.holes.popleft()
        run.nbytes -= oldest.nbytes
        self.nbytes -= oldest.nbytes
        self.evicted_epochs += 1

    # --- reading ----------------------------------------------------------------------------------

    def floor(self, upstream: str) -> int | None:
        run = self._runs.get(upstream)
        return run.floor if run is not None else None

    def tail(self, upstream: str) -> int | None:
        run = self._runs.get(upstream)
        return run.tail if run is not None else None

    def epoch_count(self, upstream: str) -> int:
        run = self._runs.get(upstream)
        return len(run.epochs) if run is not None else 0

    def upstreams(self) -> list[str]:
        return sorted(self._runs)

    def lookup(self, upstream: str, after: int, upto: int) -> RangeLookup[T]:
        """The committed epochs of ``upstream`` in ``(after, upto]``, or why the cache cannot serve them."""
        run = self._runs.get(upstream)
        if run is None or run.floor is None:
            return RangeLookup(RangeStatus.EMPTY, None, None)
        tail = run.tail
        assert tail is not None
        if after < run.floor:
            return RangeLookup(RangeStatus.EVICTED, run.floor, tail)
        if upto > tail:
            return RangeLookup(RangeStatus.NOT_YET, run.floor, tail)
        # The newest hole in the range, if any: the epochs up to it are not all here.
        hole = bisect.bisect_right(run.holes, upto)
        if hole and run.holes[hole - 1] > after:
            return RangeLookup(RangeStatus.EVICTED, run.holes[hole - 1], tail)
        # Bisect over the deque: its indexing walks blocks of 64 entries, cheap for a few thousand epochs.
        numbers = run.numbers
        low = bisect.bisect_right(numbers, after)
        high = bisect.bisect_right(numbers, upto)
        return RangeLookup(RangeStatus.HIT, run.floor, tail, [run.epochs[i] for i in range(low, high)])
