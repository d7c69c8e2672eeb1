"""How large a change event a changelog can carry, and so how large a row may be: size arithmetic only.

Three limits apply to one record of a changelog, each counted its own way:

- mvlog's readers dead-letter a record whose key and value exceed ``max_record_bytes``;
- librdkafka's producer refuses (``MSG_SIZE_TOO_LARGE``) a record whose key, value and headers plus
  :data:`RECORD_OVERHEAD` exceed its ``message.max.bytes`` (default 1,000,000);
- the broker refuses a record batch above the topic's ``max.message.bytes`` (by default the broker's
  ``message.max.bytes``, 1,048,588), a batch being its records plus :data:`BATCH_OVERHEAD`.

The smallest of them, in readers' terms (key + value bytes), is a changelog's :class:`RecordLimit`. A
change event is a Debezium envelope (``mvlog.changes``): the row before and after the change, then the
op and its source. An update carries the row twice, and the before-image of a later update is not known
when a row is written, so a row is accepted only when two images of it fit (:func:`row_fits`): then every
change of every accepted row fits, whatever comes next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: librdkafka's widest framing of one record (RecordBatch v2: length, attributes, timestamp and offset
#: deltas, key and value lengths, header count as varints at their widest), which its produce-time check
#: adds to the key, value and headers (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD; measured: 36).
RECORD_OVERHEAD = 36
#: The header of a RecordBatch v2, counted in the topic's max.message.bytes.
BATCH_OVERHEAD = 61
#: librdkafka's default ``message.max.bytes``: the producer's limit unless it is configured.
PRODUCER_DEFAULT_MAX_BYTES = 1_000_000
#: The range librdkafka accepts for ``message.max.bytes``.
PRODUCER_MIN_BYTES, PRODUCER_MAX_BYTES = 1000, 1_000_000_000
#: Apache Kafka's default broker ``message.max.bytes`` (a topic's default max.message.bytes).
BROKER_DEFAULT_MAX_BYTES = 1_048_588


def varint_bytes(value: int) -> int:
    """Bytes of ``value`` as a zig-zag varint (Kafka record framing and Avro lengths both use them)."""
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def headers_bytes(headers: Sequence[tuple[str, bytes]]) -> int:
    """Bytes the record headers take in a Kafka record (each key and value with its varint length)."""
    return sum(varint_bytes(len(name.encode())) + len(name.encode()) + varint_bytes(len(value)) + len(value)
               for name, value in headers)


def producer_bytes_needed(record_bytes: int, header_bytes: int) -> int:
    """The producer ``message.max.bytes`` that lets a record of ``record_bytes`` (key + value) through."""
    return record_bytes + header_bytes + RECORD_OVERHEAD


def topic_bytes_needed(record_bytes: int, header_bytes: int) -> int:
    """The topic ``max.message.bytes`` that holds a record of ``record_bytes`` in a batch of its own."""
    return producer_bytes_needed(record_bytes, header_bytes) + BATCH_OVERHEAD


@dataclass(frozen=True)
class RecordLimit:
    """The largest change event (key + value bytes, as readers count them) a changelog takes, and why."""

    bytes: int
    reason: str  # which setting sets it, for refusals: "the topic's max.message.bytes (1048588)"


def effective_record_limit(max_record_bytes: int, topic_max_bytes: int, header_bytes: int,
                           producer_max_bytes: int | None = None) -> RecordLimit:
    """The smallest of the readers' limit, the topic's (``max.message.bytes``) and, when it is configured,
    the producer's (``message.max.bytes``), each turned into key + value bytes."""
    candidates = [RecordLimit(max_record_bytes, f"max_record_bytes ({max_record_bytes})"),
                  RecordLimit(topic_max_bytes - BATCH_OVERHEAD - RECORD_OVERHEAD - header_bytes,
                              f"the topic's max.message.bytes ({topic_max_bytes})")]
    if producer_max_bytes is not None:
        candidates.append(RecordLimit(producer_max_bytes - RECORD_OVERHEAD - header_bytes,
                                      f"the producer's message.max.bytes ({producer_max_bytes})"))
    smallest = min(candidates, key=lambda limit: limit.bytes)
    return RecordLimit(max(0, smallest.bytes), smallest.reason)


def producer_max_bytes_for(limit: RecordLimit, header_bytes: int) -> int:
    """The producer ``message.max.bytes`` of a writer of a changelog with ``limit``: the producer then
    refuses exactly what readers or the topic would, and its batches (which librdkafka caps at this size)
    stay within the topic's max.message.bytes."""
    return max(PRODUCER_MIN_BYTES, min(PRODUCER_MAX_BYTES, producer_bytes_needed(limit.bytes, header_bytes)))


def change_event_bytes(key_bytes: int, before_bytes: int | None, after_bytes: int | None,
                       envelope_bytes: int) -> int:
    """Key + value bytes of a change event: its images, and the envelope (union branches, op, source)."""
    return key_bytes + (before_bytes or 0) + (after_bytes or 0) + envelope_bytes


def row_fits(row_bytes: int, key_bytes: int, envelope_bytes: int, limit: RecordLimit) -> bool:
    """Whether any change of a row of ``row_bytes`` (encoded) fits: an update carries two images, the
    before-image being another accepted row, so no larger than this limit allows either."""
    return change_event_bytes(key_bytes, row_bytes, row_bytes, envelope_bytes) <= limit.bytes


def surely_fitting_text(limit: RecordLimit, envelope_bytes: int, fixed_row_bytes: int) -> int:
    """Characters of text and bytes up to which a row fits without being encoded to measure it.

    ``fixed_row_bytes`` bounds a row's encoding without its text (names, branches, numbers at their
    widest, lengths); a character takes at most 4 bytes in UTF-8; a key encodes a subset of the row's
    columns, so it is no larger than the row: a change then takes at most three rows and the envelope."""
    return max(0, ((limit.bytes - envelope_bytes) // 3 - fixed_row_bytes) // 4)


def too_large_message(key: object, row_bytes: int, event_bytes: int, limit: RecordLimit, topic: str) -> str:
    """Why a row is refused: its key, its encoded size, that of its largest change, and the limit."""
    return (f"row too large: key {key!r} encodes to {row_bytes} bytes; an update of it (before and after "
            f"images, key and envelope) would be a {event_bytes}-byte change event, above the {limit.bytes}-byte "
            f"limit of changelog {topic} set by {limit.reason}")
