"""Rows held column-wise in Arrow encoded as ``value.avsc`` bytes, vectorised with ``pyarrow.compute``.

The Spark consumer computes a whole epoch of view rows in Arrow; encoding them one Python dict at a
time (:func:`mvlog.schemas.codec.encode_row`) cost more than computing them. This module builds the
same bytes column by column: per column, each row's map entry (the column's label, the union branch,
the value), then the entries of every column joined row-wise between the map's block count and its
terminator. ``encode_row({c: row[c] for c in columns})`` and ``encode_key`` give exactly these bytes
(checked by the unit tests); ints are Avro longs (zig-zag varints), floats doubles (little-endian),
NULLs the union's ``null`` branch.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

_NULL, _TRUE, _FALSE = b"\x00", b"\x02\x01", b"\x02\x00"
_LONG, _DOUBLE, _STRING, _BYTES = b"\x04", b"\x06", b"\x08", b"\x0a"
_SINGLE_BYTES = pa.array([bytes((i,)) for i in range(256)], pa.binary())  # byte value -> that one byte
_EMPTY = pa.scalar(b"", pa.binary())
_U7, _U0, _LOW7, _CONTINUE = (pa.scalar(n, pa.uint64()) for n in (7, 0, 0x7F, 0x80))


class UnsupportedColumnError(TypeError):
    """A column whose Arrow type has no ``value.avsc`` branch here (the caller encodes row by row)."""


def varint(n: int) -> bytes:
    """Avro's variable-length encoding of a non-negative (already zig-zagged) number."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _label(name: str) -> bytes:
    data = name.encode()
    return varint(len(data) << 1) + data


def _varints(numbers: pa.Array) -> pa.Array:
    """Varint bytes of each non-negative number of a uint64 array (one 7-bit group per pass)."""
    pieces: list[pa.Array] = []
    rest = numbers
    active: pa.Array | None = None  # rows that still have bytes to write
    while True:
        high = pc.shift_right(rest, _U7)
        more = pc.not_equal(high, _U0)
        low = pc.bit_wise_and(rest, _LOW7)
        piece = pc.take(_SINGLE_BYTES, pc.if_else(more, pc.bit_wise_or(low, _CONTINUE), low))
        pieces.append(piece if active is None else pc.if_else(active, piece, _EMPTY))
        if not pc.any(more).as_py():
            break
        active, rest = more, high
    if len(pieces) == 1:
        return pieces[0]
    return pc.binary_join_element_wise(*pieces, _EMPTY)


def _zigzag_varints(values: pa.Array) -> pa.Array:
    longs = values.cast(pa.int64()).fill_null(0)  # NULL rows get the null branch later
    # Zig-zag: 2v for v >= 0, 2(-v - 1) + 1 below (shift_left wraps; the uint64 cast keeps the bits).
    one = pa.scalar(1, pa.int64())
    negative = pc.shift_left(pc.bit_wise_not(longs), one)
    zigzag = pc.if_else(pc.less(longs, 0), pc.bit_wise_or(negative, one), pc.shift_left(longs, one))
    return _varints(zigzag.cast(pa.uint64(), safe=False))


def _entries(name: str, values: pa.Array) -> pa.Array:
    """Each row's map entry for this column: label, union branch, value (the null branch for NULL)."""
    label = _label(name)
    kind = values.type
    if pa.types.is_null(kind):
        return pc.if_else(pc.is_valid(values), _EMPTY, pa.scalar(label + _NULL, pa.binary()))
    if pa.types.is_boolean(kind):
        entry = pc.if_else(values, pa.scalar(label + _TRUE, pa.binary()), pa.scalar(label + _FALSE, pa.binary()))
    elif pa.types.is_integer(kind):
        entry = pc.binary_join_element_wise(pa.scalar(label + _LONG, pa.binary()), _zigzag_varints(values), _EMPTY)
    elif pa.types.is_floating(kind):
        doubles = values.cast(pa.float64()).fill_null(0.0)
        data = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(doubles), [None, doubles.buffers()[1]],
                                                    offset=doubles.offset)
        entry = pc.binary_join_element_wise(pa.scalar(label + _DOUBLE, pa.binary()), data.cast(pa.binary()),
                                            _EMPTY)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind):
        data = values.cast(pa.binary())
        branch = _STRING if pa.types.is_string(kind) or pa.types.is_large_string(kind) else _BYTES
        lengths = pc.shift_left(pc.binary_length(data).cast(pa.int64()).fill_null(0), pa.scalar(1, pa.int64()))
        entry = pc.binary_join_element_wise(pa.scalar(label + branch, pa.binary()),
                                            _varints(lengths.cast(pa.uint64())), data, _EMPTY)
    else:
        raise UnsupportedColumnError(f"column {name!r} of Arrow type {kind} has no value.avsc branch")
    return pc.if_else(pc.is_valid(values), entry, pa.scalar(label + _NULL, pa.binary()))


def encode_rows(columns: Sequence[tuple[str, pa.Array | pa.ChunkedArray]], length: int) -> pa.Array:
    """``value.avsc`` bytes of each row made of these (name, values) columns, in this column order.

    Every row gets an entry for every column (NULL values included), as ``encode_row`` writes a dict
    holding every column; ``length`` is the number of rows (the columns may be none).
    """
    if not columns:
        return pa.array([_NULL] * length, pa.binary())  # an empty map: a block count of 0
    header = pa.scalar(varint(len(columns) << 1), pa.binary())
    entries = [_entries(name, values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
               for name, values in columns]
    return pc.binary_join_element_wise(header, *entries, pa.scalar(_NULL, pa.binary()), _EMPTY)
