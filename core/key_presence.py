"""Which keys a table surely does not hold: a Bloom filter over the encoded keys its rows were written under.

A table writer reads the before-image of every key an epoch writes (an HMGET of the table's rows), to
publish a create, an update or nothing. For a key the table has never held the read always misses, and
while a source table ingests new keys (an insert-heavy topic, a first catch-up) every read misses: one
Redis round trip and one lookup per key, on the epoch's commit path, for nothing. This filter answers
"surely absent" for most such keys without asking Redis, and "maybe present" for the others, which are
read as before. It never answers "absent" for a key the table holds, as long as the writer keeps it a
**superset** of the table's keys: seeded with every key of the rows when the writer starts, and given
every key an epoch writes a row for before that epoch commits (a delete leaves its key in: a superset is
still exact, it only costs a read). Keys it holds that the table does not (deleted ones, an epoch that
did not commit) only cost the read they would have cost anyway.

It is a *blocked* Bloom filter: each key sets :data:`PROBES` bits of one 64-bit word chosen by its hash,
so a test or an insert touches one word, done for a whole epoch's keys at once with numpy. Hashes are
Python's ``hash`` of the key bytes (randomized per process, which is fine: the filter lives and dies with
the writer). Memory is fixed (``2 ** words_log2`` words); once far more keys than it was sized for went
in, every answer would be "maybe", so it stops itself (:attr:`KeyPresence.saturated`) and costs nothing.

Pure: no Redis, no Kafka (the table writer seeds and feeds it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PROBES = 7  # bits per key within its word: about 1 % false "maybe" at 16 bits of filter per key
WORDS_LOG2 = 20  # 2 ** 20 words of 8 bytes: 8 MiB, sized for ~4M keys (16 bits each)
_WORD_BITS = 64
_SHIFT = 20  # the word comes from the hash's low bits (up to 2 ** _SHIFT words), the probes from the ones above


class KeyPresence:
    """A superset of a table's keys (encoded key bytes): :meth:`maybe_present` False means surely absent."""

    def __init__(self, words_log2: int = WORDS_LOG2) -> None:
        if not 1 <= words_log2 <= _SHIFT:
            raise ValueError(f"words_log2 must be within 1..{_SHIFT}, not {words_log2}")
        self._words = np.zeros(1 << words_log2, dtype=np.uint64)
        self._word_mask = np.uint64((1 << words_log2) - 1)
        # Past this many insertions (duplicates counted) nearly every bit is set: the filter stops answering.
        self._capacity = (len(self._words) * _WORD_BITS) // 2
        self.inserted = 0
        self.saturated = False

    def _locate(self, keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Each key's word index and the mask of its probe bits."""
        hashes = np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)).view(np.uint64)
        words = hashes & self._word_mask
        masks = np.zeros(len(keys), dtype=np.uint64)
        six, one = np.uint64(63), np.uint64(1)
        for probe in range(PROBES):
            masks |= one << ((hashes >> np.uint64(_SHIFT + 6 * probe)) & six)
        return words, masks

    def add(self, keys: Sequence[bytes]) -> None:
        """Note that the table may hold ``keys`` (from now on they read as maybe present)."""
        if self.saturated or not keys:
            return
        self.inserted += len(keys)
        if self.inserted > self._capacity:
            self.saturated = True
            self._words = np.zeros(1, dtype=np.uint64)  # every answer is "maybe" from now on: free the memory
            return
        words, masks = self._locate(keys)
        np.bitwise_or.at(self._words, words, masks)

    def maybe_present(self, keys: Sequence[bytes]) -> list[bool]:
        """For each key: False when the table surely does not hold it, True when it may."""
        if self.saturated:
            return [True] * len(keys)
        if not keys:
            return []
        words, masks = self._locate(keys)
        found: list[bool] = ((self._words[words] & masks) == masks).tolist()
        return found


__all__ = ["KeyPresence"]
