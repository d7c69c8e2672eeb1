"""The keys of one view's state in Redis and its epoch index: what every store of a view's state shares.

Each store of :mod:`mvlog.connectors.redis` that holds a part of a view's state (its MCE and lifecycle,
rows, backfill progress, staged loads) is a :class:`ViewKeyspace`: the client, the key prefix and the
layout of :func:`~mvlog.connectors.redis.redis_keys.view_key`, so every key of a view carries its hash
tag ``{view}`` and the scripts that change several of them together run on Redis Cluster.
"""

from __future__ import annotations

import redis

from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.redis_keys import view_key


class ViewKeyspace:
    """The Redis keys of all views under one prefix (``<prefix>:{<view>}:<what>``) and their epoch index.

    Subclasses register their scripts in ``__init__`` after ``super().__init__(client, prefix)``, so that
    :class:`~mvlog.connectors.redis.view_store.ViewStore`, which is all of them, builds each part once."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self.index = EpochIndex(client, prefix)

    def _key(self, view: str, what: str) -> str:
        return view_key(self.prefix, view, what)

    def key(self, view: str, what: str) -> str:
        """The Redis key of ``what`` (meta, rows, backfill, ...) of ``view``, under the view's hash tag."""
        return self._key(view, what)
