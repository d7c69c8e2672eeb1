"""The Faust log-cache worker app: one fetch stream per upstream, a bounded cache, an Arrow IPC server.

* **Fetching.** One Faust agent per upstream changelog topic (the upstreams that views read, from the
  catalog), so the upstream is fetched from Kafka once per worker however many views read it. Several
  workers with the same app id share the partitions through Faust's group assignment.
* **Consuming.** Faust's consumer (aiokafka) only takes part in the group: it holds the assignment and
  commits the positions, with every assigned partition paused in aiokafka so it fetches nothing. The
  records come through a confluent-kafka consumer per upstream, ``assign()``-ed to the partitions Faust
  assigned (from the group's committed offsets) and driven by the upstream's agent in a thread of its
  own: measured on a backlog of 100k changes, the worker fed by Faust's stream aligned 5.2k changes/s,
  and py-spy put half its time in Faust's per-message path (fetcher, conductor, stream, agent) and 6 %
  in the feed. It reads ``read_uncommitted`` (so an epoch is decoded while its writer still writes it):
  the commit rule is what keeps the cache exact, as it does on Tansu, which delivers aborted records to
  ``read_committed`` readers anyway.
* **Alignment.** Each consume batch goes to the upstream's :class:`UpstreamFeed` (compiled decoding of
  runs straight into Arrow IPC messages, barriers aligned across the partitions this worker holds,
  commit rule); every committed epoch goes into the :class:`LogCache`.
* **Serving.** ``GET /epochs/<upstream>/<partition>/?after=A&upto=U`` answers an Arrow IPC stream of
  the partition's epochs in ``(A, U]``, streamed from the cached messages themselves, or 410 (evicted),
  425 (not aligned yet) or 404 (not held); ``GET /stats/`` is JSON (:mod:`~mvlog.services.log_cache.serving`).
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust
import pyarrow as pa
from faust.types import TP

from mvlog.barrier_alignment import AlignmentError
from mvlog.catalog import CatalogEntry
from mvlog.changes import Epoch
from mvlog.config import Settings
from mvlog.connectors.kafka.kafka_security import faust_broker_credentials
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.backpressure import Backpressure
from mvlog.connectors.redis.cache_registry import HEARTBEATS_TO_EXPIRE, CacheRegistry
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.spark.change_rows import arrow_schema
from mvlog.log_cache import CacheError, LogCache
from mvlog.process_memory import peak_rss_kib, rss_kib
from mvlog.schemas.codec import DecodeError
from mvlog.services.log_cache.feed import FeedError, IpcParts, KafkaMessage, UpstreamFeed
from mvlog.services.log_cache.serving import CacheServer, UpstreamStats
from mvlog.services.log_cache.transport import FETCH_BYTES, CacheApp, UpstreamConsumer, use_returning_memory_pool

log = logging.getLogger(__name__)

CONFIRM_INTERVAL_S = 0.05  # how often held epochs are checked against the epoch index
BACKPRESSURE_INTERVAL_S = 0.1
COMMIT_INTERVAL_S = 1.0  # how often the feeds' positions are committed for the consumer group
DECODED_PER_ARROW_BYTE = 4  # a consume batch's decoded objects (transient) against the Arrow bytes it makes


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
        self._schema_messages = {name: arrow_schema(e.schema).serialize() for name, e in self.entries.items()}
        self.cache: LogCache[IpcParts] = LogCache(settings.cache_max_bytes, settings.cache_max_epochs)
        self.feeds: dict[str, UpstreamFeed] = {}
        self.stats = {name: UpstreamStats() for name in self.entries}
        self.index = EpochIndex(self._redis, settings.topic_prefix)
        self.registry = CacheRegistry(self._redis, settings.topic_prefix)
        self.backpressure = Backpressure(settings, redis_client.connect(settings))
        self._claimed: dict[str, list[int]] = {}
        self._paused: dict[str, set[int]] = {}  # upstream -> partitions paused on its consumer
        self._consumers: dict[str, UpstreamConsumer] = {}
        self._committed: dict[TP, int] = {}  # the positions last committed for the consumer group
        self.largest_epoch_bytes = 0  # the largest epoch put in the cache (Arrow bytes)
        self.server = CacheServer(self.cache, self.feeds, self.stats, self._schema_messages)
        self.app = self._build_app()

    # --- the Faust app ----------------------------------------------------------------------------

    def _build_app(self) -> faust.App:
        settings = self.settings
        app = CacheApp(
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
        self.server.add_pages(app, self.describe)
        return app

    def _agent_for(self, upstream: str) -> Any:
        """The upstream's agent: it runs the upstream's fetch loop; its Faust stream only keeps the topic
        subscribed (so Faust assigns its partitions) and receives nothing (paused in aiokafka)."""
        async def fetch(stream: Any) -> None:
            fetching = asyncio.ensure_future(self._fetch_loop(upstream))
            try:
                async for _event in stream.events():
                    pass
            finally:
                fetching.cancel()
        fetch.__name__ = f"cache_{upstream}"
        return fetch

    async def _fetch_loop(self, upstream: str) -> None:
        """Consume the upstream's held partitions in batches and feed them, for as long as the worker runs.

        The consumer follows the feed: when the feed's partitions change (a rebalance), it is assigned them
        from the group's committed offsets; batches consumed for a feed that was replaced meanwhile are
        dropped (the new feed starts at its partitions' next barrier)."""
        consumer = UpstreamConsumer(self.settings, self.app.conf.id, self.settings.changelog_topic(upstream))
        self._consumers[upstream] = consumer
        try:
            while True:
                try:
                    await self._fetch_once(upstream, consumer)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a consumer error: the loop and the worker go on
                    log.exception("%s: fetching failed; retrying in 1 s", upstream)
                    self.stats[upstream].errors = [*self.stats[upstream].errors[-9:], repr(exc)]
                    await asyncio.sleep(1.0)
        finally:
            self._consumers.pop(upstream, None)
            consumer.close()

    async def _fetch_once(self, upstream: str, consumer: UpstreamConsumer) -> None:
        feed = self.feeds.get(upstream)
        if feed is None:
            await consumer.call(consumer.assign, [])
            await asyncio.sleep(0.05)
            return
        if consumer.assigned != feed.partitions:
            await consumer.call(consumer.assign, feed.partitions)
            self._paused[upstream] = set()
            return
        messages = await consumer.call(consumer.consume)
        if messages and self.feeds.get(upstream) is feed:
            self._take(upstream, feed, messages)

    def _take(self, upstream: str, feed: UpstreamFeed, messages: Sequence[KafkaMessage]) -> None:
        try:
            committed = feed.take(messages)
        except (FeedError, DecodeError, AlignmentError, CacheError) as exc:
            # Readers of this upstream go to Kafka, where the same record fails with its position.
            log.error("%s: %s; the cache of this upstream restarts", upstream, exc)
            self.stats[upstream].errors = [*self.stats[upstream].errors[-9:], str(exc)]
            self._reset(upstream, feed.partitions)
            return
        for epoch in committed:
            self._cache_epoch(upstream, feed, epoch)

    def _cache_epoch(self, upstream: str, feed: UpstreamFeed, epoch: Epoch) -> None:
        cached = feed.to_cached(epoch)
        if cached is None:  # over the feed's budget: not kept, so the cache skips it
            self.cache.skip(upstream, epoch.epoch, epoch.prev_epoch)
        else:
            self.largest_epoch_bytes = max(self.largest_epoch_bytes, cached.nbytes)
            self.cache.put(upstream, cached)

    async def _sync_pauses(self, upstream: str) -> None:
        """Pause every partition of ``upstream`` under backpressure, resume them after it.

        librdkafka keeps each partition's position across a pause (what it had pre-fetched is dropped and
        fetched again after the resume; the feed skips records it took already). Partitions an epoch
        ahead of the others are *not* paused (as ChangelogReader does): the aligner holds what the ahead
        partitions deliver meanwhile (counted in the worker's measured batch, see :meth:`batch_bytes`).
        """
        feed, consumer = self.feeds.get(upstream), self._consumers.get(upstream)
        if feed is None or consumer is None or consumer.assigned != feed.partitions:
            return
        # Not before the cache holds an epoch: a worker started behind a stalled downstream still aligns
        # the log it finds (what its readers wait for) before it stops the cache's growth.
        paused = self.stats[upstream].paused and self.cache.tail(upstream) is not None
        wanted = set(feed.partitions) if paused else set()
        current = self._paused.get(upstream, set())
        if wanted == current:
            return
        if pause := wanted - current:
            await consumer.call(consumer.pause, sorted(pause))
        if resume := current - wanted:
            await consumer.call(consumer.resume, sorted(resume))
        self._paused[upstream] = wanted

    def _reset(self, upstream: str, partitions: set[int] | list[int]) -> UpstreamFeed:
        """A new feed (and an empty cache) for ``upstream`` over ``partitions``."""
        self.cache.reset(upstream)
        feed = UpstreamFeed(self.entries[upstream], partitions,
                            max_epoch_bytes=min(self.settings.cache_max_epoch_bytes, self.settings.cache_max_bytes),
                            max_record_bytes=self.settings.max_record_bytes)
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

    # --- status -----------------------------------------------------------------------------------

    def batch_bytes(self) -> int:
        """I4's "one batch" of this worker, from what it measured so far: what it holds besides the cache.

        * the records in flight: librdkafka's pre-fetch queue and one fetch per upstream consumer
          (:data:`FETCH_BYTES`);
        * the decoded objects of one consume batch while it becomes Arrow (transient):
          :data:`DECODED_PER_ARROW_BYTE` times the Arrow bytes the largest batch made
          (:attr:`UpstreamFeed.peak_take_bytes`);
        * the IPC messages held while aligning (:attr:`UpstreamFeed.peak_held_bytes`: the open epochs,
          at most ``cache_max_epoch_bytes`` per epoch), over all upstreams, as if each peaked at once;
        * the largest epoch once more: put next to a full cache, before its put evicts the oldest.

        Replies in flight keep the buffers they are writing alive after an eviction (at most the epochs
        of the ranges being served); not counted.
        """
        feeds = list(self.feeds.values())
        held = sum(feed.peak_held_bytes for feed in feeds)
        decoding = DECODED_PER_ARROW_BYTE * max((feed.peak_take_bytes for feed in feeds), default=0)
        return FETCH_BYTES * max(1, len(feeds)) + decoding + held + self.largest_epoch_bytes

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
                "held_bytes": feed.held_bytes if feed else 0,
                "peak_held_bytes": feed.peak_held_bytes if feed else 0,
                "peak_take_bytes": feed.peak_take_bytes if feed else 0}
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
