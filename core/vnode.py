"""Virtual nodes: the unit of data placement that survives rescaling.

A key's vnode is a stable hash of its encoded bytes modulo 256. Each partition of a changelog owns a
contiguous range of vnodes, so progress kept per vnode (backfill positions) stays valid when the number
of partitions changes.
"""

from __future__ import annotations

import zlib

VNODE_COUNT = 256


def vnode_of(key: bytes) -> int:
    """CRC-32 is stable across processes and Python versions, unlike ``hash()``."""
    return zlib.crc32(key) % VNODE_COUNT


def partition_of_vnode(vnode: int, partitions: int) -> int:
    if not 0 <= vnode < VNODE_COUNT:
        raise ValueError(f"vnode {vnode} outside 0..{VNODE_COUNT - 1}")
    return vnode * partitions // VNODE_COUNT


def vnode_range(partition: int, partitions: int) -> range:
    """The contiguous vnodes owned by ``partition`` (the inverse of ``partition_of_vnode``)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} outside 0..{partitions - 1}")
    start = -(-partition * VNODE_COUNT // partitions)
    stop = -(-(partition + 1) * VNODE_COUNT // partitions)
    return range(start, stop)
