"""Decoding one Kafka record of a view's changelog, or saying exactly why it cannot be used.

Every reader of changelogs (the changelog reader, the Spark data source's executors) goes through
:func:`decode_record`, so a malformed or foreign record is classified the same way everywhere: a
:class:`PoisonRecord` whose ``reason`` names the topic, partition and offset and the problem. Nothing
here raises on bad bytes; the caller dead-letters poison and carries on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mvlog.changes import Barrier, Change
from mvlog.row_schema import Row
from mvlog.schemas.codec import (
    HEADER_TYPE,
    TYPE_BARRIER,
    TYPE_CHANGE,
    DecodeError,
    decode_barrier,
    decode_change,
    native_module,
    record_type,
)


@dataclass(frozen=True)
class ChangeRecord:
    change: Change
    epoch: int
    txn: str


@dataclass(frozen=True)
class BarrierRecord:
    barrier: Barrier


@dataclass(frozen=True)
class PoisonRecord:
    """A record no reader can use. ``announced_change``: its header says it is a change event, so the
    barrier of its epoch may count it (the reader then accepts that barrier one change short)."""

    topic: str
    partition: int
    offset: int
    problem: str
    announced_change: bool = False

    @property
    def reason(self) -> str:
        return f"{self.topic} partition {self.partition} offset {self.offset}: {self.problem}"


DecodedRecord = ChangeRecord | BarrierRecord | PoisonRecord


def decode_record(view: str, key_columns: tuple[str, ...], topic: str, partition: int, offset: int,
                  key: bytes | None, value: bytes | None, headers: Any, max_bytes: int) -> DecodedRecord:
    """Classify one record of ``view``'s changelog; never raises on bad input."""
    def poison(problem: str, announced: bool = False) -> PoisonRecord:
        return PoisonRecord(topic, partition, offset, problem, announced)

    try:
        kind = record_type(headers)
    except (TypeError, ValueError) as exc:
        return poison(f"unreadable headers ({exc})")
    size = len(value or b"") + len(key or b"")
    if size > max_bytes:
        return poison(f"record too large: {size} bytes, the limit (max_record_bytes) is {max_bytes}",
                      kind == TYPE_CHANGE)
    if kind == TYPE_CHANGE:
        if key is None:
            return poison("change event without a key (the key is the view's primary key)", True)
        if value is None:
            return poison("change event without a value", True)
        try:
            change, source = decode_change(key_columns, key, value)
        except DecodeError as exc:
            return poison(f"not a change event of the expected schema: {exc}", True)
        if source.get("view") != view:
            return poison(f"a change event of view {source.get('view')!r}, not of {view!r} (wrong topic or schema)",
                          True)
        return ChangeRecord(change, source["epoch"], source["txn"])
    if kind == TYPE_BARRIER:
        if value is None:
            return poison("barrier without a value")
        try:
            barrier = decode_barrier(value)
        except DecodeError as exc:
            return poison(f"not a barrier of the expected schema: {exc}")
        if barrier.view != view or barrier.partition != partition:
            return poison(f"a barrier of view {barrier.view!r} partition {barrier.partition}, not of {view!r} "
                          f"partition {partition} (wrong topic or schema)")
        return BarrierRecord(barrier)
    shown = "absent" if kind is None else repr(kind)
    return poison(f"not an mvlog changelog record (header mvlog.type is {shown})")


_native = native_module()
_CHANGE_HEADERS = [(HEADER_TYPE, TYPE_CHANGE)]


def decode_change_run(view: str, key_columns: tuple[str, ...], messages: list[Any], start: int, max_bytes: int
                      ) -> tuple[int | None, str | None, list[tuple[int, bytes, Row | None, Row | None]], int]:
    """The run of well-formed change events of one (epoch, txn) at ``messages[start:]``, in one compiled call.

    Returns ``(epoch, txn, [(offset, key, before, after), ...], end)`` for ``messages[start:end]``. The
    run stops before the first record that is not such an event of ``view`` (a barrier, an error, poison,
    another epoch or transaction, a change whose key is not its row image's): readers hand that one to
    :func:`decode_record`, which classifies it and names any problem. Without the compiled codec every
    run is empty.
    """
    if _native is None:
        return None, None, [], start
    run: tuple[int | None, str | None, list[tuple[int, bytes, Row | None, Row | None]], int] = \
        _native.decode_change_run(messages, start, key_columns, view, max_bytes, _CHANGE_HEADERS)
    return run
