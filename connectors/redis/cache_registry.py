"""Which log-cache worker holds which upstream partition, in Redis, with expiry.

A worker owns partitions through Faust's group assignment; every heartbeat it writes, for each partition
it holds, ``<prefix>:cache:partition:<upstream>:<partition>`` = its web address, and a description of
itself under ``<prefix>:cache:worker:<id>``, all with a TTL of a few heartbeats. A killed worker's
entries expire by themselves, and a reader that reaches a dead address falls back to Kafka meanwhile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

HEARTBEATS_TO_EXPIRE = 5


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    url: str
    pid: int
    partitions: dict[str, list[int]]  # upstream -> partitions held
    ts_ms: int


class CacheRegistry:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix

    def partition_key(self, upstream: str, partition: int) -> str:
        return f"{self._prefix}:cache:partition:{upstream}:{partition}"

    def worker_key(self, worker_id: str) -> str:
        return f"{self._prefix}:cache:worker:{worker_id}"

    def heartbeat(self, worker_id: str, url: str, pid: int, partitions: Mapping[str, Sequence[int]],
                  ttl_ms: int) -> None:
        """Claim ``partitions`` for ``ttl_ms`` (renewed by the next heartbeat)."""
        info = {"worker_id": worker_id, "url": url, "pid": pid, "ts_ms": int(time.time() * 1000),
                "partitions": {u: sorted(ps) for u, ps in partitions.items()}}
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self.worker_key(worker_id), json.dumps(info), px=ttl_ms)
        for upstream, held in partitions.items():
            for partition in held:
                pipe.set(self.partition_key(upstream, partition), url, px=ttl_ms)
        pipe.execute()

    def release(self, worker_id: str, url: str, partitions: Mapping[str, Sequence[int]]) -> None:
        """Drop the claims on ``partitions`` that still name this worker (after a revocation or at exit)."""
        for upstream, held in partitions.items():
            for partition in held:
                key = self.partition_key(upstream, partition)
                if self._redis.get(key) == url.encode():
                    self._redis.delete(key)

    def retire(self, worker_id: str) -> None:
        self._redis.delete(self.worker_key(worker_id))

    def worker_for(self, upstream: str, partition: int) -> str | None:
        """The web address of the worker caching ``upstream``'s ``partition``, if one is alive."""
        url = cast(bytes | None, self._redis.get(self.partition_key(upstream, partition)))
        return url.decode() if url is not None else None

    def reads_key(self, upstream: str) -> str:
        return f"{self._prefix}:cache:reads:{upstream}"

    def count_reads(self, upstream: str, from_cache: int, from_kafka: int) -> None:
        """Readers add the partition-epochs they read from the cache and from Kafka (cache hit share)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hincrby(self.reads_key(upstream), "cache", from_cache)
        pipe.hincrby(self.reads_key(upstream), "kafka", from_kafka)
        pipe.execute()

    def reads(self, upstream: str) -> tuple[int, int]:
        """Partition-epochs of ``upstream`` read so far from the cache and from Kafka."""
        found = cast(dict[bytes, bytes], self._redis.hgetall(self.reads_key(upstream)))
        return int(found.get(b"cache", 0)), int(found.get(b"kafka", 0))

    def workers(self) -> list[WorkerInfo]:
        keys = sorted(self._redis.scan_iter(match=f"{self._prefix}:cache:worker:*", count=100))
        # A GET each, pipelined: the workers' keys have no common hash tag, so no MGET on a Redis Cluster
        # (whose client scans every master and sends each GET to its key's).
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        found: list[WorkerInfo] = []
        for raw in cast(list[bytes | None], pipe.execute() if keys else []):
            if raw is not None:
                data: dict[str, Any] = json.loads(raw)
                found.append(WorkerInfo(data["worker_id"], data["url"], data["pid"], data["partitions"],
                                        data["ts_ms"]))
        return found
