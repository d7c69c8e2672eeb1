"""Pure parts of the changelog protocol: vnodes, epochs, row validation, codec, barrier alignment."""

from __future__ import annotations

import contextlib

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from mvlog.barrier_alignment import AlignmentError, EpochAligner
from mvlog.changes import Barrier, Change, Mutation, Op, apply_changes, change_between
from mvlog.connectors.kafka.changelog_writer import WriterFencedError, fenced_error
from mvlog.epoch import EpochClock, epoch_from_millis, epoch_millis
from mvlog.row_schema import RowSchema
from mvlog.schemas.codec import (
    DecodeError,
    decode_barrier,
    decode_change,
    decode_key,
    encode_barrier,
    encode_change,
    encode_key,
)
from mvlog.vnode import VNODE_COUNT, partition_of_vnode, vnode_of, vnode_range

SCHEMA = RowSchema.of({"id": "int", "v1": "int", "name": "string", "deleted": "boolean", "x": "float"}, ["id"])


@given(st.integers(1, 64))
def test_vnode_ranges_are_contiguous_and_cover_all_vnodes(partitions: int) -> None:
    owned = [v for p in range(partitions) for v in vnode_range(p, partitions)]
    assert owned == list(range(VNODE_COUNT))
    for p in range(partitions):
        assert all(partition_of_vnode(v, partitions) == p for v in vnode_range(p, partitions))


def test_vnode_is_stable_across_processes() -> None:
    # crc32 of the Avro-encoded key {"id": 1}: a fixed value, unlike Python's randomized hash().
    assert vnode_of(encode_key(("id",), (1,))) == vnode_of(encode_key(("id",), (1,)))
    assert vnode_of(b"abc") == 0x352441C2 % 256


def test_epoch_clock_is_strictly_increasing_even_when_the_clock_steps_back() -> None:
    times = iter([1000, 1000, 999, 2000])
    clock = EpochClock(last_epoch=epoch_from_millis(1000, 5), now_ms=lambda: next(times))
    epochs = [clock.next() for _ in range(4)]
    assert epochs == sorted(set(epochs))
    assert epochs[0] == epoch_from_millis(1000, 6)
    assert epoch_millis(epochs[-1]) == 2000


def test_row_validation_names_row_field_and_problem() -> None:
    errors = SCHEMA.validate({"id": None, "v1": "7", "deleted": 1, "bogus": 2}, index=3)
    text = [str(e) for e in errors]
    assert "row 3: field 'bogus': unknown column" in text
    assert "row 3: field 'id': primary key column is missing or null" in text
    assert "row 3: field 'v1': expected int, got str '7'" in text
    assert "row 3: field 'deleted': expected boolean, got int 1" in text
    assert SCHEMA.validate({"id": 1, "v1": 2, "x": 3}) == []
    assert SCHEMA.normalize({"id": 1, "x": 3}) == {"id": 1, "v1": None, "name": None, "deleted": None, "x": 3.0}


values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                   st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20))
rows = st.dictionaries(st.text(min_size=1, max_size=8), values, max_size=6)


@given(st.sampled_from(list(Op)), rows, rows, st.integers(0, 2**62), st.integers(0, 255),
       st.integers(-(2**63), 2**63 - 1), st.booleans())
def test_change_roundtrip(op: Op, before: dict, after: dict, epoch: int, vnode: int, key_id: int,
                          images_hold_the_key: bool) -> None:
    """The key comes from the row image when it holds the key columns, else from the Kafka key."""
    for image in (before, after):
        image.pop("id", None)
        if images_hold_the_key:
            image["id"] = key_id
    change = Change(op, (key_id,), before if op in (Op.UPDATE, Op.DELETE) else None,
                    after if op != Op.DELETE else None)
    kafka_key = encode_key(("id",), (key_id,))
    decoded, source = decode_change(("id",), kafka_key, encode_change("v", epoch, vnode, change, 0))
    assert decoded == change
    assert source == {"view": "v", "epoch": epoch, "vnode": vnode, "txn": ""}


def test_barrier_and_key_roundtrip() -> None:
    barrier = Barrier("v", 10, 9, True, 2, 17, 123, Mutation("apply_replacement", "v", {"sql": "SELECT 1"}))
    assert decode_barrier(encode_barrier(barrier)) == barrier
    assert decode_key(("a", "b"), encode_key(("a", "b"), (1, "x"))) == (1, "x")


@given(st.binary(max_size=64))
def test_decoders_refuse_garbage_with_decode_error(data: bytes) -> None:
    for decode in (lambda: decode_change(("id",), data, data), lambda: decode_barrier(data)):
        with contextlib.suppress(DecodeError):
            decode()


def test_change_between_and_apply() -> None:
    assert change_between((1,), None, None) is None
    assert change_between((1,), {"a": 1}, {"a": 1}) is None
    assert change_between((1,), None, {"a": 1}).op is Op.CREATE  # type: ignore[union-attr]
    assert change_between((1,), {"a": 1}, None).op is Op.DELETE  # type: ignore[union-attr]
    rows = apply_changes({}, [Change(Op.CREATE, (1,), None, {"a": 1}), Change(Op.READ, (2,), None, {"a": 2}),
                              Change(Op.DELETE, (1,), {"a": 1}, None)])
    assert rows == {(2,): {"a": 2}}


