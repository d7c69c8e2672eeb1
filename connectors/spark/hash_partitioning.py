"""Which Spark partition ``DataFrame.repartition(n, col)`` sends an int column's value to, so a shuffle can
route rows to a chosen partition index.

Spark's hash partitioning puts a row in partition ``pmod(murmur3(col, seed 42), n)`` (``HashPartitioning``
with Spark's ``Murmur3Hash``; for an ``IntegerType`` value, ``Murmur3_x86_32.hashInt``). A view whose
operator runs in Spark's tasks shuffles its input so that Spark partition ``p`` holds exactly the rows of
changelog partition ``p``: each row carries the *token* of its partition (:func:`partition_tokens`), an
int that hashes to ``p``, and the task checks that its partition index is the changelog partition it got
(``partition_tasks``), so a Spark whose hash differs is caught at the first micro-batch, not served
silently one task for two partitions.

Pure: no Spark here; the integration tests run the shuffle on a real ``local-cluster``.
"""

from __future__ import annotations

from functools import cache

SPARK_HASH_SEED = 42
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def murmur3_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash(CAST(value AS INT))``: Murmur3 x86 32-bit of one int, as a signed int."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition_of_int(value: int, partitions: int) -> int:
    """The partition ``repartition(partitions, col)`` gives a row whose ``col`` (an INT) is ``value``."""
    return murmur3_hash_int(value) % partitions  # Python's % is Spark's pmod for a positive divisor


@cache
def partition_tokens(partitions: int) -> tuple[int, ...]:
    """Per partition ``p``, the smallest non-negative int that ``repartition(partitions, col)`` sends to
    ``p``: route a row to ``p`` by setting ``col`` to ``partition_tokens(partitions)[p]``."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    tokens: dict[int, int] = {}
    value = 0
    while len(tokens) < partitions:
        tokens.setdefault(spark_partition_of_int(value, partitions), value)
        value += 1
    return tuple(tokens[p] for p in range(partitions))
