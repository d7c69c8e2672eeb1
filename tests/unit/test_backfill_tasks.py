"""The task path's chunked backfill, its pure parts: which change rows the tasks keep, and what a chunk
commits (the same as the driver path's step for the same chunk)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.backfill import DONE, START, BackfillError, BackfillPositions, Chunk, Position, VnodeChunk, route_epoch
from mvlog.backfill_record import BACKFILL_MUTATION, journal_line, position_field, progress_payload
from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Mutation, Op
from mvlog.connectors.spark.change_rows import BARRIER, SignedRowBuilder
from mvlog.key_order import order_member
from mvlog.partition_epochs import PartitionBarrier
from mvlog.row_schema import RowSchema
from mvlog.schemas.codec import encode_key
from mvlog.services.backfill.task_chunks import CommittedAbove, CoveredRows, TaskChunk, committed_positions
from mvlog.vnode import VNODE_COUNT, vnode_of

SCHEMA = RowSchema.of({"id": "int", "v": "int"}, ["id"])
UPSTREAM = CatalogEntry("t1", "table", SCHEMA, 2)


def _member(key: int) -> tuple[int, bytes]:
    avro = encode_key(("id",), (key,))
    vnode = vnode_of(avro)
    return vnode, order_member(vnode, (key,), avro)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=120, unique=True), st.randoms())
def test_the_tasks_keep_the_change_rows_the_positions_cover_and_every_barrier(keys: list[int],
                                                                               rng: random.Random) -> None:
    positions = BackfillPositions(["t1"])
    for key in keys:  # per vnode: not started, done, or part way (at one of its keys)
        vnode, member = _member(key)
        positions.set("t1", vnode, rng.choice([START, DONE, Position(False, member)]))
    builder = SignedRowBuilder(SCHEMA, 0)
    for offset, key in enumerate(keys):
        avro = encode_key(("id",), (key,))
        builder.add_images(7, offset, avro, {"id": key, "v": 1} if offset % 3 else None, {"id": key, "v": 2})
    batch = builder.flush()
    barrier = pa.RecordBatch.from_pylist([{"_epoch": 7, "_change_type": BARRIER, "_weight": 0, "_partition": 0,
                                           "_offset": len(keys), "_key": b""}], schema=batch.schema)
    keep = CoveredRows(UPSTREAM, committed_positions([positions.get("t1", v) for v in range(VNODE_COUNT)]))
    kept = pa.Table.from_batches(list(keep.run(iter([batch, barrier]))))
    expected = [(row["_offset"], row["_weight"]) for row in batch.to_pylist()
                if positions.covers("t1", *_member(row["id"]))]
    rows = kept.to_pylist()
    assert [(r["_offset"], r["_weight"]) for r in rows if r["_change_type"] != BARRIER] == expected
    assert sum(r["_change_type"] == BARRIER for r in rows) == 1


def test_a_chunk_commits_what_the_driver_path_commits_for_it() -> None:
    positions = BackfillPositions(["t1"])
    keys = sorted(range(40), key=lambda k: _member(k)[1])
    by_vnode: dict[int, list[bytes]] = {}
    for key in keys:
        vnode, member = _member(key)
        by_vnode.setdefault(vnode, []).append(member)
    vnodes = sorted(by_vnode)[:3]
    parts = (VnodeChunk(vnodes[0], START, DONE, tuple((m, {"id": 0, "v": 0}) for m in by_vnode[vnodes[0]])),
             VnodeChunk(vnodes[1], START, Position(False, by_vnode[vnodes[1]][0]),
                        ((by_vnode[vnodes[1]][0], {"id": 0, "v": 0}),)))
    chunk = Chunk("t1", 9, parts)
    driver = route_epoch(positions, 9, {"t1": []}, [chunk])
    task = TaskChunk("v", "t1", 9, chunk.row_count, TaskChunk.moves_of([(p.vnode, p.start, p.end) for p in parts]),
                     chunk.row_count, 5, False, True)
    assert TaskChunk.from_json(task.to_json()) == task
    fields = task.fields()
    assert {k: v for k, v in fields.items() if k.startswith("pos:")} == {
        position_field("t1", v): p.encode() for (_, v), p in driver.moved.items()}
    assert fields["rows_done"] == driver.inserted and fields["start_epoch"] == 5 and "done" not in fields
    assert task.journal() == [journal_line(9, "t1", p.vnode, p.start, p.end) for p in parts]
    assert task.lifecycle() == "backfilling" and task.ends() == {p.vnode: p.end for p in parts}
    assert [c.op for c in driver.changes["t1"]] == [Op.READ] * chunk.row_count
    assert isinstance(driver.changes["t1"][0], Change)


def _barrier(epoch: int, prev: int, moved: dict[int, bytes] | None = None) -> PartitionBarrier:
    fields: dict[str, bytes | int] = {position_field("t1", v): end for v, end in (moved or {}).items()}
    fields.update(rows_done=7, start_epoch=1)
    return PartitionBarrier(epoch, prev, epoch * 10, 1, Mutation(BACKFILL_MUTATION, "mv1", progress_payload(fields)))


def test_the_partitions_barriers_above_the_mce_name_the_chunk_to_make_again_or_the_epoch_to_read_after() -> None:
    """After a Redis wipe lost the saved chunk: the epoch a partition committed with a chunk (its barrier
    moved positions) is made again with those positions; epochs committed without one only push the next
    chunk past them; epochs at or below the MCE are the view's history."""
    assert CommittedAbove.of("mv1", 5, []) == CommittedAbove(5)
    assert CommittedAbove.of("mv1", 5, [_barrier(4, 3, {1: b"\x01a"}), _barrier(5, 4)]) == CommittedAbove(5)
    without = CommittedAbove.of("mv1", 5, [_barrier(6, 5), _barrier(7, 6), _barrier(6, 5)])
    assert without == CommittedAbove(7)
    found = CommittedAbove.of("mv1", 5, [_barrier(6, 5), _barrier(8, 6, {3: b"\x03z", 4: b""}), _barrier(6, 5)])
    assert (found.last, found.chunk_epoch) == (8, 8)
    assert found.payload is not None and found.payload["positions"] == {"t1": {"3": b"\x03z".hex(), "4": "done"}}
    with pytest.raises(BackfillError, match="each emitted a chunk"):
        CommittedAbove.of("mv1", 5, [_barrier(6, 5, {1: b"\x01a"}), _barrier(8, 6, {3: b"\x03z"})])
