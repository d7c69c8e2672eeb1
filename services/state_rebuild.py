"""A view's operator state at its MCE, re-derived from its upstreams' serving rows after a Redis wipe.

No changelog holds a view's operator state (per-group sums and counts, the min/max multisets, a join's
indexes of both sides), but it is a function of the upstream rows at the view's MCE: fed to the operator
as one epoch of ``READ`` changes (its hydration path), they give back that state and the view's rows.
During a rebuild the upstreams come back first (dependency order), so those rows are in Redis already
(:func:`~mvlog.connectors.rows_at_epoch.rows_at_epoch`: its serving rows with its later epochs undone).
This replaces reading each upstream's whole changelog per view, which made a rebuild minutes long.

A view still backfilling holds Q of the upstream keys its positions cover only: only those take part.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from mvlog.backfill_record import load_positions
from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op, apply_changes
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.rows_at_epoch import EpochNotReadableError, rows_at_epoch
from mvlog.replay import ReplayRangeError
from mvlog.row_schema import Key
from mvlog.services.backfill.chunked import backfill_needed, coverage
from mvlog.services.rederive import RedisRebuildSink
from mvlog.services.view_ddl import plan_for
from mvlog.views import ChangeBatch, InMemoryState, ViewOperator


class ViewNotRestorableError(RuntimeError):
    """A view's operator state cannot be re-derived yet (an upstream is behind it in Redis, or the view's
    consumer committed meanwhile): left to the view's own consumer, which restores itself."""


def restore_view_state(settings: Settings, client: redis.Redis, entry: CatalogEntry) -> int | None:
    """Re-derive ``entry``'s operator state and rows at its MCE and swap them in; returns the MCE."""
    store = ViewStore(client, settings.topic_prefix)
    mce = store.mce(entry.name)
    if mce is None:
        return None
    catalog = CatalogStore(settings, client)
    upstreams = {name: catalog.get(name) for name in entry.sources}
    covers = _backfill_coverage(store, entry, upstreams)
    inputs: dict[str, ChangeBatch] = {}
    for name, upstream in upstreams.items():
        try:
            rows = rows_at_epoch(settings, store, upstream, mce)
        except EpochNotReadableError as exc:
            raise ViewNotRestorableError(str(exc)) from exc
        inputs[name] = ChangeBatch.from_changes(upstream.schema, [
            Change(Op.READ, key, None, row) for key, row in rows.items() if covers is None or covers(name, key)])
    state = InMemoryState()
    output = ViewOperator(plan_for(catalog, entry.name, entry.sql or "")).apply_epoch(inputs, state)
    state.apply(output.state_writes)
    try:
        RedisRebuildSink(store, entry).swap(apply_changes({}, output.changes.to_changes()), state.data, mce)
    except ReplayRangeError as exc:  # its live consumer committed meanwhile: it restores itself
        raise ViewNotRestorableError(str(exc)) from exc
    return mce


def _backfill_coverage(store: ViewStore, entry: CatalogEntry, upstreams: dict[str, CatalogEntry]
                       ) -> Callable[[str, Key], bool] | None:
    """For a view whose chunked backfill was still running at its MCE (positions rolled forward from its
    changelog): which upstream keys it covers; None when it holds its whole upstream."""
    if not backfill_needed(store, entry):
        return None
    return coverage(load_positions(store.backfill_state(entry.name), entry.sources), upstreams)
