"""Reads the status of every table and view from Redis: catalog, lifecycle, MCE, lag and the optional
records other services publish.

Optional keys (absent: the field shows "-"), written by the services that own them:

* ``<prefix>:{<view>}:backfill`` hash: ``rows_done``, ``rows_total`` (estimate), ``rate`` (rows/s),
  ``vnodes_done`` (written by the backfill of a view created online).
* ``<prefix>:cache:<upstream>`` hash: ``bytes``, ``max_bytes``, ``epochs``, ``max_epochs`` (the
  log-cache worker's occupancy for that upstream) and ``held_for``: comma-separated views for which
  the cache holds the upstream back (backpressure: ``max_epoch_lag`` reached).
* ``<prefix>:{<view>}:replacement`` hash: a staged replacement (``state`` and whatever else it reports).

``max_epoch_lag`` itself comes from the view's catalog options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import redis

from mvlog.catalog import CatalogEntry
from mvlog.connectors.redis.view_keyspace import ViewKeyspace
from mvlog.lag import LagSample
from mvlog.lag_status import Verdict
from mvlog.view_status import BackfillProgress, Backpressure, CacheOccupancy, ViewStatus


def text_fields(raw: object) -> dict[str, str]:
    """A hash's text fields. Binary ones (a chunked backfill's positions: encoded keys) are no status and
    are left out: decoding them as text failed the status, the dashboard and /metrics."""
    fields: dict[str, str] = {}
    for key, value in cast(dict[bytes, bytes], raw).items():
        try:
            fields[key.decode()] = value.decode()
        except UnicodeDecodeError:
            continue
    return fields


def cache_key(prefix: str, upstream: str) -> str:
    return f"{prefix}:cache:{upstream}"


def read_statuses(client: redis.Redis, prefix: str, entries: list[CatalogEntry],
                  lag: Mapping[str, tuple[LagSample, Verdict | None]]) -> list[ViewStatus]:
    """One status per catalog entry, in catalog order; ``lag`` gives each view's sample and verdict."""
    upstreams = sorted({s for e in entries for s in e.sources})
    store = ViewKeyspace(client, prefix)
    pipe = client.pipeline(transaction=False)
    for entry in entries:
        pipe.hgetall(store.key(entry.name, "meta"))
        pipe.hlen(store.key(entry.name, "rows"))
        pipe.hgetall(store.key(entry.name, "backfill"))
        pipe.hgetall(store.key(entry.name, "replacement"))
    for upstream in upstreams:
        pipe.hgetall(cache_key(prefix, upstream))
    replies = pipe.execute()
    caches = {u: text_fields(r) for u, r in zip(upstreams, replies[4 * len(entries):], strict=True)}
    statuses = []
    for i, entry in enumerate(entries):
        meta, rows, backfill, replacement = replies[4 * i: 4 * i + 4]
        meta, backfill, replacement = text_fields(meta), text_fields(backfill), text_fields(replacement)
        sample, verdict = lag.get(entry.name, (None, None))
        occupancy = {u: c for u in entry.sources
                     if (c := CacheOccupancy.from_fields(caches.get(u, {}))) is not None}
        statuses.append(ViewStatus(
            name=entry.name, kind=entry.kind, sources=entry.sources, state=meta.get("state"),
            reason=meta.get("reason") or None, mce=int(meta["mce"]) if meta.get("mce") else None,
            mce_committed_ts_ms=int(meta["mce_ts_ms"]) if meta.get("mce_ts_ms") else None, rows=int(rows),
            lag=sample, verdict=verdict, backfill=BackfillProgress.from_fields(backfill), cache=occupancy,
            backpressure=_backpressure(entry, caches), replacement=replacement or None))
    return statuses


def _backpressure(entry: CatalogEntry, caches: Mapping[str, Mapping[str, str]]) -> Backpressure | None:
    if entry.kind != "view":
        return None
    bound = entry.options.get("max_epoch_lag")
    reported = [c for u in entry.sources if "held_for" in (c := caches.get(u, {}))]
    holding = any(entry.name in c["held_for"].split(",") for c in reported) if reported else None
    if bound is None and holding is None:
        return None
    return Backpressure(int(bound) if bound else None, holding)
