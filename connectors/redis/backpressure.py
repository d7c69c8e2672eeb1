"""Backpressure: how far each downstream that opted in (``max_epoch_lag``) lags behind an upstream.

A downstream's lag is the number of the upstream's committed epochs above the downstream's MCE
(:meth:`EpochIndex.count_after`). When it reaches the downstream's ``max_epoch_lag``, the upstream must
not open another epoch: table writers wait, and the log-cache worker pauses the upstream's consumer.
Both ask this module, which reads only Redis (catalog, MCEs, epoch index), so they resume by themselves
as soon as the downstream commits, whether or not a worker runs. Downstreams without the setting never
hold an upstream back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_meta import ViewMeta

MAX_EPOCH_LAG = "max_epoch_lag"  # the catalog option (see mvlog.services.view_ddl.VIEW_OPTIONS)


@dataclass(frozen=True)
class DownstreamLag:
    downstream: str
    lag: int  # upstream epochs above the downstream's MCE
    limit: int  # its max_epoch_lag

    @property
    def reached(self) -> bool:
        return self.lag >= self.limit


class Backpressure:
    """Lag of the opted-in downstreams of any upstream; the catalog is re-read every ``refresh_s``."""

    def __init__(self, settings: Settings, client: redis.Redis, refresh_s: float = 1.0) -> None:
        self._catalog = CatalogStore(settings, client)
        self._store = ViewMeta(client, settings.topic_prefix)
        self._refresh_s = refresh_s
        self._entries: list[CatalogEntry] = []
        self._read_at = float("-inf")

    def _limited_downstreams(self, upstream: str) -> list[tuple[str, int]]:
        if time.monotonic() - self._read_at >= self._refresh_s:
            self._entries = self._catalog.all()
            self._read_at = time.monotonic()
        return [(e.name, int(e.options[MAX_EPOCH_LAG])) for e in self._entries
                if upstream in e.sources and MAX_EPOCH_LAG in e.options]

    def lags(self, upstream: str) -> list[DownstreamLag]:
        limited = self._limited_downstreams(upstream)
        if not limited:
            return []
        mces = self._store.mce_many([name for name, _ in limited])
        return [DownstreamLag(name, self._store.index.count_after(upstream, mces.get(name)), limit)
                for name, limit in limited]

    def blocking(self, upstream: str) -> list[DownstreamLag]:
        """The downstreams whose lag reached their ``max_epoch_lag``: ``upstream`` must wait for them."""
        return [lag for lag in self.lags(upstream) if lag.reached]
