"""Barrier alignment: turn per-partition streams of changes and barriers into committed epochs.

Each partition carries an epoch's changes followed by its barrier. An epoch is *complete* when every
partition has delivered its barrier, and *committed* when it is confirmed: either the next complete
epoch names it as ``prev_epoch`` (the chain rule), or the caller knows it from the epoch index
(:meth:`EpochAligner.confirm`).

The chain rule is what makes readers exactly-once on brokers that deliver the records of aborted
transactions to ``read_committed`` consumers (Tansu 0.6 does): records of an abandoned epoch are
dropped because no later barrier names that epoch, and a restarted writer continues from its last
committed epoch. Changes are matched to their barrier by epoch and transaction id, so stray records of
an aborted transaction never count towards a committed epoch, even a redone one with the same number.

A partition a whole epoch ahead of the slowest should be paused by the caller
(:meth:`EpochAligner.partitions_to_pause`), so the aligner buffers about one epoch per partition. A
caller with a memory budget may stop keeping an epoch's changes (:meth:`EpochAligner.drop`,
:meth:`EpochAligner.count_change`): the epoch still aligns and commits, with ``Epoch.dropped`` saying
how many of its changes were counted but not kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mvlog.changes import Barrier, Change, ChangeOrigin, Epoch


class AlignmentError(RuntimeError):
    """The log cannot be an mvlog changelog (counts disagree, epochs go backwards)."""


@dataclass
class _Segment:
    barrier: Barrier
    offset: int
    changes: list[Change]
    origins: list[ChangeOrigin]
    dropped: int = 0


@dataclass
class _PartitionBuffer:
    open_changes: dict[tuple[int, str], list[Change]] = field(default_factory=dict)  # (epoch, txn) -> changes
    open_origins: dict[tuple[int, str], list[ChangeOrigin]] = field(default_factory=dict)  # same keys, if given
    open_dropped: dict[tuple[int, str], int] = field(default_factory=dict)  # same keys: counted, not kept
    sealed: deque[_Segment] = field(default_factory=deque)
    poison: int = 0  # change events dead-lettered since the partition's last barrier


class EpochAligner:
    """Aligns barriers across ``partitions``; epochs at or below ``after_epoch`` are dropped."""

    def __init__(self, view: str, partitions: Iterable[int], after_epoch: int = 0) -> None:
        self.view = view
        self._buffers = {p: _PartitionBuffer() for p in partitions}
        if not self._buffers:
            raise ValueError("an aligner needs at least one partition")
        self.after_epoch = after_epoch
        self.last_epoch = after_epoch  # the last committed epoch handed out
        self._held: Epoch | None = None  # complete, waiting for confirmation
        self.abandoned: list[int] = []  # epochs dropped by the chain rule (for diagnostics and tests)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._buffers)

    @property
    def held_epoch(self) -> int | None:
        return self._held.epoch if self._held is not None else None

    def add_change(self, partition: int, epoch: int, change: Change, txn: str = "",
                   origin: ChangeOrigin | None = None) -> None:
        """Buffer a change until its barrier; ``origin`` (offset, key bytes) is kept for the released epoch."""
        if epoch > self.after_epoch:
            buffer = self._buffers[partition]
            buffer.open_changes.setdefault((epoch, txn), []).append(change)
            if origin is not None:
                buffer.open_origins.setdefault((epoch, txn), []).append(origin)

    def count_change(self, partition: int, epoch: int, txn: str = "") -> None:
        """A change of ``(epoch, txn)`` that is counted towards its barrier but not kept."""
        if epoch > self.after_epoch:
            dropped = self._buffers[partition].open_dropped
            dropped[(epoch, txn)] = dropped.get((epoch, txn), 0) + 1

    def count_changes(self, partition: int, epoch: int, txn: str, count: int) -> None:
        """:meth:`count_change` of ``count`` changes at once: a caller that keeps an epoch's changes itself
        (the log cache's feed keeps them as Arrow batches, decoded a run at a time) only has them counted
        towards their barrier, with no per-change work here."""
        if epoch > self.after_epoch and count:
            dropped = self._buffers[partition].open_dropped
            dropped[(epoch, txn)] = dropped.get((epoch, txn), 0) + count

    def drop(self, epoch: int, txn: str = "") -> None:
        """Stop keeping the changes of ``(epoch, txn)`` read so far, in every partition, open or sealed;
        they still count towards its barriers, and later ones go to :meth:`count_change`."""
        for buffer in self._buffers.values():
            kept = buffer.open_changes.pop((epoch, txn), [])
            buffer.open_origins.pop((epoch, txn), None)
            if kept:
                buffer.open_dropped[(epoch, txn)] = buffer.open_dropped.get((epoch, txn), 0) + len(kept)
            for segment in buffer.sealed:
                if (segment.barrier.epoch, segment.barrier.txn) == (epoch, txn) and segment.changes:
                    segment.dropped += len(segment.changes)
                    segment.changes, segment.origins = [], []

    def add_poison(self, partition: int) -> None:
        """A record announced as a change event could not be decoded (it went to the dead-letter topic):
        the next barrier of the partition may count it, so it may be that many changes short."""
        self._buffers[partition].poison += 1

    def add_barrier(self, partition: int, barrier: Barrier, offset: int) -> list[Epoch]:
        """Seal the partition's changes of ``barrier.epoch``; returns the epochs this commits."""
        buffer = self._buffers[partition]
        poison, buffer.poison = buffer.poison, 0
        changes = buffer.open_changes.pop((barrier.epoch, barrier.txn), [])
        origins = buffer.open_origins.pop((barrier.epoch, barrier.txn), [])
        dropped = buffer.open_dropped.pop((barrier.epoch, barrier.txn), 0)
        # Changes of older epochs (or of another attempt at this one) whose barrier never came here
        # belong to abandoned transactions.
        for stale in [a for a in buffer.open_changes if a[0] <= barrier.epoch]:
            del buffer.open_changes[stale]
            buffer.open_origins.pop(stale, None)
        for stale in [a for a in buffer.open_dropped if a[0] <= barrier.epoch]:
            del buffer.open_dropped[stale]
        if barrier.epoch <= self.after_epoch:
            return []
        read = len(changes) + dropped
        if not read <= barrier.records <= read + poison:
            raise AlignmentError(
                f"{self.view} partition {partition}: epoch {barrier.epoch} barrier at offset {offset} "
                f"announces {barrier.records} change(s) but {read} were read; the log before it "
                "is incomplete (deleted by retention, or not written by an mvlog writer)"
                + (f"; {poison} undecodable change(s) went to the dead-letter topic" if poison else ""))
        buffer.sealed.append(_Segment(barrier, offset, changes, origins, dropped))
        return self._pop_complete()

    def confirm(self, epoch: int, barrier_offsets: Mapping[int, int]) -> list[Epoch]:
        """The epoch index says ``epoch`` committed with its barriers at ``barrier_offsets``: release it
        if the held epoch is that one (and not an aborted attempt at the same epoch)."""
        held = self._held
        if held is None or held.epoch != epoch:
            return []
        if any(held.offsets.get(p) != offset for p, offset in barrier_offsets.items()):
            return []
        return [self._release()]

    def release_held(self) -> Epoch | None:
        """Release the complete epoch held for confirmation on the caller's own proof that it committed
        (e.g. a downstream view was built on it); None when no epoch is held."""
        return self._release() if self._held is not None else None

    def partitions_to_pause(self) -> set[int]:
        """Partitions holding a sealed epoch that some other partition has not sealed yet."""
        if all(b.sealed for b in self._buffers.values()):
            return set()
        return {p for p, b in self._buffers.items() if b.sealed}

    def buffered_changes(self) -> int:
        held = len(self._held.changes) if self._held is not None else 0
        return held + sum(sum(map(len, b.open_changes.values())) + sum(len(s.changes) for s in b.sealed)
                          for b in self._buffers.values())

    def _release(self) -> Epoch:
        assert self._held is not None
        epoch, self._held = self._held, None
        self.last_epoch = epoch.epoch
        return epoch

    def _pop_complete(self) -> list[Epoch]:
        committed: list[Epoch] = []
        while all(b.sealed for b in self._buffers.values()):
            heads = {p: b.sealed[0] for p, b in self._buffers.items()}
            newest = max(s.barrier.epoch for s in heads.values())
            behind = [p for p, s in heads.items() if s.barrier.epoch < newest]
            if behind:
                # Some partition is already past these epochs: they can never complete (abandoned).
                for p in behind:
                    self.abandoned.append(self._buffers[p].sealed.popleft().barrier.epoch)
                continue
            for buffer in self._buffers.values():
                buffer.sealed.popleft()
            first = next(iter(heads.values())).barrier
            epoch = Epoch(view=self.view, epoch=newest, prev_epoch=first.prev_epoch,
                          changes=[c for p in sorted(heads) for c in heads[p].changes],
                          barriers={p: s.barrier for p, s in heads.items()},
                          offsets={p: s.offset for p, s in heads.items()},
                          origins=[o for p in sorted(heads) for o in heads[p].origins],
                          dropped=sum(s.dropped for s in heads.values()))
            if self._held is not None:
                if epoch.prev_epoch == self._held.epoch:
                    committed.append(self._release())
                else:
                    self.abandoned.append(self._held.epoch)
                    self._held = None
            if epoch.epoch <= self.last_epoch:
                raise AlignmentError(f"{self.view}: epoch {epoch.epoch} is not above {self.last_epoch}")
            self._held = epoch
        return committed
