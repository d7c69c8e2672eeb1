"""What the log-cache worker answers over HTTP (Faust's web server): ``GET /epochs/<upstream>/<partition>/
?after=A&upto=U``, the partition's cached epochs in ``(A, U]`` as an Arrow IPC stream (200), or 410
(evicted: below the floor, read Kafka), 425 (not aligned yet), 404 (partition not held) or 400 (bad
query), with ``{"floor", "tail"}``; and ``GET /stats/``, the worker's figures as JSON.

The 200 reply is streamed: the schema message, then the cached IPC messages themselves, so any number of
readers are served at once without copying the cache."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import faust
import pyarrow as pa
from aiohttp import web
from faust.web import Request, Response, View

from mvlog.connectors.spark.log_cache_client import ARROW_STREAM
from mvlog.log_cache import LogCache, RangeStatus
from mvlog.services.log_cache.feed import IpcParts, UpstreamFeed, reply_buffers


@dataclass
class UpstreamStats:
    """What the worker counted of one upstream (its ``/stats/``)."""

    served_epochs: int = 0  # partition-epochs answered from memory
    evicted_replies: int = 0
    not_yet_replies: int = 0
    paused: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CacheServer:
    """Serves the worker's cache: ``feeds`` and ``stats`` are the worker's own (changed by it as it runs),
    ``schema_messages`` each upstream's Arrow schema, serialized once."""

    cache: LogCache[IpcParts]
    feeds: Mapping[str, UpstreamFeed]
    stats: Mapping[str, UpstreamStats]
    schema_messages: Mapping[str, pa.Buffer]

    def add_pages(self, app: faust.App, describe: Callable[[], dict[str, Any]]) -> None:
        """Register ``/epochs/...`` and ``/stats/`` (``describe()``: the stats' JSON) on ``app``."""
        server = self

        class EpochsView(View):
            async def get(self, request: Request, upstream: str, partition: str) -> Any:
                return await server.epochs(self, request, upstream, int(partition))

        class StatsView(View):
            async def get(self, request: Request) -> Response:
                return self.json(describe())

        app.page("/epochs/{upstream}/{partition}/")(EpochsView)
        app.page("/stats/")(StatsView)

    async def epochs(self, view: View, request: Request, upstream: str, partition: int) -> Any:
        feed = self.feeds.get(upstream)
        if feed is None or partition not in feed.partitions:
            return view.json({"error": f"{upstream} partition {partition} is not held by this worker"}, status=404)
        try:
            after, upto = int(request.query["after"]), int(request.query["upto"])
        except (KeyError, ValueError):
            return view.json({"error": "query parameters after and upto must be integer epochs"}, status=400)
        found = self.cache.lookup(upstream, after, upto)
        stats = self.stats[upstream]
        detail = {"floor": found.floor, "tail": found.tail}
        if found.status is RangeStatus.HIT:
            stats.served_epochs += len(found.epochs)
            return await _stream(request, reply_buffers(found.epochs, partition, self.schema_messages[upstream]))
        if found.status is RangeStatus.EVICTED:
            stats.evicted_replies += 1
            return view.json(detail, status=410)
        stats.not_yet_replies += 1
        return view.json(detail, status=425)


async def _stream(request: Request, buffers: list[pa.Buffer]) -> web.StreamResponse:
    """An IPC stream reply written from the cached buffers themselves (memoryviews, no copy on our side);
    the event loop serves other readers while the socket drains."""
    response = web.StreamResponse(status=200, headers={"Content-Type": ARROW_STREAM})
    response.content_length = sum(buffer.size for buffer in buffers)
    await response.prepare(request)  # type: ignore[arg-type]
    for buffer in buffers:
        await response.write(memoryview(buffer))
    await response.write_eof()
    return response
