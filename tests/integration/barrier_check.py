"""Exactly once on the wire: each committed epoch's barrier is in each partition of a view's changelog
once, whatever attempts were aborted before it.

A consumer killed in the middle of a transaction leaves an aborted attempt at the epoch, which Tansu
still delivers to ``read_committed`` readers (DESIGN.md, environment facts). An aborted attempt has its
own ``txn``; the committed one is the attempt whose barrier offset the epoch index holds, and it must be
the only barrier of its transaction.
"""

from __future__ import annotations

import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore

from .independent_consumer import read_topic


def assert_barriers_once(settings: Settings, client: redis.Redis, view: str, last: int) -> None:
    """Every epoch of ``view`` up to ``last`` in the epoch index has one committed barrier per partition."""
    store = ViewStore(client, settings.topic_prefix)
    entry = CatalogStore(settings, client).get(view)
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic(view), entry.partitions, idle=1.5)
    for partition in range(entry.partitions):
        indexed = store.index.between(view, partition, 0, last)
        assert indexed, f"{view}[{partition}]: no committed epoch"
        for item in indexed:
            attempts = logs[partition].barriers.get(item.epoch, [])
            committed = [barrier for offset, barrier in attempts if offset == item.offset]
            assert len(committed) == 1, (view, partition, item.epoch, attempts)
            same_txn = [barrier for _, barrier in attempts if barrier["txn"] == committed[0]["txn"]]
            assert len(same_txn) == 1, f"{view}[{partition}] epoch {item.epoch}: barrier written twice"