def _barrier(epoch: int, prev: int, partition: int, records: int) -> Barrier:
    return Barrier("v", epoch, prev, True, partition, records, 0, None)


def test_aligner_commits_an_epoch_once_complete_and_confirmed() -> None:
    aligner = EpochAligner("v", range(2))
    c1 = Change(Op.CREATE, (1,), None, {"id": 1})
    c2 = Change(Op.CREATE, (2,), None, {"id": 2})
    aligner.add_change(0, 10, c1)
    assert aligner.add_barrier(0, _barrier(10, 0, 0, 1), offset=1) == []
    assert aligner.partitions_to_pause() == {0}  # partition 0 is a whole epoch ahead
    aligner.add_change(1, 10, c2)
    assert aligner.add_barrier(1, _barrier(10, 0, 1, 1), offset=1) == []  # complete, not yet confirmed
    assert aligner.held_epoch == 10
    assert aligner.partitions_to_pause() == set()
    aligner.add_barrier(0, _barrier(11, 10, 0, 0), offset=2)
    (epoch,) = aligner.add_barrier(1, _barrier(11, 10, 1, 0), offset=2)  # 11 names 10: 10 committed
    assert (epoch.epoch, epoch.changes, epoch.offsets) == (10, [c1, c2], {0: 1, 1: 1})
    assert aligner.confirm(11, {0: 99}) == []  # another attempt's barrier
    (eleven,) = aligner.confirm(11, {0: 2, 1: 2})  # e.g. found in the epoch index
    assert eleven.epoch == 11 and aligner.last_epoch == 11


def test_aligner_drops_an_abandoned_epoch_and_its_stray_records() -> None:
    """Records of an aborted transaction, as Tansu delivers them, never reach a committed epoch."""
    aligner = EpochAligner("v", range(2))
    good = Change(Op.CREATE, (1,), None, {"id": 1})
    aborted = Change(Op.CREATE, (2,), None, {"id": 2})
    for p in range(2):
        aligner.add_barrier(p, _barrier(10, 0, p, 0), offset=0)
    aligner.add_change(0, 11, aborted)  # epoch 11: the writer died; its barrier reached partition 0 only
    aligner.add_barrier(0, _barrier(11, 10, 0, 1), offset=2)
    aligner.add_change(1, 11, aborted)
    aligner.add_change(1, 12, good)  # the restarted writer's epoch 12 names 10, not 11
    committed = aligner.add_barrier(1, _barrier(12, 10, 1, 1), offset=3)
    committed += aligner.add_barrier(0, _barrier(12, 10, 0, 0), offset=4)
    committed += aligner.confirm(12, {0: 4})
    assert [e.epoch for e in committed] == [10, 12]
    assert committed[1].changes == [good]
    assert aligner.abandoned == [11]


def test_aligner_keeps_a_redone_epoch_apart_from_its_aborted_attempt() -> None:
    aligner = EpochAligner("v", [0])
    aligner.add_barrier(0, _barrier(10, 0, 0, 0), offset=0)
    aligner.add_change(0, 11, Change(Op.CREATE, (1,), None, {"v": "aborted"}), txn="a")
    redone = Change(Op.CREATE, (1,), None, {"v": "redone"})
    aligner.add_change(0, 11, redone, txn="b")
    barrier = Barrier("v", 11, 10, True, 0, 1, 0, None, txn="b")
    committed = aligner.add_barrier(0, barrier, offset=3) + aligner.confirm(11, {0: 3})
    assert [e.epoch for e in committed] == [10, 11]
    assert committed[1].changes == [redone]


def test_aligner_skips_epochs_before_the_start_and_checks_record_counts() -> None:
    aligner = EpochAligner("v", [0], after_epoch=10)
    aligner.add_change(0, 10, Change(Op.CREATE, (1,), None, {"id": 1}))
    assert aligner.add_barrier(0, _barrier(10, 5, 0, 7), offset=3) == []  # before the start: not checked
    with pytest.raises(AlignmentError, match="announces 2 change"):
        aligner.add_barrier(0, _barrier(11, 10, 0, 2), offset=4)


def test_a_fatal_producer_error_ends_the_writer_as_fenced_and_a_retriable_one_does_not() -> None:
    """A produce() after librdkafka learnt of the fencing raises ``_FATAL``, not the fencing: the writer
    ends the same way either way (CI, session 32: a fenced table writer's next epoch said "aborted")."""
    for code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError._FATAL):
        fenced = fenced_error("t1", "p.t1.writer", KafkaError(code))
        assert isinstance(fenced, WriterFencedError) and "fenced" in str(fenced) and "p.t1.writer" in str(fenced)
    assert isinstance(fenced_error("t1", None, KafkaError(KafkaError._STATE, fatal=True)), WriterFencedError)
    assert fenced_error("t1", "p.t1.writer", KafkaError(KafkaError._MSG_TIMED_OUT)) is None
