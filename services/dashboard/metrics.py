"""Prometheus metrics of every view, computed from one pipeline snapshot per scrape.

Names follow Prometheus conventions (``mvlog_`` namespace, base units, ``_total`` only on counters,
enumerations as one gauge per value with a label set to 1 for the current one). Lag is labelled by
``view`` and ``upstream`` (a join has two upstreams); the MCE is an epoch number (int64 as a float:
exact up to 2**53, so the timestamp gauge is the one to alert on). A source table's lag behind its
topic is ``mvlog_source_lag_records`` / ``mvlog_source_lag_seconds`` (labels ``table``, ``topic``), its bad
records ``mvlog_source_dead_letters_total`` (committed with the epochs that skipped them), and
``mvlog_source_problem`` is 1 while its ingester is stopped by a problem (topic gone, offsets deleted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mvlog.epoch import epoch_millis
from mvlog.lag_status import LagStatus
from mvlog.services.status_snapshot import PipelineSnapshot

LIFECYCLE_STATES = ("creating", "backfilling", "replaying", "live", "paused", "failed")


class PipelineCollector(Collector):
    """Collects the snapshot that ``snapshot()`` returns at scrape time."""

    def __init__(self, snapshot: Callable[[], PipelineSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self._snapshot()
        view_labels = ["view"]
        lag_labels = ["view", "upstream"]
        epoch_lag = GaugeMetricFamily("mvlog_view_epoch_lag", "Upstream epochs committed above the view's MCE.",
                                      labels=lag_labels)
        lag_seconds = GaugeMetricFamily("mvlog_view_lag_seconds",
                                        "Time between the upstream's MCE and the view's MCE.", labels=lag_labels)
        lag_records = GaugeMetricFamily("mvlog_view_lag_records",
                                        "Upstream change records in the epochs above the view's MCE.",
                                        labels=lag_labels)
        mce = GaugeMetricFamily("mvlog_view_max_committed_epoch", "The view's max committed epoch (MCE).",
                                labels=view_labels)
        mce_ts = GaugeMetricFamily("mvlog_view_max_committed_epoch_timestamp_seconds",
                                   "When the view's MCE was opened (Unix time).", labels=view_labels)
        committed_ts = GaugeMetricFamily("mvlog_view_last_commit_timestamp_seconds",
                                         "When the view last committed an epoch (Unix time).", labels=view_labels)
        rows = GaugeMetricFamily("mvlog_view_rows", "Rows in the view's serving state.", labels=view_labels)
        state = GaugeMetricFamily("mvlog_view_state", "Lifecycle state: 1 for the current one.",
                                  labels=["view", "state"])
        status = GaugeMetricFamily("mvlog_view_status",
                                   "Health from the lag window (ok, lagging, stalled, stopped, unknown): 1 for "
                                   "the current one.", labels=["view", "status"])
        sample_ts = GaugeMetricFamily("mvlog_view_lag_sample_timestamp_seconds",
                                      "When the view's lag was last measured (Unix time).", labels=view_labels)
        bf_done = GaugeMetricFamily("mvlog_view_backfill_rows", "Rows backfilled so far.", labels=view_labels)
        bf_total = GaugeMetricFamily("mvlog_view_backfill_rows_estimated", "Estimated rows to backfill.",
                                     labels=view_labels)
        bf_eta = GaugeMetricFamily("mvlog_view_backfill_eta_seconds", "Estimated time left in the backfill.",
                                   labels=view_labels)
        bp_bound = GaugeMetricFamily("mvlog_view_max_epoch_lag", "Backpressure bound (max_epoch_lag) of the view.",
                                     labels=view_labels)
        bp_holding = GaugeMetricFamily("mvlog_view_backpressure_holding",
                                       "1 while the log cache holds an upstream back for the view.",
                                       labels=view_labels)
        cache_bytes = GaugeMetricFamily("mvlog_cache_bytes", "Bytes in the log cache of an upstream.",
                                        labels=["upstream"])
        cache_max = GaugeMetricFamily("mvlog_cache_max_bytes", "Byte bound of the log cache of an upstream.",
                                      labels=["upstream"])
        cache_epochs = GaugeMetricFamily("mvlog_cache_epochs", "Epochs in the log cache of an upstream.",
                                         labels=["upstream"])
        source_records = GaugeMetricFamily("mvlog_source_lag_records",
                                           "Messages of the source topic the table has not ingested (end offsets "
                                           "minus the offsets its epochs committed).", labels=["table", "topic"])
        source_seconds = GaugeMetricFamily("mvlog_source_lag_seconds",
                                           "Age of the oldest message of the source topic the table has not "
                                           "ingested (0 when caught up).", labels=["table", "topic"])
        source_dead = CounterMetricFamily("mvlog_source_dead_letters",
                                          "Bad records of the source topic sent to the table's dead-letter topic.",
                                          labels=["table", "topic"])
        source_problem = GaugeMetricFamily("mvlog_source_problem",
                                           "1 while the source cannot be ingested (topic gone, offsets deleted by "
                                           "retention, ...): see mvlog status.", labels=["table", "topic"])
        caches: dict[str, tuple[float, float | None, float | None]] = {}
        for v in snap.views:
            if v.source is not None:
                labels = [v.name, v.source.topic]
                source_dead.add_metric(labels, float(v.source.dead_letters))
                source_problem.add_metric(labels, 1.0 if v.source.problems else 0.0)
                if v.source.lag is not None:
                    source_records.add_metric(labels, float(v.source.lag.records))
                    if v.source.lag.seconds is not None:
                        source_seconds.add_metric(labels, v.source.lag.seconds)
            if v.mce is not None:
                mce.add_metric([v.name], float(v.mce))
                mce_ts.add_metric([v.name], epoch_millis(v.mce) / 1000)
            if v.mce_committed_ts_ms is not None:
                committed_ts.add_metric([v.name], v.mce_committed_ts_ms / 1000)
            rows.add_metric([v.name], float(v.rows))
            for name in LIFECYCLE_STATES:
                state.add_metric([v.name, name], 1.0 if v.state == name else 0.0)
            if v.lag is not None:
                sample_ts.add_metric([v.name], v.lag.ts_ms / 1000)
                for up in v.lag.upstreams:
                    epoch_lag.add_metric([v.name, up.upstream], float(up.epochs))
                    lag_records.add_metric([v.name, up.upstream], float(up.records))
                    if up.seconds is not None:
                        lag_seconds.add_metric([v.name, up.upstream], up.seconds)
            if v.verdict is not None:
                for s in LagStatus:
                    status.add_metric([v.name, s.value], 1.0 if v.verdict.status == s else 0.0)
            if v.backfill is not None:
                bf_done.add_metric([v.name], v.backfill.rows_done)
                if v.backfill.rows_total is not None:
                    bf_total.add_metric([v.name], v.backfill.rows_total)
                if v.backfill.eta_seconds is not None:
                    bf_eta.add_metric([v.name], v.backfill.eta_seconds)
            if v.backpressure is not None:
                if v.backpressure.max_epoch_lag is not None:
                    bp_bound.add_metric([v.name], float(v.backpressure.max_epoch_lag))
                if v.backpressure.holding is not None:
                    bp_holding.add_metric([v.name], 1.0 if v.backpressure.holding else 0.0)
            for upstream, cache in v.cache.items():
                caches[upstream] = (cache.bytes, cache.max_bytes, cache.epochs)
        for upstream, (used, bound, epochs) in sorted(caches.items()):
            cache_bytes.add_metric([upstream], used)
            if bound is not None:
                cache_max.add_metric([upstream], bound)
            if epochs is not None:
                cache_epochs.add_metric([upstream], epochs)
        yield from (epoch_lag, lag_seconds, lag_records, mce, mce_ts, committed_ts, rows, state, status,
                    sample_ts, bf_done, bf_total, bf_eta, bp_bound, bp_holding, cache_bytes, cache_max,
                    cache_epochs, source_records, source_seconds, source_dead, source_problem)


def pipeline_registry(snapshot: Callable[[], PipelineSnapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(snapshot))
    return registry
