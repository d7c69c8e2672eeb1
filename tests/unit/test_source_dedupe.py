"""Debezium redelivery applied once (issue 18): the per-key last-applied position rule, pure.

The property test replays what a restarted Kafka Connect worker does: the stream of changes, then from a
point back in it (its last flushed offset) the same changes again, then new ones. Folding the stream
through :class:`PositionFilter` must give the table of the stream without the redelivered part, at every
prefix (every epoch boundary), however the keys' changes interleave.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.row_schema import Key
from mvlog.source_dedupe import PositionFilter, debezium_position

PG = {"connector": "postgresql", "snapshot": "false", "lsn": 100}


def test_position_is_the_lsn_of_streamed_postgres_changes_only() -> None:
    assert debezium_position("u", PG) == 100
    assert debezium_position("d", {**PG, "lsn": "123"}) == 123
    assert debezium_position("r", PG) is None  # snapshot reads
    assert debezium_position("c", {**PG, "snapshot": "last"}) is None
    assert debezium_position("c", {**PG, "snapshot": "incremental"}) is None
    assert debezium_position("c", {**PG, "connector": "mysql"}) is None  # no per-row order known: applied as is
    assert debezium_position("c", {**PG, "lsn": None}) is None
    assert debezium_position("c", None) is None


def test_a_redelivered_old_update_after_a_newer_one_is_skipped() -> None:
    seen = PositionFilter()
    assert seen.admit((1,), 10) and seen.admit((1,), 20)
    assert not seen.admit((1,), 10)  # would regress the row to its older image
    assert not seen.admit((1,), 20)  # the same change twice
    assert seen.admit((2,), 15)  # another key: its own order (LSNs are not monotone across rows)
    assert seen.admit((1,), 30) and seen.skipped == 2


def test_a_deleted_key_keeps_its_position_so_a_redelivered_insert_does_not_resurrect_it() -> None:
    seen = PositionFilter()
    assert seen.admit((7,), 5)  # insert
    assert seen.admit((7,), 9)  # delete
    assert not seen.admit((7,), 5)  # the insert again
    assert seen.last((7,)) == 9


def test_changes_without_a_position_are_always_applied() -> None:
    seen = PositionFilter()
    assert seen.admit((1,), None) and seen.admit((1,), None) and len(seen) == 0


def test_take_changed_is_what_an_epoch_persists_and_load_restores_it() -> None:
    seen = PositionFilter()
    seen.admit((1,), 10)
    seen.admit((2,), 11)
    assert seen.take_changed() == {(1,): 10, (2,): 11}
    seen.admit((1,), 12)
    assert seen.take_changed() == {(1,): 12}
    restarted = PositionFilter()  # a new ingester folds the epochs' records, in any order
    restarted.load([((1,), 12), ((2,), 11), ((1,), 10)])
    assert restarted.last((1,)) == 12 and not restarted.admit((1,), 10) and restarted.admit((1,), 13)


Change = tuple[int, int, Any]  # key, position, row (None: delete)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Change], int, int]:
    """A stream of changes of a few keys, each key's positions increasing (rows are locked by their
    writer), positions interleaving across keys; plus where the worker's flushed offset was and how much
    of the stream it had sent when it died."""
    count = draw(st.integers(1, 60))
    keys = draw(st.lists(st.integers(0, 5), min_size=count, max_size=count))
    gaps = draw(st.lists(st.integers(1, 50), min_size=count, max_size=count))
    last: dict[int, int] = {}
    stream: list[Change] = []
    base = 1000
    for key, gap in zip(keys, gaps, strict=True):
        # Across keys a later change may sit lower in the WAL; per key it is always above the last one.
        position = max(last.get(key, 0) + 1, base + gap - 40)
        base += gap
        last[key] = position
        stream.append((key, position, draw(st.one_of(st.none(), st.integers(0, 9)))))
    died = draw(st.integers(0, len(stream)))
    flushed = draw(st.integers(0, died))
    return stream, flushed, died


def fold(changes: list[Change]) -> dict[Key, Any]:
    rows: dict[Key, Any] = {}
    for key, _, row in changes:
        if row is None:
            rows.pop((key,), None)
        else:
            rows[(key,)] = row
    return rows


@settings(max_examples=300, deadline=None)
@given(streams())
def test_redelivery_after_a_worker_restart_is_applied_once(case: tuple[list[Change], int, int]) -> None:
    stream, flushed, died = case
    delivered = stream[:died] + stream[flushed:]  # the restarted worker resends from its flushed offset
    seen = PositionFilter()
    rows: dict[Key, Any] = {}
    for i, (key, position, row) in enumerate(delivered):
        if seen.admit((key,), position):
            if row is None:
                rows.pop((key,), None)
            else:
                rows[(key,)] = row
        # The table after each delivered message equals the stream's prefix that it amounts to.
        original = i + 1 if i < died else died + max(0, i + 1 - died - (died - flushed))
        assert rows == fold(stream[:max(original, 0)]), (i, delivered)
    assert rows == fold(stream) and seen.skipped == died - flushed
