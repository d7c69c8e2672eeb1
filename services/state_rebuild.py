"""A view's operator state at its MCE, re-derived from its upstreams' serving rows after a Redis wipe.

No changelog holds a view's operator state (per-group sums and counts, the min/max multisets, a join's
indexes of both sides), but it is a function of the upstream rows at the view's MCE: fed to the operator
as one epoch of ``READ`` changes (its hydration path), they give back that state and the view's rows.
During a rebuild the upstreams come back first (dependency order), so those rows are in Redis already:
the upstream's rows at its own MCE, with its epochs after the view's MCE undone from its changelog
(each change carries its before-image; only those epochs are read, found by the epoch index). This
replaces reading each upstream's whole changelog per view, which made a rebuild minutes long.

A view still backfilling holds Q of the upstream keys its positions cover only: only those take part.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from mvlog.backfill_record import load_positions
from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Op, apply_changes, undo_changes
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replay import ReplayRangeError
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import decode_row
from mvlog.services.backfill.chunked import backfill_needed, coverage
from mvlog.services.rederive import RedisRebuildSink
from mvlog.services.view_ddl import plan_for
from mvlog.views import ChangeBatch, InMemoryState, ViewOperator


class ViewNotRestorableError(RuntimeError):
    """A view's operator state cannot be re-derived yet (an upstream is behind it in Redis, or the view's
    consumer committed meanwhile): left to the view's own consumer, which restores itself."""


def upstream_rows_at(settings: Settings, store: ViewStore, upstream: CatalogEntry, epoch: int,
                     idle_timeout: float = 15.0) -> dict[Key, Row]:
    """rows(upstream, epoch): its serving rows at its MCE, its committed epochs above ``epoch`` undone."""
    mce, pairs = store.read_at_consistent_epoch(upstream.name)
    if mce is None or mce < epoch:
        raise ViewNotRestorableError(f"{upstream.name} is at epoch {mce} in Redis, below {epoch}")
    rows = {upstream.schema.key_of(row): row for row in (decode_row(value) for _, value in pairs)}
    if mce == epoch:
        return rows
    later: list[Change] = []
    with ChangelogReader(settings, upstream.name, upstream.key_columns, upstream.partitions, store.index,
                         after_epoch=epoch, upto_epoch=mce) as reader:
        for found in reader.epochs(idle_timeout=idle_timeout):
            later.extend(found.changes)
        if reader.last_epoch < mce:
            raise ViewNotRestorableError(f"{upstream.name}: its changelog ends at epoch {reader.last_epoch}, below "
                                         f"its MCE {mce}")
    return undo_changes(rows, later)


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
        rows = upstream_rows_at(settings, store, upstream, mce)
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
