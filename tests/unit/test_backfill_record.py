"""A chunked backfill's progress on the view's barriers: folding the payloads gives back, at every epoch,
exactly the positions, counters and journal that were committed to Redis (what a rebuild restores)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.backfill import DONE, BackfillPositions, Chunk, Position, VnodeChunk
from mvlog.backfill_record import (
    BACKFILL_MUTATION,
    BackfillReplay,
    journal_line,
    load_positions,
    position_field,
    progress_payload,
)
from mvlog.changes import Barrier, Mutation
from mvlog.key_order import order_member
from mvlog.schemas.codec import decode_barrier, encode_barrier, encode_key

SOURCES = ["a", "b"]


def member(key: int, vnode: int) -> bytes:
    return order_member(vnode, (key,), encode_key(("id",), (key,)))


def committed_steps(seed: int, epochs: int) -> list[tuple[int, dict[str, bytes | str | int], list[str]]]:
    """A backfill as ``BackfillStep`` commits it: per epoch, the moved positions, counters and journal."""
    rng = random.Random(seed)
    positions = BackfillPositions(SOURCES)
    next_key = {(s, v): 0 for s in SOURCES for v in range(4)}
    rows_done = 0
    steps = []
    for epoch in range(100, 100 + epochs):
        fields: dict[str, bytes | str | int] = {}
        journal: list[str] = []
        for source in SOURCES:
            if rng.random() < 0.4:
                continue  # no chunk of this upstream in this epoch
            parts = []
            for vnode, start in positions.unfinished(source)[:rng.randrange(1, 3)]:
                if vnode >= 4 or rng.random() < 0.3:
                    end = DONE
                    rows: tuple[tuple[bytes, dict[str, int]], ...] = ()
                else:
                    count = rng.randrange(1, 4)
                    first = next_key[(source, vnode)]
                    next_key[(source, vnode)] = first + count
                    rows = tuple((member(k, vnode), {"id": k}) for k in range(first, first + count))
                    end = Position(False, rows[-1][0])
                parts.append(VnodeChunk(vnode, start, end, rows))
                rows_done += len(rows)
            chunk = Chunk(source, epoch, tuple(parts))
            for part in chunk.vnodes:
                journal.append(journal_line(epoch, source, part.vnode, part.start, part.end))
            for (name, vnode), moved in positions.advance(chunk).items():
                fields[position_field(name, vnode)] = moved.encode()
        fields["rows_done"] = rows_done
        fields["start_epoch"] = 99
        if positions.done:
            fields["done"] = 1
        steps.append((epoch, fields, journal))
        if positions.done:
            break
    return steps


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 200))
def test_folding_the_payloads_gives_back_what_each_epoch_committed(seed: int, epochs: int) -> None:
    replay = BackfillReplay(SOURCES)
    stored: dict[bytes, bytes] = {}
    for epoch, fields, journal in committed_steps(seed, epochs):
        mutation = Mutation(BACKFILL_MUTATION, "v", progress_payload(fields))
        barrier = Barrier("v", epoch, epoch - 1, True, 0, 0, 0, mutation)
        decoded = decode_barrier(encode_barrier(barrier)).mutation  # as it travels on the barrier
        assert decoded is not None
        payload = decoded.payload
        restored, restored_journal = replay.apply(epoch, payload)
        assert restored == fields
        assert restored_journal == journal
        stored.update({k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()})
        assert dict(load_positions(stored, SOURCES).items()) == dict(replay.positions.items())
        assert replay.done == ("done" in fields)


def test_a_payload_names_only_what_moved() -> None:
    fields: dict[str, bytes | str | int] = {position_field("mv1", 7): member(3, 7), position_field("t2", 255): b"",
                                            "rows_done": 12, "start_epoch": 5}
    payload = progress_payload(fields)
    assert payload == {"positions": {"mv1": {"7": member(3, 7).hex()}, "t2": {"255": "done"}}, "rows_done": 12,
                       "start_epoch": 5, "done": False}
    replay = BackfillReplay(["mv1", "t2"])
    replay.apply(9, payload)
    assert replay.positions.get("t2", 255) == DONE and replay.positions.get("mv1", 7).last == member(3, 7)
    assert not replay.done
