"""Changes and epochs as the domain sees them, independent of their Avro encoding.

A change follows the Debezium envelope: ``op`` is ``c`` (create), ``u`` (update), ``d`` (delete) or
``r`` (read: a row emitted by a snapshot or a backfill, applied like a create).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from mvlog.row_schema import Key, Row


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"


@dataclass(frozen=True, slots=True)
class Change:
    op: Op
    key: Key
    before: Row | None
    after: Row | None

    def __post_init__(self) -> None:
        needs_before = self.op in (Op.UPDATE, Op.DELETE)
        needs_after = self.op in (Op.CREATE, Op.UPDATE, Op.READ)
        if needs_before != (self.before is not None) or needs_after != (self.after is not None):
            raise ValueError(f"op {self.op.value!r} with before={self.before!r} after={self.after!r}")

    def signed_rows(self) -> Iterator[tuple[int, Row]]:
        """The change as a retraction of ``before`` and an assertion of ``after`` (weights -1/+1)."""
        if self.before is not None:
            yield -1, self.before
        if self.after is not None:
            yield 1, self.after


def change_between(key: Key, before: Row | None, after: Row | None) -> Change | None:
    """The single change that turns ``before`` into ``after`` (None when nothing changed)."""
    if before == after:
        return None
    if before is None:
        return Change(Op.CREATE, key, None, after)
    if after is None:
        return Change(Op.DELETE, key, before, None)
    return Change(Op.UPDATE, key, before, after)


def apply_changes(rows: dict[Key, Row], changes: Iterable[Change]) -> dict[Key, Row]:
    """Fold changes into a key -> row map in place (the sum of a changelog)."""
    for change in changes:
        if change.after is None:
            rows.pop(change.key, None)
        else:
            rows[change.key] = change.after
    return rows


def undo_changes(rows: dict[Key, Row], changes: Sequence[Change]) -> dict[Key, Row]:
    """Take back ``changes`` (in the order they were applied) from a key -> row map, in place: the rows
    as they were before them. Reading a view at an epoch below its MCE undoes its later epochs."""
    for change in reversed(changes):
        if change.before is None:
            rows.pop(change.key, None)
        else:
            rows[change.key] = change.before
    return rows


@dataclass(frozen=True, slots=True)
class Mutation:
    """A control-plane change carried by a barrier, applied by every reader at that epoch."""

    kind: str  # add_downstream | drop_downstream | pause | resume | apply_replacement | schema_change
    #   | backfill_progress (a chunked backfill's committed positions, see mvlog.backfill_record)
    #   | source_offsets (mvlog.source_offsets) | spark_batch (mvlog.spark_batch_record)
    target: str
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Barrier:
    view: str
    epoch: int
    prev_epoch: int
    checkpoint: bool
    partition: int
    records: int  # change events of this epoch in this partition, so a reader can check completeness
    ts_ms: int
    mutation: Mutation | None = None
    txn: str = ""  # the writing transaction's id, shared by the epoch's change events


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """Where an epoch ends in one partition: the epoch index's value."""

    epoch: int
    offset: int  # offset of the epoch's barrier in the partition
    records: int  # change events of the epoch in the partition

    @property
    def first_offset(self) -> int:
        """The offset of the epoch's first change in the partition (its barrier when it has none).

        One producer writes a partition's epoch in one transaction, so its changes sit right before its
        barrier. The offset after a barrier is its transaction's commit marker on Apache Kafka (and aborted
        attempts may follow), so the previous barrier's offset + 1 is *not* where an epoch starts, and
        retention may delete that marker with the epoch before while keeping this one whole: whether an
        epoch is retained is ``first_offset >= low watermark``.
        """
        return self.offset - self.records


class ChangeOrigin(NamedTuple):
    """Where a change event sits in the log, for readers that re-emit it in the log's row shape."""

    partition: int
    offset: int
    key: bytes  # the record key as written (Avro-encoded primary key)


@dataclass(slots=True)
class Epoch:
    """One complete epoch of a changelog: all its changes and its barrier on every partition."""

    view: str
    epoch: int
    prev_epoch: int
    changes: list[Change]
    barriers: dict[int, Barrier]  # partition -> barrier
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> offset of its barrier
    origins: list[ChangeOrigin] = field(default_factory=list)  # parallel to ``changes`` when the reader kept them
    dropped: int = 0  # changes counted but not kept (a reader over its memory budget): ``changes`` is partial

    @property
    def checkpoint(self) -> bool:
        return any(b.checkpoint for b in self.barriers.values())

    @property
    def mutation(self) -> Mutation | None:
        return next((b.mutation for b in self.barriers.values() if b.mutation is not None), None)

    @property
    def index(self) -> dict[int, IndexEntry]:
        return {p: IndexEntry(self.epoch, self.offsets[p], self.barriers[p].records) for p in self.offsets}
