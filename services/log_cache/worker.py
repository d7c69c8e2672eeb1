"""The Faust log-cache worker app: one fetch stream per upstream, a bounded cache, an Arrow IPC server.

* **Fetching.** One Faust agent per upstream changelog topic (the upstreams that views read, from the
  catalog), so the upstream is fetched from Kafka once per worker however many views read it. Several
  workers with the same app id share the partitions through Faust's group assignment.
* **Alignment.** Each agent feeds its records to an :class:`UpstreamFeed` (barriers aligned across the
  partitions this worker holds, commit rule); every committed epoch goes into the :class:`LogCache`.
  The Faust consumer reads with ``read_uncommitted`` (Faust sets ``read_committed`` only for its
  exactly-once mode, which would make it transactional): the commit rule is what keeps the cache exact,
  as it does on Tansu, which delivers aborted records to ``read_committed`` readers anyway.
* **Serving.** ``GET /epochs/<upstream>/<partition>/?after=A&upto=U`` answers an Arrow IPC stream of
  the partition's epochs in ``(A, U]`` (200), or 410 (evicted: below the floor, read Kafka), 425 (not
  aligned yet) or 404 (partition not held), with ``{"floor", "tail"}``. ``GET /stats/`` is JSON.
* **Registry.** Every heartbeat the worker claims its partitions in Redis (:class:`CacheRegistry`) with
  a TTL, so the claims of a killed worker expire.
* **Backpressure.** When a downstream's lag reaches its ``max_epoch_lag``, the upstream's partitions are
  paused (the cache stops growing) until it catches up (:class:`Backpressure`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import pyarrow as pa
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.web import Request, Response, View

from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch
from mvlog.config import Settings
from mvlog.connectors import redis_client
from mvlog.connectors.backpressure import Backpressure
from mvlog.connectors.cache_registry import HEARTBEATS_TO_EXPIRE, CacheRegistry
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.change_rows import arrow_schema
from mvlog.connectors.epoch_index import EpochIndex
from mvlog.connectors.kafka_security import faust_broker_credentials
from mvlog.connectors.log_cache_client import ARROW_STREAM
from mvlog.log_cache import CacheError, LogCache, RangeStatus
from mvlog.process_memory import peak_rss_kib, rss_kib
from mvlog.schemas.codec import DecodeError, record_type
from mvlog.services.log_cache.feed import FeedError, RawRecord, UpstreamFeed, serve_range

log = logging.getLogger(__name__)

CONFIRM_INTERVAL_S = 0.05  # how often held epochs are checked against the epoch index
BACKPRESSURE_INTERVAL_S = 0.1
COMMIT_INTERVAL_S = 1.0  # how often the feeds' positions are committed for the consumer group
FETCH_BYTES = 1024 * 1024  # per fetch: what the worker holds in flight besides the cache (I4)


def use_returning_memory_pool() -> str:
    """Make Arrow allocate from a pool that gives freed memory back, for this process (I4).

    pyarrow's default pool is mimalloc, which keeps much of what a worker frees (the builders' transient
    buffers, evicted epochs) in its segments: ``bench/cache.py`` measured the worker's peak RSS 130 MiB
    above idle for a 64 MiB cache with mimalloc, 96 MiB with jemalloc or the system allocator (Arrow's
    own count was 64 MiB in every case). jemalloc with decay 0 purges freed pages at once.
    """
    try:
        pool = pa.jemalloc_memory_pool()
        pa.jemalloc_set_decay_ms(0)
    except NotImplementedError:  # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    return str(pool.backend_name)


class _BoundedFetchThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Sets aiokafka's ``fetch_max_bytes`` (not a Faust setting; 50 MB by default). Tansu ignores the
    per-partition limit (``consumer_max_fetch_size``), so without it a worker with a backlog holds up to
    50 MB of records per fetch, several times that as Python objects (I4)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_bytes = FETCH_BYTES  # read by the fetcher aiokafka creates at start()
        return consumer


class _BoundedFetchConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _BoundedFetchThread(self, loop=self.loop, beacon=self.beacon)


class _BoundedFetchTransport(faust_aiokafka.Transport):
    Consumer = _BoundedFetchConsumer


class _CacheApp(faust.App):
    def _new_transport(self) -> Any:
        return _BoundedFetchTransport(self.conf.broker_consumer, self)


@dataclass
class UpstreamStats:
    served_epochs: int = 0  # partition-epochs answered from memory
    evicted_replies: int = 0
    not_yet_replies: int = 0
    paused: bool = False
    errors: list[str] = field(default_factory=list)


def upstreams_read_by_views(catalog: CatalogStore) -> list[CatalogEntry]:
    """Every table or view that some view reads: what the workers cache."""
    entries = {e.name: e for e in catalog.all()}
    names = sorted({s for e in entries.values() for s in e.sources if s in entries})
    return [entries[n] for n in names]


class LogCacheWorker:
    """Builds the Faust app; :meth:`run` starts it (Faust's worker, with its web server)."""

    def __init__(self, settings: Settings, *, port: int | None = None, worker_id: str | None = None,
                 upstreams: list[str] | None = None) -> None:
        self.settings = settings
        self.worker_id = worker_id or uuid.uuid4().hex[:8]
        self.port = settings.cache_port if port is None else port
        self.url = f"http://{settings.bind_host}:{self.port}"
        self._redis = redis_client.connect(settings)
        catalog = CatalogStore(settings, self._redis)
        entries = ([catalog.get(n) for n in upstreams] if upstreams is not None
                   else upstreams_read_by_views(catalog))
        self.entries = {e.name: e for e in entries}
        self._topics = {settings.changelog_topic(name): name for name in self.entries}
        self._schemas = {name: arrow_schema(e.schema) for name, e in self.entries.items()}
        self.cache: LogCache[pa.RecordBatch] = LogCache(settings.cache_max_bytes, settings.cache_max_epochs)
        self.feeds: dict[str, UpstreamFeed] = {}
        self.stats = {name: UpstreamStats() for name in self.entries}
        self.index = EpochIndex(self._redis, settings.topic_prefix)
        self.registry = CacheRegistry(self._redis, settings.topic_prefix)
        self.backpressure = Backpressure(settings, redis_client.connect(settings))
        self._claimed: dict[str, list[int]] = {}
        self._paused: dict[str, set[int]] = {}  # upstream -> partitions paused on the Faust consumer
        self._committed: dict[TP, int] = {}  # the positions last committed for the consumer group
        self.largest_epoch_bytes = 0  # the largest epoch put in the cache (Arrow bytes)
        self.app = self._build_app()

    # --- the Faust app ----------------------------------------------------------------------------

    def _build_app(self) -> faust.App:
        settings = self.settings
        app = _CacheApp(
            f"{settings.topic_prefix}-log-cache",
            broker=[f"kafka://{server}" for server in settings.bootstrap_servers.split(",")],
            broker_credentials=faust_broker_credentials(settings),  # SASL/TLS from the same settings
            store="memory://",
            datadir=str(Path(settings.stack_dir) / "faust" / self.worker_id),
            web_port=self.port, web_bind=settings.bind_host, web_host=settings.bind_host,
            broker_session_timeout=settings.session_timeout_ms / 1000,
            broker_heartbeat_interval=min(1.0, settings.session_timeout_ms / 3000),
            broker_commit_interval=1.0,
            consumer_auto_offset_reset="earliest",
            consumer_max_fetch_size=FETCH_BYTES // 4,
            stream_buffer_maxsize=256,
            broker_max_poll_records=500,
            topic_disable_leader=True,
            topic_allow_declare=False,  # changelog topics belong to their writers
            web_enabled=True,
        )
        for topic_name, upstream in self._topics.items():
            topic = app.topic(topic_name, key_type=bytes, value_type=bytes, key_serializer="raw",
                              value_serializer="raw", allow_empty=True, acks=False)
            app.agent(topic, name=f"cache-{upstream}")(self._agent_for(upstream))
        app.timer(CONFIRM_INTERVAL_S)(self._confirm_held_epochs)
        app.timer(BACKPRESSURE_INTERVAL_S)(self._apply_backpressure)
        app.timer(settings.cache_heartbeat_ms / 1000)(self._heartbeat)
        app.timer(COMMIT_INTERVAL_S)(self._commit_positions)
        app.on_partitions_assigned.connect(self._on_assigned)
        worker = self

        class EpochsView(View):
            async def get(self, request: Request, upstream: str, partition: str) -> Response:
                return worker._serve(self, request, upstream, int(partition))

        class StatsView(View):
            async def get(self, request: Request) -> Response:
                return self.json(worker.describe())

        app.page("/epochs/{upstream}/{partition}/")(EpochsView)
        app.page("/stats/")(StatsView)
        return app

    def _agent_for(self, upstream: str) -> Any:
        async def fetch(stream: Any) -> AsyncIterator[None]:
            async for event in stream.events():
                message = event.message
                await self._on_record(upstream, RawRecord(message.partition, message.offset,
                                                    record_type(message.headers), message.key or b"",
                                                    message.value or b""))
                yield None
        fetch.__name__ = f"cache_{upstream}"
        return fetch

    async def _on_record(self, upstream: str, record: RawRecord) -> None:
        feed = self.feeds.get(upstream)
        if feed is None or record.partition not in feed.partitions:
            feed = self._reset(upstream, self._held_partitions(upstream) | {record.partition})
        try:
            committed = feed.add(record)
        except (FeedError, DecodeError, RuntimeError, CacheError) as exc:
            # Readers of this upstream go to Kafka, where the same record fails with its position.
            log.error("%s: %s; the cache of this upstream restarts", upstream, exc)
            self.stats[upstream].errors = [*self.stats[upstream].errors[-9:], str(exc)]
            self._reset(upstream, feed.partitions)
            return
        for epoch in committed:
            self._cache_epoch(upstream, feed, epoch)

    def _cache_epoch(self, upstream: str, feed: UpstreamFeed, epoch: Epoch) -> None:
        if epoch.dropped:  # over the feed's budget: not kept, so the cache skips it
            self.cache.skip(upstream, epoch.epoch, epoch.prev_epoch)
        else:
            cached = feed.to_cached(epoch)
            self.largest_epoch_bytes = max(self.largest_epoch_bytes, cached.nbytes)
            self.cache.put(upstream, cached)

    async def _sync_pauses(self, upstream: str) -> None:
        """Pause every partition of ``upstream`` under backpressure, resume them after it.

        A resumed partition is first sought back to just after the last record the feed took
        (:meth:`UpstreamFeed.resume_offsets`): Faust drops what it had fetched for it meanwhile.
        Partitions an epoch ahead of the others are *not* paused (as ChangelogReader does): with Faust
        every pause costs a seek back and a refetch, which cut the worker's throughput several times
        over in ``bench/cache.py``; the aligner buffers what the ahead partitions deliver instead. So a
        worker reading a backlog holds several epochs of the partitions ahead (up to 15 MiB of records, five
        6000-row epochs, in ``bench/cache.py``; counted in its measured batch, see :meth:`batch_bytes`).
        Pausing them only once a feed held more than its epoch budget cut that to 8.8 MiB (bench peak
        growth +75 instead of +82 MiB), but the pause/seek/refetch churn made the RSS drift 11-14 MiB
        over 90000 rows in the I4 test (0-5 MiB without), so it is not done.
        """
        feed = self.feeds.get(upstream)
        if feed is None:
            return
        wanted = set(feed.partitions) if self.stats[upstream].paused else set()
        current = self._paused.get(upstream, set())
        if wanted == current:
            return
        topic = self.settings.changelog_topic(upstream)
        if pause := wanted - current:
            self.app.consumer.pause_partitions({TP(topic, p) for p in pause})
        if resume := current - wanted:
            for partition, offset in feed.resume_offsets(resume).items():
                await self.app.consumer.seek(TP(topic, partition), offset)
            self.app.consumer.resume_partitions({TP(topic, p) for p in resume})
        self._paused[upstream] = wanted

    def _reset(self, upstream: str, partitions: set[int] | list[int]) -> UpstreamFeed:
        """A new feed (and an empty cache) for ``upstream`` over ``partitions``."""
        self.cache.reset(upstream)
        feed = UpstreamFeed(self.entries[upstream], partitions,
                            max_epoch_bytes=min(self.settings.cache_max_epoch_bytes, self.settings.cache_max_bytes))
        self.feeds[upstream] = feed
        return feed

    def _held_partitions(self, upstream: str) -> set[int]:
        topic = self.settings.changelog_topic(upstream)
        return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == topic}

    async def _on_assigned(self, app: Any, /, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        """A rebalance (signal ``on_partitions_assigned(app, assigned)``): every feed and its cache
        restart, since Faust seeks the partitions back to the group's committed offsets (records
        already aligned would come again)."""
        assigned: set[TP] = args[0] if args else kwargs.get("assigned", set())
        held: dict[str, set[int]] = {}
        for tp in assigned:
            if tp.topic in self._topics:
                held.setdefault(self._topics[tp.topic], set()).add(tp.partition)
        for upstream in self.entries:
            self.feeds.pop(upstream, None)
            self.cache.reset(upstream)
            if held.get(upstream):
                self._reset(upstream, held[upstream])
        released = {u: [p for p in ps if p not in held.get(u, set())] for u, ps in self._claimed.items()}
        await asyncio.to_thread(self.registry.release, self.worker_id, self.url, released)
        self._claimed = {}
        self._paused = {}  # Faust pauses every partition during a rebalance and resumes them after it
        await self._heartbeat()  # claim the new partitions now, not one heartbeat later

    # --- timers -----------------------------------------------------------------------------------

    async def _confirm_held_epochs(self) -> None:
        """Release a complete epoch as soon as the epoch index has it, without waiting for the next."""
        for upstream, feed in list(self.feeds.items()):
            held = feed.held()
            if held is None:
                continue
            epoch, partition = held
            entry = await asyncio.to_thread(self.index.at, upstream, partition, epoch)
            if entry is not None and self.feeds.get(upstream) is feed:
                for committed in feed.confirm(epoch, partition, entry.offset):
                    self._cache_epoch(upstream, feed, committed)

    async def _apply_backpressure(self) -> None:
        for upstream in list(self.feeds):
            blocking = await asyncio.to_thread(self.backpressure.blocking, upstream)
            stats = self.stats[upstream]
            if bool(blocking) != stats.paused:
                if blocking:
                    log.info("%s: pausing, %s", upstream,
                             ", ".join(f"{b.downstream} lags {b.lag}/{b.limit}" for b in blocking))
                else:
                    log.info("%s: resuming", upstream)
                stats.paused = bool(blocking)
            await self._sync_pauses(upstream)

    async def _commit_positions(self) -> None:
        """Commit, for the consumer group, where each feed got to.

        Faust's own acks are off for changelog topics: its list of acked offsets only shrinks up to the
        first gap, and a transactional topic has a gap (the commit marker) after every epoch, so the
        list grew with every record (I4). A worker that takes over a partition starts after the last
        record taken, mid-epoch at worst, and its feed skips to the next barrier.
        """
        offsets = {TP(self.settings.changelog_topic(upstream), partition): offset
                   for upstream, feed in list(self.feeds.items())
                   for partition, offset in feed.resume_offsets(feed.partitions).items()}
        held = self.app.consumer.assignment()
        offsets = {tp: offset for tp, offset in offsets.items() if tp in held}
        if offsets and offsets != self._committed:
            consumer: Any = self.app.consumer  # the driver's commit of given offsets; commit() takes acked ones
            await consumer._commit(offsets)
            self._committed = offsets

    async def _heartbeat(self) -> None:
        held = {u: f.partitions for u, f in self.feeds.items()}
        ttl_ms = self.settings.cache_heartbeat_ms * HEARTBEATS_TO_EXPIRE
        await asyncio.to_thread(self.registry.heartbeat, self.worker_id, self.url, os.getpid(), held, ttl_ms)
        self._claimed = held

    # --- serving ----------------------------------------------------------------------------------

    def _serve(self, view: View, request: Request, upstream: str, partition: int) -> Response:
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
            return view.bytes(serve_range(found.epochs, partition, self._schemas[upstream]),
                              content_type=ARROW_STREAM)
        if found.status is RangeStatus.EVICTED:
            stats.evicted_replies += 1
            return view.json(detail, status=410)
        stats.not_yet_replies += 1
        return view.json(detail, status=425)

    def batch_bytes(self) -> int:
        """I4's "one batch" of this worker, from what it measured so far: what it holds besides the cache.

        * the records in flight: one fetch (:data:`FETCH_BYTES`);
        * the records held while aligning (:attr:`UpstreamFeed.peak_held_bytes`: the open epochs'
          records and their objects, at most ``cache_max_epoch_bytes`` of records per epoch), over all
          upstreams, as if each peaked at once;
        * the largest epoch while it is built (its changes decoded into the builders' columns, then its
          Arrow batches), next to a full cache until its put evicts: counted twice its Arrow bytes.
        """
        held = sum(feed.peak_held_bytes for feed in self.feeds.values())
        return FETCH_BYTES + held + 2 * self.largest_epoch_bytes

    def describe(self) -> dict[str, Any]:
        upstreams = {}
        for name, stats in self.stats.items():
            feed = self.feeds.get(name)
            upstreams[name] = {
                "partitions": feed.partitions if feed else [], "records_fetched": feed.records if feed else 0,
                "epochs_cached": self.cache.epoch_count(name), "floor": self.cache.floor(name),
                "tail": self.cache.tail(name), "served_epochs": stats.served_epochs,
                "evicted_replies": stats.evicted_replies, "not_yet_replies": stats.not_yet_replies,
                "paused": stats.paused, "errors": stats.errors,
                "aligning_changes": feed.aligner.buffered_changes() if feed and feed.aligner else 0,
                "held_bytes": feed.held_bytes if feed else 0,
                "peak_held_bytes": feed.peak_held_bytes if feed else 0}
        return {"worker_id": self.worker_id, "url": self.url, "pid": os.getpid(),
                "cache_bytes": self.cache.nbytes, "cache_max_bytes": self.cache.max_bytes,
                "arrow_allocated_bytes": pa.total_allocated_bytes(), "fetch_bytes": FETCH_BYTES,
                "largest_epoch_bytes": self.largest_epoch_bytes, "batch_bytes": self.batch_bytes(),
                "arrow_memory_pool": pa.default_memory_pool().backend_name,
                "evicted_epochs": self.cache.evicted_epochs,
                "peak_rss_kib": peak_rss_kib(), "rss_kib": rss_kib(), "upstreams": upstreams}

    # --- running ----------------------------------------------------------------------------------

    def run(self, loglevel: str = "warning") -> None:
        """Run until SIGINT/SIGTERM (Faust's worker: consumer, agents, timers, web server)."""
        use_returning_memory_pool()
        Path(self.app.conf.datadir).parent.mkdir(parents=True, exist_ok=True)
        worker = faust.Worker(self.app, loglevel=loglevel, quiet=True)
        try:
            worker.execute_from_commandline()
        finally:
            self.registry.release(self.worker_id, self.url, self._claimed)
            self.registry.retire(self.worker_id)
