"""Lag of every view in Redis: measured from MCEs and the epoch index, kept as current value + history.

Keys (all under the topic prefix):

* ``<prefix>:lag`` hash: view -> JSON ``{"sample": LagSample, "verdict": Verdict}``, the newest sample.
* ``<prefix>:{<view>}:lag`` stream: one entry per sample (field ``s``: the sample's JSON), capped at
  ``lag_history`` entries (approximate MAXLEN trimming, so the cap costs nothing per sample).
* ``<prefix>:lag:sampler`` string: the lease of the one process that samples (value: its id, expiring),
  so a dashboard and a ``mvlog lag-sampler`` never both write the history.

Measuring costs per view two small Redis reads per upstream (ZLEXCOUNT, and ZRANGEBYLEX of the epochs
above the view's MCE on each partition for the record count): a view far behind makes the latter grow
with its lag, which is bounded by the log cache's backpressure where it matters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

import redis

from mvlog.catalog import CatalogEntry
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.connectors.redis.view_meta import ViewMeta
from mvlog.lag import LagSample, measure
from mvlog.lag_status import LagStatus, Verdict

_RENEW_SCRIPT = lua_script("lag_sampler_renew")
_RELEASE_SCRIPT = lua_script("lag_sampler_release")


class LagStore:
    def __init__(self, client: redis.Redis, prefix: str, history: int = 3600) -> None:
        self.redis = client
        self.prefix = prefix
        self.history_length = history
        self.views = ViewMeta(client, prefix)
        self.index = EpochIndex(client, prefix)
        self.current_key = f"{prefix}:lag"
        self.lease_key = f"{prefix}:lag:sampler"
        self._renew = client.register_script(_RENEW_SCRIPT)
        self._release = client.register_script(_RELEASE_SCRIPT)

    def history_key(self, view: str) -> str:
        return view_key(self.prefix, view, "lag")

    # --- measuring --------------------------------------------------------------------------------

    def measure(self, entries: Sequence[CatalogEntry], now_ms: int) -> list[LagSample]:
        """A lag sample of every view among ``entries`` (tables have no upstream and no lag)."""
        by_name = {e.name: e for e in entries}
        views = [e for e in entries if e.kind == "view"]
        names = sorted({e.name for e in views} | {s for e in views for s in e.sources})
        mces = self.views.mce_many(names)
        samples = []
        for view in views:
            mce = mces[view.name]
            upstream_mces = {s: mces[s] for s in view.sources}
            # Bounded by the upstream MCEs read above, so a sample is one instant even while they move.
            epochs = {s: self.index.count_after(s, mce, upto=upstream_mces[s]) if upstream_mces[s] else 0
                      for s in view.sources}
            records = {s: self.index.records_after(s, by_name[s].partitions if s in by_name else 1, mce,
                                                   upto=upstream_mces[s]) if upstream_mces[s] else 0
                       for s in view.sources}
            samples.append(measure(view.name, now_ms, mce, upstream_mces, epochs, records))
        return samples

    # --- current value and history ----------------------------------------------------------------

    def record(self, measured: Sequence[tuple[LagSample, Verdict]]) -> None:
        """Store the newest samples and append them to each view's history (one round trip)."""
        if not measured:
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.current_key, mapping={
            sample.view: json.dumps({"sample": sample.to_json(), "verdict": verdict.to_json()})
            for sample, verdict in measured})
        for sample, _ in measured:
            pipe.xadd(self.history_key(sample.view), {"s": json.dumps(sample.to_json())},
                      maxlen=self.history_length, approximate=True)
        pipe.execute()

    def current(self) -> dict[str, tuple[LagSample, Verdict]]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.current_key))
        found = {}
        for view, value in raw.items():
            data = json.loads(value)
            verdict = data["verdict"]
            found[view.decode()] = (LagSample.from_json(data["sample"]),
                                    Verdict(LagStatus(verdict["status"]), verdict["reason"]))
        return found

    def current_views(self) -> list[str]:
        return [v.decode() for v in cast(list[bytes], self.redis.hkeys(self.current_key))]

    def history(self, view: str, count: int) -> list[LagSample]:
        """The newest ``count`` samples of ``view``, oldest first."""
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       self.redis.xrevrange(self.history_key(view), count=count))
        return [LagSample.from_json(json.loads(fields[b"s"])) for _, fields in reversed(entries)]

    def histories(self, views: Sequence[str], count: int) -> dict[str, list[LagSample]]:
        pipe = self.redis.pipeline(transaction=False)
        for view in views:
            pipe.xrevrange(self.history_key(view), count=count)
        return {view: [LagSample.from_json(json.loads(fields[b"s"])) for _, fields in reversed(entries)]
                for view, entries in zip(views, pipe.execute(), strict=True)}

    def forget(self, views: Sequence[str]) -> None:
        """Drop the lag of views that no longer exist."""
        if views:
            self.redis.hdel(self.current_key, *views)
            self.redis.delete(*(self.history_key(v) for v in views))

    # --- the sampler's lease ----------------------------------------------------------------------

    def hold_lease(self, owner: str, ttl_ms: int) -> bool:
        """Take or renew the sampler lease; False when another live sampler holds it."""
        return bool(self._renew(keys=[self.lease_key], args=[owner, ttl_ms]))

    def release_lease(self, owner: str) -> None:
        self._release(keys=[self.lease_key], args=[owner])

    def lease_holder(self) -> str | None:
        value = cast(bytes | None, self.redis.get(self.lease_key))
        return value.decode() if value is not None else None
