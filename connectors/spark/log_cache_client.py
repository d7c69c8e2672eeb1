"""Executor side of the log cache: read one partition's epoch range from a Faust worker, else Kafka.

The driver plans every committed epoch of the range from the epoch index (``part.barriers``); this
module only decides where each planned epoch is read from, never which epochs there are:

* the worker holding the partition (looked up in Redis) serves the epochs it has as an Arrow IPC
  stream, in the data source's row shape; the reply must carry exactly the planned epochs, one barrier
  row each, or it is discarded;
* epochs below the worker's floor were evicted: they are read from Kafka (seeking by the epoch index,
  :func:`~mvlog.connectors.spark.spark_source.read_partition_from_kafka`), then the reader asks the cache
  again for the rest. That is the replay of lagged epochs; a reader rejoins the cache right after the
  last epoch it replayed, so no epoch is read twice or skipped;
* epochs above the worker's tail are waited for a little (the worker aligns an epoch within
  milliseconds of its commit), then read from Kafka;
* no worker, a dead one, or any HTTP error: Kafka.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.spark.change_rows import BARRIER

if TYPE_CHECKING:
    from mvlog.connectors.spark.spark_source import PartitionRange

log = logging.getLogger(__name__)

ARROW_STREAM = "application/vnd.apache.arrow.stream"
HTTP_TIMEOUT_S = 10.0

KafkaRead = Callable[["PartitionRange"], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class CacheReply:
    """What a worker said about ``(after, upto]``: the batches (hit), or its floor and tail."""

    status: str  # "hit" | "evicted" | "not_yet" | "unavailable"
    batches: list[pa.RecordBatch] = dataclasses.field(default_factory=list)
    floor: int | None = None


def epochs_url(base: str, upstream: str, partition: int, after: int, upto: int) -> str:
    query = urllib.parse.urlencode({"after": after, "upto": upto})
    return f"{base.rstrip('/')}/epochs/{urllib.parse.quote(upstream)}/{partition}/?{query}"


def fetch_epochs(base: str, upstream: str, partition: int, after: int, upto: int) -> CacheReply:
    """One request to a worker; never raises for a worker that is gone or refuses (``unavailable``)."""
    try:
        with urllib.request.urlopen(epochs_url(base, upstream, partition, after, upto),
                                    timeout=HTTP_TIMEOUT_S) as response, pa.ipc.open_stream(response.read()) as stream:
            return CacheReply("hit", list(stream))
    except urllib.error.HTTPError as error:
        body = error.read()
        if error.code in (410, 425):
            detail = json.loads(body or b"{}")
            return CacheReply("evicted" if error.code == 410 else "not_yet", floor=detail.get("floor"))
        return CacheReply("unavailable")
    except (OSError, pa.ArrowInvalid, ValueError):
        return CacheReply("unavailable")


def barrier_epochs(batches: list[pa.RecordBatch]) -> list[int]:
    epochs: list[int] = []
    for batch in batches:
        mask = pc.equal(batch.column("_change_type"), BARRIER)
        epochs.extend(batch.column("_epoch").filter(mask).to_pylist())
    return epochs


def sub_range(part: PartitionRange, after: int, upto: int) -> PartitionRange:
    """The planned epochs of ``part`` in ``(after, upto]``, starting after ``after``'s barrier."""
    offsets = dict(part.barriers)
    start = part.start_offset if after == part.after_epoch else offsets[after] + 1
    return dataclasses.replace(part, after_epoch=after, start_offset=start,
                               barriers=tuple(b for b in part.barriers if after < b[0] <= upto))


def read_with_cache(part: PartitionRange, from_kafka: KafkaRead) -> Iterator[pa.RecordBatch]:
    """The planned epochs of ``part`` in order, each exactly once, from the cache where it can."""
    settings = Settings.from_executor_json(part.settings_json)
    registry = CacheRegistry(redis_client.task_client(settings), settings.topic_prefix)
    planned = [epoch for epoch, _ in part.barriers]
    from_cache = 0
    base = registry.worker_for(part.view, part.partition)
    last = planned[-1]
    done = part.after_epoch  # every planned epoch up to here has been yielded
    deadline = time.monotonic() + settings.cache_wait_ms / 1000
    while base is not None and done < last:
        reply = fetch_epochs(base, part.view, part.partition, done, last)
        if reply.status == "hit":
            expected = [e for e in planned if e > done]
            if barrier_epochs(reply.batches) == expected:
                yield from reply.batches
                from_cache += len(expected)
                done = last
                break
            log.warning("%s partition %d: the log cache's epochs in (%d, %d] differ from the epoch index; "
                        "reading Kafka", part.view, part.partition, done, last)
            break
        if reply.status == "evicted" and reply.floor is not None and reply.floor > done:
            replay_upto = min(reply.floor, last)
            yield from from_kafka(sub_range(part, done, replay_upto))  # replay of lagged epochs
            done = replay_upto
            continue
        if reply.status == "not_yet" and time.monotonic() < deadline:
            time.sleep(0.02)
            continue
        break
    if done < last:
        yield from from_kafka(sub_range(part, done, last))
    registry.count_reads(part.view, from_cache, len(planned) - from_cache)
