"""Bad input at the decoders: every poison record is classified with topic, partition, offset and the
problem, and no byte string makes a decoder raise anything but DecodeError (hypothesis fuzzing)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvlog.changes import Barrier, Change, Mutation, Op
from mvlog.connectors.kafka.changelog_records import BarrierRecord, ChangeRecord, PoisonRecord, decode_record
from mvlog.schemas import load_schema
from mvlog.schemas.codec import (
    HEADER_TYPE,
    TYPE_BARRIER,
    TYPE_CHANGE,
    DecodeError,
    decode_barrier,
    decode_catalog_entry,
    decode_change,
    decode_key,
    decode_row,
    encode_barrier,
    encode_change,
    encode_key,
)

KEY = ("id",)
TOPIC = "p.v.changelog"
CHANGE_HEADERS = [(HEADER_TYPE, TYPE_CHANGE)]
BARRIER_HEADERS = [(HEADER_TYPE, TYPE_BARRIER)]
GOOD_KEY = encode_key(KEY, (7,))
GOOD_CHANGE = encode_change("v", 1 << 40, 3, Change(Op.UPDATE, (7,), {"id": 7, "x": "a"}, {"id": 7, "x": "b"}), 5, "t")
GOOD_BARRIER = encode_barrier(Barrier("v", 1 << 40, 1 << 39, True, 2, 4, 5, Mutation("pause", "v", {"a": 1}), "t"))


def classify(key: bytes | None, value: bytes | None, headers: Any, partition: int = 2,
             max_bytes: int = 1 << 20) -> Any:
    return decode_record("v", KEY, TOPIC, partition, 41, key, value, headers, max_bytes)


def test_good_records_decode() -> None:
    change = classify(GOOD_KEY, GOOD_CHANGE, CHANGE_HEADERS)
    assert isinstance(change, ChangeRecord) and change.change.after == {"id": 7, "x": "b"} and change.txn == "t"
    barrier = classify(None, GOOD_BARRIER, BARRIER_HEADERS)
    assert isinstance(barrier, BarrierRecord) and barrier.barrier.mutation == Mutation("pause", "v", {"a": 1})


def _wrong_schema_change() -> bytes:
    """A valid Avro record of another schema (a catalog entry) sent as a change event."""
    buffer = io.BytesIO()
    schemaless_writer(buffer, load_schema("barrier"), {
        "view": "v", "epoch": 1, "prev_epoch": 0, "checkpoint": True, "partition": 2, "records": 0, "ts_ms": 0,
        "mutation": None, "txn": ""})
    return buffer.getvalue()


@pytest.mark.parametrize(("key", "value", "headers", "problem", "announced"), [
    (GOOD_KEY, b"\xff\x00garbage", CHANGE_HEADERS, "not a change event of the expected schema", True),
    (GOOD_KEY, _wrong_schema_change(), CHANGE_HEADERS, "not a change event of the expected schema", True),
    (GOOD_KEY, GOOD_CHANGE + b"\x00" * 2000, CHANGE_HEADERS, "record too large", True),
    (None, GOOD_CHANGE, CHANGE_HEADERS, "change event without a key", True),
    (encode_key(("other",), (7,)), GOOD_CHANGE, CHANGE_HEADERS, "key lacks column 'id'", True),
    (GOOD_KEY, encode_change("w", 1, 0, Change(Op.CREATE, (7,), None, {"id": 7}), 5, "t"), CHANGE_HEADERS,
     "a change event of view 'w'", True),
    (None, b"\x01\x02", BARRIER_HEADERS, "not a barrier of the expected schema", False),
    (None, GOOD_BARRIER, [(HEADER_TYPE, TYPE_BARRIER)], "partition 2, not of 'v' partition 0", False),
    (b"k", b"plain text", None, "not an mvlog changelog record (header mvlog.type is absent)", False),
    (b"k", b"{}", [("content-type", b"json"), (HEADER_TYPE, b"snapshot")], "header mvlog.type is b'snapshot'", False),
])
def test_each_bad_record_is_poison_naming_where_and_why(key: bytes | None, value: bytes, headers: Any, problem: str,
                                                        announced: bool) -> None:
    partition = 0 if "partition 2, not of" in problem else 2
    record = classify(key, value, headers, partition=partition, max_bytes=1024)
    assert isinstance(record, PoisonRecord), record
    assert record.reason.startswith(f"{TOPIC} partition {partition} offset 41: "), record.reason
    assert problem in record.reason
    assert record.announced_change is announced


def test_a_barrier_whose_mutation_payload_is_not_json_is_poison() -> None:
    buffer = io.BytesIO()
    schemaless_writer(buffer, load_schema("barrier"), {
        "view": "v", "epoch": 1, "prev_epoch": 0, "checkpoint": True, "partition": 2, "records": 0, "ts_ms": 0,
        "mutation": {"kind": "pause", "target": "v", "payload": "{not json"}, "txn": ""})
    record = classify(None, buffer.getvalue(), BARRIER_HEADERS)
    assert isinstance(record, PoisonRecord) and "mutation payload is not JSON" in record.reason


DECODERS: list[Callable[[bytes], Any]] = [
    lambda data: decode_change(KEY, data, data), lambda data: decode_key(KEY, data), decode_row, decode_barrier,
    decode_catalog_entry]


def _only_decode_errors(data: bytes) -> None:
    for decoder in DECODERS:
        with contextlib.suppress(DecodeError):  # anything else fails the test
            decoder(data)


@settings(max_examples=400, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_raise_decode_error(data: bytes) -> None:
    _only_decode_errors(data)


@settings(max_examples=400, deadline=1000)
@given(st.sampled_from([GOOD_CHANGE, GOOD_BARRIER, GOOD_KEY]), st.data())
def test_fuzz_mutated_records_only_raise_decode_error(good: bytes, data: st.DataObject) -> None:
    """Valid encodings with bytes flipped, cut or appended: the likeliest corruption on the wire."""
    mutated = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(mutated) - 1))
        mutated[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    tail = data.draw(st.binary(max_size=8))
    _only_decode_errors(bytes(mutated[:cut]) + tail)


@settings(max_examples=300, deadline=1000)
@given(key=st.one_of(st.none(), st.binary(max_size=40)), value=st.one_of(st.none(), st.binary(max_size=200)),
       kind=st.sampled_from([None, TYPE_CHANGE, TYPE_BARRIER, b"x"]))
def test_fuzz_decode_record_never_raises(key: bytes | None, value: bytes | None, kind: bytes | None) -> None:
    headers = None if kind is None else [(HEADER_TYPE, kind)]
    record = classify(key, value, headers)
    assert isinstance(record, ChangeRecord | BarrierRecord | PoisonRecord)


def test_a_barrier_may_count_dead_lettered_changes_but_no_more() -> None:
    """A change event that could not be decoded went to the dead-letter topic: its barrier (which counts it)
    still completes the epoch, but a barrier more changes short than that is still an incomplete log."""
    from mvlog.barrier_alignment import AlignmentError, EpochAligner

    aligner = EpochAligner("v", [0])
    aligner.add_change(0, 5, Change(Op.CREATE, (1,), None, {"id": 1}), "t")
    aligner.add_poison(0)
    assert aligner.add_barrier(0, Barrier("v", 5, 0, True, 0, 2, 0, None, "t"), 10) == []
    assert aligner.held_epoch == 5
    aligner.add_poison(0)
    with pytest.raises(AlignmentError, match="1 undecodable change"):
        aligner.add_barrier(0, Barrier("v", 6, 5, True, 0, 2, 0, None, "t"), 11)
