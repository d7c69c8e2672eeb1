"""A view's serving state in Redis, all of it: rows, operator state, MCE and lifecycle, backfill, loads.

Each kind of state has a store of its own, each usable alone with the same client and prefix:

* :class:`~mvlog.connectors.redis.view_meta.ViewMeta`: the MCE and lifecycle (``meta``);
* :class:`~mvlog.connectors.redis.view_rows.ViewRows`: rows, operator state and key order, read (alone
  or with the MCE they reflect);
* :class:`~mvlog.connectors.redis.epoch_commit.EpochCommits`: an epoch's commit of all of them with its
  epoch index and MCE, in one script that refuses an epoch at or below the MCE;
* :class:`~mvlog.connectors.redis.backfill_store.BackfillStore`: a chunked backfill's positions, journal
  and progress;
* :class:`~mvlog.connectors.redis.load_staging.LoadStaging`: a snapshot backfill's first epoch, staged.

:class:`ViewStore` is all of them at once, for the processes that handle a view's whole state (a view
consumer, a table writer, recovery, the CLI): one object, one epoch index, the method names they call.
A new caller that needs one kind of state takes that store. All keys of a view share the hash tag
``{view}``, so every script also runs on Redis Cluster.
"""

from __future__ import annotations

from mvlog.connectors.redis.backfill_store import CHUNK_KEYS, BackfillStore
from mvlog.connectors.redis.epoch_commit import (
    JOURNAL_LIMIT,
    EpochCommit,
    EpochCommits,
    ServingStateLostError,
    commit_from_changes,
    commit_from_encoded,
)
from mvlog.connectors.redis.load_staging import LOAD_KEYS, LoadStaging
from mvlog.connectors.redis.view_meta import Lifecycle
from mvlog.connectors.redis.view_rows import OrderedRead, ViewRows
from mvlog.connectors.redis.writer_claims import claim_key

__all__ = ["JOURNAL_LIMIT", "EpochCommit", "Lifecycle", "OrderedRead", "ServingStateLostError", "ViewStore",
           "commit_from_changes", "commit_from_encoded"]


class ViewStore(EpochCommits, ViewRows, BackfillStore, LoadStaging):
    """Redis serving state of all views under one key prefix (every store of the module docstring)."""

    def drop(self, view: str, partitions: int) -> None:
        """Delete every key of ``view``'s state, each store's, and its epoch index of ``partitions``."""
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate", "keyorder", "backfill", "journal",
                                             "backfill_progress", *CHUNK_KEYS, *LOAD_KEYS)]
        keys += [self.index.key(view, p) for p in range(partitions)]
        keys += [claim_key(self.prefix, view, p) for p in range(partitions)]
        self.redis.delete(*keys)
