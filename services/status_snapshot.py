"""One consistent picture of the whole pipeline, as ``mvlog status``, the dashboard and ``/metrics`` show it.

Lag comes from the sampler's newest samples in Redis when they are fresh (the sampler judged them over
its window). When no sampler runs, lag is measured on the spot and the status is "unknown" (a status
needs a window of samples): ``mvlog status --watch`` keeps its own window instead.

A source table's lag behind its topic (:mod:`mvlog.source_lag`) follows the same rule: the sampler's
when fresh, else measured on the spot from Kafka (only when there are source tables, so a pipeline
without any never waits on the broker here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.lag_store import LagStore
from mvlog.connectors.redis.pipeline_status import read_statuses
from mvlog.connectors.redis.source_status import SourceLagProbe, SourceStatusStore, measure_quietly
from mvlog.lag import LagSample
from mvlog.lag_status import LagStatus, Verdict
from mvlog.services.lag_sampler import LagMonitor
from mvlog.source_lag import SourceLag, SourceState
from mvlog.view_status import ViewStatus

NO_SAMPLER = Verdict(LagStatus.UNKNOWN, "no lag sampler running (mvlog dashboard, mvlog lag-sampler, or --watch)")


@dataclass(frozen=True)
class PipelineSnapshot:
    ts_ms: int
    prefix: str
    sampler: str | None  # who samples lag: the lease holder, None when nobody does
    views: list[ViewStatus]

    def to_json(self) -> dict[str, Any]:
        return {"ts_ms": self.ts_ms, "prefix": self.prefix, "sampler": self.sampler,
                "views": [v.to_json() for v in self.views],
                "edges": [[source, v.name] for v in self.views for source in v.sources]}


def in_graph_order(entries: list[CatalogEntry]) -> list[CatalogEntry]:
    """Tables first, then each view after everything it reads (by depth in the graph, then by name)."""
    by_name = {e.name: e for e in entries}
    depth: dict[str, int] = {}

    def depth_of(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name not in depth:
            entry = by_name.get(name)
            if entry is None or not entry.sources or name in seen:
                return 0
            depth[name] = 1 + max(depth_of(s, seen | {name}) for s in entry.sources)
        return depth[name]

    return sorted(entries, key=lambda e: (depth_of(e.name), e.name))


def take_snapshot(settings: Settings, client: redis.Redis, monitor: LagMonitor | None = None) -> PipelineSnapshot:
    """Every table and view with its status; ``monitor``: judge lag over this caller's own window."""
    now_ms = time.time_ns() // 1_000_000
    entries = in_graph_order(CatalogStore(settings, client).all())
    store = LagStore(client, settings.topic_prefix, settings.lag_history)
    lag: dict[str, tuple[LagSample, Verdict | None]] = {}
    if monitor is not None:
        lag = {sample.view: (sample, verdict) for sample, verdict in monitor.sample(now_ms)}
    else:
        stale_ms = now_ms - 3 * settings.lag_sample_interval_ms - 1000
        lag = {view: (sample, verdict) for view, (sample, verdict) in store.current().items()
               if sample.ts_ms >= stale_ms}
        missing = [e for e in entries if e.kind == "view" and e.name not in lag]
        if missing:
            known = {e.name: e for e in entries}
            measured = store.measure([*missing, *(known[s] for e in missing for s in e.sources if s in known)],
                                     now_ms)
            lag.update({s.view: (s, NO_SAMPLER) for s in measured if s.view in {e.name for e in missing}})
    statuses = read_statuses(client, settings.topic_prefix, entries, lag)
    sources = SourceStatusStore(client, settings.topic_prefix).read(settings, entries)
    if sources:
        sources = _with_source_lag(settings, entries, sources, monitor, now_ms)
        statuses = [replace(v, source=sources[v.name]) if v.name in sources else v for v in statuses]
    return PipelineSnapshot(now_ms, settings.topic_prefix, store.lease_holder(), statuses)


def _with_source_lag(settings: Settings, entries: list[CatalogEntry], sources: dict[str, SourceState],
                     monitor: LagMonitor | None, now_ms: int) -> dict[str, SourceState]:
    """Each source's lag: measured by ``monitor`` (--watch), else the sampler's when fresh, else now."""
    if monitor is not None:
        measured: dict[str, SourceLag] = {lag.table: lag for lag in monitor.sample_sources(now_ms)}
    else:
        stale_ms = now_ms - 3 * settings.lag_sample_interval_ms - 1000
        measured = {name: s.lag for name, s in sources.items() if s.lag is not None and s.lag.ts_ms >= stale_ms}
        missing = [e for e in entries if e.name in sources and e.name not in measured]
        if missing:
            probe = SourceLagProbe(settings, timeout=3.0)
            try:
                measured.update((lag.table, lag) for lag in measure_quietly(probe, missing, now_ms))
            finally:
                probe.close()
    return {name: state.with_lag(measured.get(name, state.lag)) for name, state in sources.items()}
