"""Which epochs one changelog partition still has to write, when each partition commits its part of an
epoch in a Kafka transaction of its own (a view whose operator runs in Spark's tasks).

A partition's attempt at an epoch is *final* once its transaction committed: a retried or speculative
task, or the task of a consumer restarted after its driver died, never writes that partition's epoch
again. After fencing every earlier writer of the partition (``init_transactions`` of the partition's
transactional id), a task reads the barriers its partition committed after the view's MCE and writes
only the epochs not among them (:func:`resume_partition`). The epochs a partition committed are always
a prefix of the upstream epochs after the MCE, in order, each naming the one before it: anything else
means the partition was written another way (see ``docs/scaling.md``), and is refused rather than
doubled.

Pure: the barriers come from the caller, which read them from Kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mvlog.changes import Mutation
from mvlog.replacement import APPLY_MUTATION


class PartitionLogError(RuntimeError):
    """A partition's log after the MCE is not a prefix of the epochs to write, one attempt each."""


@dataclass(frozen=True)
class PartitionBarrier:
    """A committed barrier of one partition, as a task found it in the log."""

    epoch: int
    prev_epoch: int
    offset: int
    records: int
    mutation: Mutation | None = None  # what the epoch's barriers carry (a backfill's progress, say)


def resume_partition(partition: int, after: int, epochs: Sequence[int],
                     found: Sequence[PartitionBarrier]) -> dict[int, PartitionBarrier]:
    """The epochs of ``epochs`` (ascending, all above the MCE ``after``) that ``partition`` committed
    already, with their barriers; the task writes the others, in order.

    ``found``: the partition's committed barriers after the MCE's barrier, in log order (barriers at or
    below the MCE are the view's history, read when the MCE's barrier offset is unknown: ignored). They
    may go past ``epochs`` (an earlier attempt read a longer micro-batch): those are found again by the
    task that writes the next epochs.
    """
    found = [barrier for barrier in found if barrier.epoch > after]
    if list(epochs) != sorted(set(epochs)) or (epochs and epochs[0] <= after):
        raise ValueError(f"epochs to write must be ascending and above the MCE {after}: {list(epochs)}")
    committed: dict[int, PartitionBarrier] = {}
    prev = after
    for position, barrier in enumerate(found):
        if barrier.prev_epoch != prev or barrier.epoch <= prev:
            raise PartitionLogError(
                f"partition {partition}: the barrier of epoch {barrier.epoch} at offset {barrier.offset} names "
                f"epoch {barrier.prev_epoch}, expected {prev}: the partition holds another attempt of an "
                "epoch above the MCE (written by the driver path after a partition committed alone?)")
        if position < len(epochs) and barrier.epoch != epochs[position]:
            raise PartitionLogError(
                f"partition {partition}: epoch {barrier.epoch} is committed where epoch {epochs[position]} "
                "comes next after the MCE: the upstream epochs changed under the view")
        if position < len(epochs):
            committed[barrier.epoch] = barrier
        prev = barrier.epoch
    return committed


def require_next(partition: int, after: int, epochs: Sequence[int], next_epoch: int | None) -> None:
    """The first epoch a task writes must be the upstream's first committed epoch after the MCE
    (``next_epoch``, from its epoch index): a micro-batch that starts later (planned while Redis was
    wiped) would have each barrier name the MCE past upstream epochs the view never computed. Raised
    before anything is written; the consumer plans again."""
    if epochs and epochs[0] != next_epoch:
        raise PartitionLogError(f"partition {partition}: the micro-batch starts at epoch {epochs[0]}, but the "
                                f"upstream's first epoch after the MCE {after} is {next_epoch}")


def prev_epochs(after: int, epochs: Sequence[int]) -> dict[int, int]:
    """The ``prev_epoch`` each epoch's barrier names: the epoch before it, the MCE for the first (the
    same in every partition, whichever task or attempt writes it)."""
    return dict(zip(epochs, [after, *epochs], strict=False))


def cut_over_of(mutation: Mutation | None) -> str | None:
    """The replacement whose cut-over a barrier's mutation says its epoch is (its id), or None."""
    if mutation is None or mutation.kind != APPLY_MUTATION:
        return None
    return str(mutation.payload.get("replacement_id"))


def same_definition(found: Mutation | None, mine: Mutation | None) -> bool:
    """Whether a partition's committed barrier and the epoch an attempt recomputes agree on what the epoch is:
    the same replacement's cut-over, or neither a cut-over. A cut-over's changes are a diff of two
    definitions, so an epoch committed as one is never kept as the old definition's epoch, nor the other way
    round, even when their change counts agree (a Redis wipe between a cut-over's partition commits and its
    Redis commit loses the record that fixed it, say: the view's consumer then fixes it again from these
    barriers before any epoch is recomputed)."""
    return cut_over_of(found) == cut_over_of(mine)
