"""Barrier alignment: turn per-partition streams of changes and barriers into complete epochs.

Each partition of a changelog carries the epoch's changes followed by the epoch's barrier. An epoch is
complete when every partition has delivered its barrier. A partition that is a whole epoch ahead of
the slowest one should be paused by the caller (:meth:`EpochAligner.partitions_to_pause`), so the
aligner buffers at most about one epoch per partition.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from mvlog.changes import Barrier, Change, Epoch


class AlignmentError(RuntimeError):
    """The partitions disagree about the sequence of epochs: the changelog is not what mvlog wrote."""


@dataclass
class _Segment:
    barrier: Barrier
    offset: int
    changes: list[Change]


@dataclass
class _PartitionBuffer:
    open_changes: list[Change] = field(default_factory=list)
    sealed: deque[_Segment] = field(default_factory=deque)


class EpochAligner:
    """Aligns barriers across ``partitions``; epochs at or below ``after_epoch`` are dropped."""

    def __init__(self, view: str, partitions: Iterable[int], after_epoch: int = 0) -> None:
        self.view = view
        self._buffers = {p: _PartitionBuffer() for p in partitions}
        if not self._buffers:
            raise ValueError("an aligner needs at least one partition")
        self.after_epoch = after_epoch
        self.last_epoch = after_epoch

    @property
    def partitions(self) -> list[int]:
        return sorted(self._buffers)

    def add_change(self, partition: int, change: Change) -> None:
        self._buffers[partition].open_changes.append(change)

    def add_barrier(self, partition: int, barrier: Barrier, offset: int) -> list[Epoch]:
        """Seal the partition's open changes under ``barrier``; returns the epochs this completes."""
        buffer = self._buffers[partition]
        changes, buffer.open_changes = buffer.open_changes, []
        if barrier.epoch <= self.after_epoch:
            return []  # an epoch before the start: its changes were read only to get past it
        if len(changes) != barrier.records:
            raise AlignmentError(
                f"{self.view} partition {partition}: epoch {barrier.epoch} barrier at offset {offset} "
                f"announces {barrier.records} change(s) but {len(changes)} were read; the log before it "
                "is incomplete (deleted by retention, or not written by an mvlog writer)")
        buffer.sealed.append(_Segment(barrier, offset, changes))
        return self._pop_complete()

    def partitions_to_pause(self) -> set[int]:
        """Partitions holding a sealed epoch that some other partition has not sealed yet."""
        if all(b.sealed for b in self._buffers.values()):
            return set()
        return {p for p, b in self._buffers.items() if b.sealed}

    def buffered_changes(self) -> int:
        return sum(len(b.open_changes) + sum(len(s.changes) for s in b.sealed) for b in self._buffers.values())

    def _pop_complete(self) -> list[Epoch]:
        complete: list[Epoch] = []
        while all(b.sealed for b in self._buffers.values()):
            heads = {p: b.sealed.popleft() for p, b in self._buffers.items()}
            epochs = {s.barrier.epoch for s in heads.values()}
            if len(epochs) != 1:
                detail = ", ".join(f"p{p}={s.barrier.epoch}" for p, s in sorted(heads.items()))
                raise AlignmentError(f"{self.view}: partitions disagree on the next epoch ({detail})")
            epoch = epochs.pop()
            if epoch <= self.last_epoch:
                raise AlignmentError(f"{self.view}: epoch {epoch} is not above the previous {self.last_epoch}")
            first = next(iter(heads.values())).barrier
            complete.append(Epoch(
                view=self.view, epoch=epoch, prev_epoch=first.prev_epoch,
                changes=[c for p in sorted(heads) for c in heads[p].changes],
                barriers={p: s.barrier for p, s in heads.items()},
                offsets={p: s.offset for p, s in heads.items()},
            ))
            self.last_epoch = epoch
        return complete
