"""Samples every view's lag into Redis, for the dashboard, ``mvlog status`` and ``/metrics``.

Who runs it: ``mvlog dashboard`` runs a sampler thread in its own process (the default), and
``mvlog lag-sampler`` runs one alone (for a deployment where the dashboard is not always open). Only
one process samples at a time: each tick renews a lease in Redis (``<prefix>:lag:sampler``, three
intervals long) and a process without it only reads, so starting a second dashboard is harmless and a
dead sampler is replaced within three intervals.

The status rules (:mod:`mvlog.lag_status`) judge a sliding window of the last ``lag_window`` samples,
kept in memory and preloaded from the history in Redis, so a restarted sampler judges at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque

import redis

from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.lag_store import LagStore
from mvlog.connectors.redis.source_status import SourceLagProbe, SourceStatusStore, measure_quietly
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.lag import LagSample
from mvlog.lag_status import Verdict, evaluate
from mvlog.source_lag import SourceLag

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LagMonitor:
    """Measures every view's lag and judges it over a sliding window of samples kept in memory."""

    def __init__(self, settings: Settings, client: redis.Redis, window: int | None = None) -> None:
        self.settings = settings
        self.window = window or settings.lag_window
        self.store = LagStore(client, settings.topic_prefix, settings.lag_history)
        self.catalog = CatalogStore(settings, client)
        self.views = ViewStore(client, settings.topic_prefix)
        self._windows: dict[str, deque[LagSample]] = {}
        self._probe: SourceLagProbe | None = None

    def preload(self) -> None:
        """Start each view's window from its recorded history (recent samples only)."""
        names = [e.name for e in self.catalog.all() if e.kind == "view"]
        oldest_ms = _now_ms() - 2 * self.window * self.settings.lag_sample_interval_ms
        for view, samples in self.store.histories(names, self.window).items():
            self._windows[view] = deque((s for s in samples if s.ts_ms >= oldest_ms), maxlen=self.window)

    def sample(self, now_ms: int | None = None) -> list[tuple[LagSample, Verdict]]:
        entries = self.catalog.all()
        samples = self.store.measure(entries, now_ms if now_ms is not None else _now_ms())
        judged = []
        for sample in samples:
            window = self._windows.setdefault(sample.view, deque(maxlen=self.window))
            window.append(sample)
            meta = self.views.meta(sample.view)
            judged.append((sample, evaluate(list(window), meta.get("state"), meta.get("reason", ""))))
        for gone in set(self._windows) - {s.view for s in samples}:
            del self._windows[gone]
        return judged

    def sample_sources(self, now_ms: int | None = None) -> list[SourceLag]:
        """The lag of every source table behind its topic, from Kafka (:mod:`mvlog.source_lag`); nothing
        when there is no source table or Kafka does not answer in time."""
        entries = [e for e in self.catalog.all() if e.kind == "table" and "source.topic" in e.options]
        if not entries:
            return []
        if self._probe is None:
            self._probe = SourceLagProbe(self.settings, timeout=3.0)
        return measure_quietly(self._probe, entries, now_ms if now_ms is not None else _now_ms())

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


class LagSampler:
    """Every ``lag_sample_interval_ms``, records every view's lag and status in Redis (while leased)."""

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.client = client or redis_client.connect(settings)
        self.monitor = LagMonitor(settings, self.client)
        self.interval_s = settings.lag_sample_interval_ms / 1000
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.leader = False
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool:
        """Sample once if this process holds (or takes) the lease; True when it sampled."""
        ttl_ms = max(1000, 3 * self.settings.lag_sample_interval_ms)
        leader = self.monitor.store.hold_lease(self.owner, ttl_ms)
        if leader and not self.leader:
            self.monitor.preload()
        self.leader = leader
        if not leader:
            return False
        measured = self.monitor.sample()
        store = self.monitor.store
        store.record(measured)
        if gone := sorted(set(store.current_views()) - {sample.view for sample, _ in measured}):
            store.forget(gone)  # dropped views
        SourceStatusStore(self.client, self.settings.topic_prefix).record_lag(self.monitor.sample_sources())
        self.ticks += 1
        return True

    def run(self) -> None:
        """Sample until :meth:`stop`; Redis errors are logged and retried at the next tick."""
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except redis.RedisError as error:
                log.warning("lag sampler: %s", error)
            next_tick = max(next_tick + self.interval_s, time.monotonic())
            self._stop.wait(next_tick - time.monotonic())

    def start(self) -> LagSampler:
        self._thread = threading.Thread(target=self.run, name="mvlog-lag-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with contextlib.suppress(redis.RedisError):
            self.monitor.store.release_lease(self.owner)
        self.monitor.close()
