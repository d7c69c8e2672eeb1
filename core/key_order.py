"""Primary-key order as bytes: the order in which a backfill walks a vnode's keys.

A backfill position is "the highest key already backfilled", so keys need a total order that a store
can range-scan. The Avro key bytes are not ordered (zig-zag varints), so each key gets a second,
*order-preserving* encoding (memcomparable, as key-value stores use): comparing encodings as bytes
compares the keys column by column as Python compares tuples of the same types.

Per value: a tag byte (NULL sorts first), then ints as 8 big-endian bytes with the sign bit flipped,
floats as IEEE-754 bits flipped so negative values sort first, strings (UTF-8) and bytes with 0x00
escaped as 0x00 0xFF and terminated by 0x00 0x00. Every encoding is prefix-free, so a tuple's encoding
is the concatenation of its values' and anything appended after it never changes the order.

An *order member* is what the key-order index stores per row: ``vnode (1 byte) + ordered key + Avro key
+ len(Avro key) (2 bytes)``. Sorted as bytes, members group by vnode and then follow key order; the
trailing Avro key lets a store script find the row (whose field is the Avro key) without decoding.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from mvlog.row_schema import Key
from mvlog.schemas.codec import native_module
from mvlog.vnode import vnode_of

_native = native_module()  # the compiled order_member; None: the Python one below

_NULL, _FALSE_TRUE, _INT, _FLOAT, _STRING, _BYTES = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05
_INT_BIAS = 1 << 63
_MAX_AVRO_KEY = 0xFFFF


class KeyOrderError(ValueError):
    pass


def _escaped(data: bytes) -> bytes:
    return data.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def ordered_value(value: Any) -> bytes:
    if value is None:
        return bytes((_NULL,))
    if isinstance(value, bool):
        return bytes((_FALSE_TRUE, int(value)))
    if isinstance(value, int):
        if not -_INT_BIAS <= value < _INT_BIAS:
            raise KeyOrderError(f"key value {value} is outside int64")
        return bytes((_INT,)) + (value + _INT_BIAS).to_bytes(8, "big")
    if isinstance(value, float):
        bits: int = struct.unpack(">Q", struct.pack(">d", value))[0]
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
        return bytes((_FLOAT,)) + bits.to_bytes(8, "big")
    if isinstance(value, str):
        return bytes((_STRING,)) + _escaped(value.encode())
    if isinstance(value, bytes | bytearray):
        return bytes((_BYTES,)) + _escaped(bytes(value))
    raise KeyOrderError(f"key value {value!r} of type {type(value).__name__} has no order")


def ordered_key(key: Sequence[Any]) -> bytes:
    """The order-preserving encoding of a key tuple."""
    return b"".join(ordered_value(v) for v in key)


def decode_ordered_key(data: bytes) -> Key:
    """The key tuple of :func:`ordered_key` (for showing positions to people)."""
    values: list[Any] = []
    i = 0
    while i < len(data):
        tag = data[i]
        i += 1
        if tag == _NULL:
            values.append(None)
        elif tag == _FALSE_TRUE:
            values.append(bool(data[i]))
            i += 1
        elif tag == _INT:
            values.append(int.from_bytes(data[i:i + 8], "big") - _INT_BIAS)
            i += 8
        elif tag == _FLOAT:
            bits = int.from_bytes(data[i:i + 8], "big")
            bits = bits & ~(1 << 63) if bits >> 63 else bits ^ 0xFFFFFFFFFFFFFFFF
            values.append(struct.unpack(">d", bits.to_bytes(8, "big"))[0])
            i += 8
        elif tag in (_STRING, _BYTES):
            out = bytearray()
            while True:
                byte = data[i]
                if byte == 0 and data[i + 1] == 0:
                    i += 2
                    break
                out.append(byte)
                i += 2 if byte == 0 else 1  # 0x00 0xFF is an escaped 0x00
            values.append(out.decode() if tag == _STRING else bytes(out))
        else:
            raise KeyOrderError(f"not an ordered key: tag {tag:#x} at byte {i - 1}")
    return tuple(values)


def order_member(vnode: int, key: Sequence[Any], avro_key: bytes) -> bytes:
    """The key-order index member of a row (see the module docstring)."""
    if _native is not None and type(key) is tuple and type(avro_key) is bytes:
        member: bytes | None = _native.order_member(vnode, key, avro_key)
        if member is not None:
            return member
    if len(avro_key) > _MAX_AVRO_KEY:
        raise KeyOrderError(f"a key of {len(avro_key)} bytes is too long for the key-order index")
    return bytes((vnode,)) + ordered_key(key) + avro_key + len(avro_key).to_bytes(2, "big")


def order_members(keys: Sequence[Key], avro_keys: Sequence[bytes]) -> list[bytes]:
    """:func:`order_member` of many rows (vnode from the Avro key); keys of one int are the fast case."""
    if _native is not None:
        compiled: list[bytes] = _native.order_members(list(keys), list(avro_keys), order_member)
        return compiled
    members: list[bytes] = []
    append = members.append
    for key, avro_key in zip(keys, avro_keys, strict=True):
        vnode = vnode_of(avro_key)
        value = key[0] if len(key) == 1 else None
        if type(value) is int and -_INT_BIAS <= value < _INT_BIAS and len(avro_key) <= _MAX_AVRO_KEY:
            append(b"".join((bytes((vnode, _INT)), (value + _INT_BIAS).to_bytes(8, "big"), avro_key,
                             len(avro_key).to_bytes(2, "big"))))
        else:
            append(order_member(vnode, key, avro_key))
    return members


def member_vnode(member: bytes) -> int:
    return member[0]


def member_avro_key(member: bytes) -> bytes:
    length = int.from_bytes(member[-2:], "big")
    return member[-2 - length:-2]


def member_key(member: bytes) -> Key:
    """The key tuple of a member."""
    length = int.from_bytes(member[-2:], "big")
    return decode_ordered_key(member[1:-2 - length])
