"""The bounded log cache (pure): bounds always hold, and a hit serves exactly the committed epochs of the
range, in order, with no gap; otherwise the reader is told to go to Kafka (evicted) or wait (not yet)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.log_cache import CachedEpoch, CacheError, LogCache, RangeStatus

UPSTREAMS = ("a", "b")


def _epoch(epoch: int, prev: int, nbytes: int) -> CachedEpoch[str]:
    return CachedEpoch(epoch, prev, {0: f"e{epoch}"}, nbytes)


def read_like_a_reader(cache: LogCache[str], committed: list[int], upstream: str, after: int, upto: int
                       ) -> list[int]:
    """The epochs of ``(after, upto]`` as a reader collects them (connectors/spark/log_cache_client.read_with_cache):
    an eviction's range up to its floor from Kafka (``committed``), the rest from the cache, or from Kafka
    once the cache does not have it yet."""
    collected: list[int] = []
    done = after
    while done < upto:
        found = cache.lookup(upstream, done, upto)
        if found.status is RangeStatus.HIT:
            assert [e.parts[0] for e in found.epochs] == [f"e{e.epoch}" for e in found.epochs]
            return collected + [e.epoch for e in found.epochs]
        if found.status is RangeStatus.NOT_YET:  # the reader waits, then reads the rest from Kafka
            assert found.tail is not None and upto > found.tail
            return collected + [e for e in committed if done < e <= upto]
        assert found.status is RangeStatus.EVICTED and found.floor is not None and found.floor > done
        reach = min(found.floor, upto)
        collected += [e for e in committed if done < e <= reach]
        done = reach
    return collected


@settings(max_examples=200, deadline=None)
@given(max_bytes=st.integers(1, 400), max_epochs=st.integers(1, 12),
       writes=st.lists(st.tuples(st.sampled_from(UPSTREAMS), st.integers(1, 3), st.integers(0, 120)),
                       max_size=80),
       queries=st.lists(st.tuples(st.sampled_from(UPSTREAMS), st.integers(0, 200), st.integers(0, 40)),
                        max_size=20))
def test_bounds_hold_and_hits_are_exact(max_bytes: int, max_epochs: int, writes: list[tuple[str, int, int]],
                                        queries: list[tuple[str, int, int]]) -> None:
    cache: LogCache[str] = LogCache(max_bytes, max_epochs)
    committed: dict[str, list[int]] = {u: [] for u in UPSTREAMS}  # every committed epoch, for the check
    last = dict.fromkeys(UPSTREAMS, 0)
    for upstream, step, nbytes in writes:
        epoch = last[upstream] + step  # epochs skip numbers (aborted attempts) but chain by prev_epoch
        cache.put(upstream, _epoch(epoch, last[upstream], nbytes))
        committed[upstream].append(epoch)
        last[upstream] = epoch
        assert cache.nbytes <= max_bytes
        assert all(cache.epoch_count(u) <= max_epochs for u in UPSTREAMS)
    for upstream, after, length in queries:
        upto = after + length
        found = cache.lookup(upstream, after, upto)
        expected = [e for e in committed[upstream] if after < e <= upto]
        if found.status is RangeStatus.HIT:
            assert [e.epoch for e in found.epochs] == expected
            assert [e.parts[0] for e in found.epochs] == [f"e{e}" for e in expected]
        elif found.status is RangeStatus.EVICTED:
            assert found.floor is not None and after < found.floor
            assert read_like_a_reader(cache, committed[upstream], upstream, after, upto) == expected
        elif found.status is RangeStatus.NOT_YET:
            assert found.tail is not None and upto > found.tail
        else:
            assert not committed[upstream]
    # The newest epoch of each upstream is served whenever it fits in the byte bound.
    for upstream in UPSTREAMS:
        if committed[upstream]:
            newest, prev = committed[upstream][-1], ([0, *committed[upstream]])[-2]
            found = cache.lookup(upstream, prev, newest)
            if found.status is RangeStatus.HIT:
                assert [e.epoch for e in found.epochs] == [newest]


def test_eviction_moves_the_floor_and_readers_are_told() -> None:
    cache: LogCache[str] = LogCache(max_bytes=1000, max_epochs=3)
    for epoch in range(1, 6):
        cache.put("u", _epoch(epoch, epoch - 1, 10))
    assert (cache.floor("u"), cache.tail("u")) == (2, 5)
    assert cache.lookup("u", 1, 5).status is RangeStatus.EVICTED
    assert [e.epoch for e in cache.lookup("u", 2, 5).epochs] == [3, 4, 5]
    assert cache.lookup("u", 4, 6).status is RangeStatus.NOT_YET
    assert cache.lookup("v", 0, 1).status is RangeStatus.EMPTY


def test_byte_bound_evicts_the_globally_oldest_epoch() -> None:
    cache: LogCache[str] = LogCache(max_bytes=30, max_epochs=100)
    cache.put("a", _epoch(1, 0, 10))
    cache.put("b", _epoch(2, 0, 10))
    cache.put("a", _epoch(3, 1, 10))
    cache.put("b", _epoch(4, 2, 10))
    assert cache.nbytes == 30
    assert cache.floor("a") == 1 and cache.floor("b") == 0  # a's epoch 1 was the oldest in memory
    assert cache.lookup("a", 0, 3).status is RangeStatus.EVICTED


def test_an_epoch_larger_than_the_bound_is_a_hole_the_epochs_before_it_stay() -> None:
    cache: LogCache[str] = LogCache(max_bytes=50, max_epochs=10)
    cache.put("u", _epoch(1, 0, 10))
    cache.put("u", _epoch(2, 1, 60))
    assert cache.nbytes == 10 and (cache.floor("u"), cache.tail("u")) == (0, 2)
    assert [e.epoch for e in cache.lookup("u", 0, 1).epochs] == [1]  # before the hole: still served
    across = cache.lookup("u", 0, 2)
    assert (across.status, across.floor) == (RangeStatus.EVICTED, 2)  # Kafka up to the hole, then the cache
    cache.put("u", _epoch(3, 2, 10))
    assert [e.epoch for e in cache.lookup("u", 2, 3).epochs] == [3]
    assert cache.lookup("u", 1, 3).status is RangeStatus.EVICTED


def test_a_skip_with_nothing_cached_restarts_the_run_after_it_and_eviction_passes_holes() -> None:
    cache: LogCache[str] = LogCache(max_bytes=1000, max_epochs=2)
    cache.skip("u", 1, 0)
    assert (cache.floor("u"), cache.tail("u")) == (1, 1)
    cache.put("u", _epoch(2, 1, 10))
    cache.skip("u", 3, 2)
    cache.skip("u", 4, 3)
    cache.put("u", _epoch(5, 4, 10))
    cache.put("u", _epoch(6, 5, 10))  # over max_epochs: epoch 2 goes, and the holes 3 and 4 with it
    assert (cache.floor("u"), cache.tail("u")) == (4, 6)
    assert [e.epoch for e in cache.lookup("u", 4, 6).epochs] == [5, 6]
    assert cache.lookup("u", 3, 6).status is RangeStatus.EVICTED


def test_a_gap_in_the_chain_is_refused() -> None:
    cache: LogCache[str] = LogCache(max_bytes=100, max_epochs=10)
    cache.put("u", _epoch(5, 3, 1))
    with pytest.raises(CacheError, match="tail is 5"):
        cache.put("u", _epoch(9, 7, 1))
