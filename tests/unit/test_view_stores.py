"""The stores of a view's Redis state (``connectors/redis``): each stands alone, and ``ViewStore`` is all of
them with the method names its callers use. Pure: building a store registers its scripts (their SHA1 is
computed locally) and connects to nothing."""

from __future__ import annotations

import redis

from mvlog.connectors.redis.backfill_store import BackfillStore
from mvlog.connectors.redis.epoch_commit import EpochCommits
from mvlog.connectors.redis.load_staging import LoadStaging
from mvlog.connectors.redis.view_keyspace import ViewKeyspace
from mvlog.connectors.redis.view_meta import ViewMeta
from mvlog.connectors.redis.view_rows import ViewRows
from mvlog.connectors.redis.view_store import ViewStore

#: What the services, the CLI, the benchmarks and the tests call on a ViewStore.
VIEW_STORE_METHODS = (
    "key", "commit", "commit_rows", "stream_commit", "replace_state", "mce", "holds", "mce_many",
    "set_lifecycle", "lifecycle", "meta", "get_rows", "row_list", "scan_rows", "row_count", "get_state",
    "read_at_consistent_epoch", "read_many_at_consistent_epoch", "get_rows_at_consistent_epoch",
    "read_ordered", "backfill_state", "backfill_journal", "set_backfill_progress", "backfill_progress",
    "clear_load", "stage_load", "commit_load", "drop",
)


def _client() -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=1)  # never connected to


def test_view_store_is_every_store_with_its_method_names() -> None:
    store = ViewStore(_client(), "p")
    for part in (ViewKeyspace, ViewMeta, ViewRows, EpochCommits, BackfillStore, LoadStaging):
        assert isinstance(store, part)
    missing = [name for name in VIEW_STORE_METHODS if not callable(getattr(store, name, None))]
    assert missing == []
    # Every store's scripts are registered once, on the one client.
    assert len({store._commit.sha, store._replace.sha, store._read_ordered.sha, store._commit_load.sha}) == 4
    assert store.key("v", "rows") == "p:{v}:rows"
    assert store.index.key("v", 0) == ViewKeyspace(_client(), "p").index.key("v", 0)


def test_each_store_stands_alone() -> None:
    client = _client()
    assert BackfillStore(client, "p").key("v", "backfill") == "p:{v}:backfill"
    assert LoadStaging(client, "p")._commit_load.sha
    assert ViewRows(client, "p")._read_ordered.sha
    assert EpochCommits(client, "p")._commit.sha
    assert not hasattr(ViewMeta(client, "p"), "commit")
