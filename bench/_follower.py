"""A follower of one upstream for ``bench/cache.py``'s rate phase (a plain script, run as a child process).

It reads every committed epoch of the upstream after the one it starts at, the way a view's Spark tasks
read it (``read_partition_range`` of each partition: the log cache, else Kafka), and notes in Redis the
last epoch it read, until it is terminated. A process of its own, as a view's consumer is, so the three
followers do not share the benchmark's interpreter (and its writer) with each other.

    python bench/_follower.py SETTINGS_JSON UPSTREAM INDEX
"""

from __future__ import annotations

import signal
import sys
import time

import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.spark.spark_source import _Planner, read_partition_range


def position_key(settings: Settings, index: int) -> str:
    return f"{settings.topic_prefix}:bench:follower:{index}"


def follow(settings: Settings, upstream: str, index: int) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    planner = _Planner(settings, CatalogStore(settings, client).get(upstream))
    done = planner.latest_epoch()
    client.set(position_key(settings, index), done)
    while True:
        last = planner.latest_epoch()
        if last <= done:
            time.sleep(0.02)
            continue
        for part in planner.plan(done, last):
            for _batch in read_partition_range(part):
                pass
        done = last
        client.set(position_key(settings, index), done)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    follow(Settings.model_validate_json(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
