"""The size arithmetic of a changelog's record limit (mvlog.record_limits): pure, no broker."""

from __future__ import annotations

from mvlog.record_limits import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    RecordLimit,
    change_event_bytes,
    effective_record_limit,
    headers_bytes,
    producer_bytes_needed,
    producer_max_bytes_for,
    row_fits,
    surely_fitting_text,
    too_large_message,
    topic_bytes_needed,
    varint_bytes,
)

MIB = 1024 * 1024


def test_varints_and_headers() -> None:
    assert [varint_bytes(n) for n in (0, 63, 64, 8191, 8192, 2**63 - 1)] == [1, 1, 2, 2, 3, 10]
    # mvlog's change header: "mvlog.type" (10 bytes) and "change" (6), each after a one-byte length.
    assert headers_bytes([("mvlog.type", b"change")]) == 18
    assert headers_bytes([]) == 0


def test_what_the_producer_and_the_topic_need_for_a_record() -> None:
    assert producer_bytes_needed(8 * MIB, 18) == 8 * MIB + 18 + RECORD_OVERHEAD
    assert topic_bytes_needed(8 * MIB, 18) == 8 * MIB + 18 + RECORD_OVERHEAD + BATCH_OVERHEAD


def test_the_smallest_limit_wins_and_is_named() -> None:
    # A topic set to what mvlog needs: the readers' max_record_bytes is the limit.
    limit = effective_record_limit(8 * MIB, topic_bytes_needed(8 * MIB, 18), 18)
    assert limit == RecordLimit(8 * MIB, f"max_record_bytes ({8 * MIB})")
    # A topic left at the broker's default (1,048,588): its framing is taken off.
    limit = effective_record_limit(8 * MIB, 1_048_588, 18)
    assert limit.bytes == 1_048_588 - BATCH_OVERHEAD - RECORD_OVERHEAD - 18
    assert "the topic's max.message.bytes (1048588)" in limit.reason
    # A producer limit configured smaller (librdkafka's default 1,000,000) is the limit then.
    limit = effective_record_limit(8 * MIB, 20 * MIB, 18, producer_max_bytes=1_000_000)
    assert limit == RecordLimit(1_000_000 - RECORD_OVERHEAD - 18, "the producer's message.max.bytes (1000000)")
    assert effective_record_limit(8 * MIB, 50, 18).bytes == 0  # never negative


def test_the_writer_producer_refuses_exactly_above_the_limit() -> None:
    limit = RecordLimit(8 * MIB, "x")
    assert producer_max_bytes_for(limit, 18) == 8 * MIB + 18 + RECORD_OVERHEAD
    # Round trip: that producer setting, configured, gives the same limit back.
    assert effective_record_limit(9 * MIB, 20 * MIB, 18, producer_max_bytes_for(limit, 18)).bytes == limit.bytes
    # librdkafka's range is kept.
    assert producer_max_bytes_for(RecordLimit(10, "x"), 18) == 1000
    assert producer_max_bytes_for(RecordLimit(2_000_000_000, "x"), 18) == 1_000_000_000


def test_an_update_carries_two_images() -> None:
    assert change_event_bytes(5, None, 100, 60) == 165  # a create
    assert change_event_bytes(5, 100, None, 60) == 165  # a delete
    assert change_event_bytes(5, 100, 120, 60) == 285  # an update: both images
    limit = RecordLimit(1000, "x")
    # A row fits when an update of it by a row as large fits: 2 * 470 + 5 + 55 == 1000.
    assert row_fits(470, 5, 55, limit)
    assert not row_fits(471, 5, 55, limit)


def test_rows_surely_fitting_are_not_measured() -> None:
    limit = RecordLimit(1_000_000, "x")
    chars = surely_fitting_text(limit, 60, 40)
    # The worst case of that many characters (4 UTF-8 bytes each, plus the fixed part; a key no larger
    # than its row) still fits; one more character may not.
    worst_row = 40 + 4 * chars
    assert row_fits(worst_row, worst_row, 60, limit)
    worst_more = 40 + 4 * (chars + 1)
    assert change_event_bytes(worst_more, worst_more, worst_more, 60) > limit.bytes
    assert surely_fitting_text(RecordLimit(10, "x"), 60, 40) == 0


def test_the_refusal_names_key_sizes_and_limit() -> None:
    message = too_large_message((7,), 1_048_700, 2_097_500, RecordLimit(999_946, "the producer's message.max.bytes "
                                                                                "(1000000)"), "p.t1.changelog")
    for part in ("key (7,)", "1048700 bytes", "2097500-byte change event", "999946-byte limit", "p.t1.changelog",
                 "message.max.bytes (1000000)", "before and after"):
        assert part in message, part
