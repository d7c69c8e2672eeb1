"""connectors/redis/table_writers.py on a real redis-server: a table is sealed only while its writer is
stopped, the next writer starts above the seal, and a fenced writer's close says nothing."""

from __future__ import annotations

import redis

from mvlog.config import Settings
from mvlog.connectors.redis.table_writers import TableWriters
from mvlog.epoch import epoch_from_millis


def test_seal_only_while_stopped_and_the_next_writer_starts_above_it(settings: Settings,
                                                                     redis_client: redis.Redis) -> None:
    writers = TableWriters(redis_client, settings.topic_prefix)
    high = epoch_from_millis(1_795_000_000_123, 7)  # above a double's 53 bits: compared exactly
    assert not writers.seal("t", high)  # no state (never opened, or Redis wiped): never sealed on a guess
    first, sealed = writers.open("t")
    assert sealed == 0 and writers.stopped(["t"]) == set()
    assert not writers.seal("t", high)  # a writer runs: it may still commit below ``high``
    assert writers.close("t", first) and writers.stopped(["t", "u"]) == {"t"}
    assert writers.seal("t", high) and writers.sealed("t") == high
    assert writers.seal("t", high - 1) and writers.sealed("t") == high  # a seal never moves back
    assert writers.seal("t", high + 1) and writers.sealed("t") == high + 1
    second, sealed = writers.open("t")
    assert sealed == high + 1  # its epochs start above what readers planned through
    third, _ = writers.open("t")  # a newer writer fences the second (Kafka's transactional id)
    assert not writers.close("t", second)  # the fenced one's close leaves the table open
    assert writers.stopped(["t"]) == set() and not writers.seal("t", high + 2)
    assert writers.close("t", third) and writers.stopped(["t"]) == {"t"}
