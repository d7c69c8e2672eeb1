"""Replacement views: stage a new definition for a view, inspect it, apply it at an epoch, or discard it.

The Python API behind ``mvlog replace`` and ``mvlog replacement ...``. A staged replacement lives in
two places: the view's catalog entry (options ``replacement_id``/``replacement_sql``, so it is rebuilt
from the compacted catalog topic with the entry after a Redis wipe) and its Redis record and state
(:mod:`mvlog.connectors.redis.replacement_store`). It is a field of the view's entry rather than an entry of
its own because it is not a relation: nothing can read from it, it has no changelog topic, and the
services that walk the catalog (caches, lag, backfill) must not mistake it for a view.

The view's consumer (``mvlog run-view``) hydrates and maintains it (see
:mod:`mvlog.services.replacement.follower`) and performs the cut-over at its next epoch once an apply
is requested; this module only records requests and waits for their outcome.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import ReplacementRecord, ReplacementStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import (
    DiffSummary,
    ReplacementError,
    Status,
    applied_entry,
    check_compatible,
    diff_rows,
    staged_in,
    summarize,
    with_staged,
    without_staged,
)
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import decode_row
from mvlog.services.view_ddl import plan_for
from mvlog.views import ViewPlan


@dataclass(frozen=True)
class AppliedReplacement:
    view: str
    id: str
    epoch: int  # the view's epoch whose changes are the diff, with the apply_replacement mutation
    version: int  # the view's catalog version from then on


def _stores(settings: Settings, client: redis.Redis | None) -> tuple[CatalogStore, ReplacementStore, ViewStore]:
    client = client or redis_client.connect(settings)
    return (CatalogStore(settings, client), ReplacementStore(client, settings.topic_prefix),
            ViewStore(client, settings.topic_prefix))


def _view(catalog: CatalogStore, name: str) -> CatalogEntry:
    entry = catalog.get(name)
    if entry.kind != "view":
        raise ReplacementError(f"{name!r} is a {entry.kind}: only views have replacements")
    return entry


def plan_replacement(catalog: CatalogStore, entry: CatalogEntry, sql: str) -> ViewPlan:
    """Plan ``sql`` as the new definition of ``entry`` and check it fits (raises naming the problem)."""
    plan = plan_for(catalog, entry.name, sql)
    check_compatible(entry, plan.schema, plan.sources)
    return plan


def stage_replacement(settings: Settings, view: str, sql: str, *, client: redis.Redis | None = None
                      ) -> ReplacementRecord:
    """Stage ``sql`` as the replacement of ``view``: planned and checked now, hydrated by the view's
    consumer; nothing reaches the view's changelog until it is applied."""
    catalog, store, _ = _stores(settings, client)
    try:
        entry = _view(catalog, view)
        plan_replacement(catalog, entry, sql)
        record = store.record(view)
        if (staged := staged_in(entry)) is not None or (record is not None and record.status is Status.STAGED):
            existing = staged[0] if staged else record.id if record else "?"
            raise ReplacementError(f"{view} already has a staged replacement ({existing}); apply or discard "
                                   f"it first (mvlog replacement discard {view})")
        replacement_id = uuid.uuid4().hex[:12]
        catalog.put(with_staged(entry, replacement_id, sql))  # Kafka first: the topic is the truth
        if (other := store.stage(view, replacement_id, sql)) is not None:
            raise ReplacementError(f"{view}: replacement {other} was staged concurrently")
        staged_record = store.record(view)
        assert staged_record is not None
        return staged_record
    finally:
        catalog.close()


def replacement_of(settings: Settings, view: str, *, client: redis.Redis | None = None) -> ReplacementRecord:
    """The view's staged replacement (raises naming why there is none)."""
    catalog, store, _ = _stores(settings, client)
    _view(catalog, view)
    return _staged(store, view)


def _staged(store: ReplacementStore, view: str) -> ReplacementRecord:
    record = store.record(view)
    if record is None:
        raise ReplacementError(f"{view} has no replacement (stage one with: mvlog replace {view} AS SELECT ...)")
    if record.status is Status.DISCARDED:
        raise ReplacementError(f"the replacement {record.id} of {view} was discarded; stage a new one")
    if record.status is Status.APPLIED:
        raise ReplacementError(f"the replacement {record.id} of {view} was applied at epoch "
                               f"{record.applied_epoch}; nothing is staged")
    return record


def request_apply(settings: Settings, view: str, *, client: redis.Redis | None = None) -> str:
    """Ask the view's consumer to cut over at its next epoch; returns the replacement's id."""
    catalog, store, _ = _stores(settings, client)
    _view(catalog, view)
    record = _staged(store, view)
    if not store.request_apply(view, record.id):
        _staged(store, view)  # discarded or applied meanwhile: say which
        raise ReplacementError(f"{view}: the replacement changed while applying it; try again")
    return record.id


def wait_for_apply(settings: Settings, view: str, replacement_id: str, timeout: float, *,
                   client: redis.Redis | None = None,
                   on_wait: Callable[[ReplacementRecord, int | None], None] | None = None) -> AppliedReplacement:
    """Wait until the consumer has applied the replacement; after ``timeout`` seconds withdraw the
    request and refuse with the reason (nothing applied then, or it was applied just in time)."""
    catalog, store, views = _stores(settings, client)
    try:
        return _wait(catalog, store, views, view, replacement_id, timeout, on_wait)
    finally:
        catalog.close()


def _wait(catalog: CatalogStore, store: ReplacementStore, views: ViewStore, view: str, replacement_id: str,
          timeout: float, on_wait: Callable[[ReplacementRecord, int | None], None] | None) -> AppliedReplacement:
    start_mce = views.mce(view)
    deadline = time.monotonic() + timeout
    while True:
        record = store.record(view)
        if record is None or record.id != replacement_id:
            raise ReplacementError(f"the replacement {replacement_id} of {view} is gone (staged again or the "
                                   "view was dropped)")
        if record.status is Status.APPLIED:
            complete_apply(catalog, store, view)
            assert record.applied_epoch is not None and record.applied_version is not None
            return AppliedReplacement(view, record.id, record.applied_epoch, record.applied_version)
        if record.status is Status.DISCARDED:
            raise ReplacementError(f"the replacement {replacement_id} of {view} was discarded before it applied")
        if on_wait is not None:
            on_wait(record, views.mce(view))
        if time.monotonic() >= deadline:
            if store.withdraw_apply(view, replacement_id):
                raise ReplacementError(f"{view}: replacement {replacement_id} not applied within {timeout:g}s: "
                                       f"{_why_waiting(record, start_mce, views.mce(view))}; nothing was "
                                       "applied and it stays staged")
            continue  # applied or discarded at the last moment: report that
        time.sleep(0.1)


def _why_waiting(record: ReplacementRecord, start_mce: int | None, view_mce: int | None) -> str:
    run = f"is `mvlog run-view {record.view}` running?"
    if not record.hydrated:
        return f"it is not hydrated yet (the view's consumer hydrates it: {run})"
    if view_mce is not None and record.mce is not None and record.mce < view_mce:
        return f"it is at epoch {record.mce}, behind the view's MCE {view_mce} ({run})"
    if view_mce == start_mce:
        return (f"the view did not reach a new epoch (it cuts over at its next upstream epoch; {run} "
                "is its upstream writing?)")
    return f"the view's consumer did not cut over ({run})"


def apply_replacement(settings: Settings, view: str, *, timeout: float = 60.0, client: redis.Redis | None = None,
                      on_wait: Callable[[ReplacementRecord, int | None], None] | None = None) -> AppliedReplacement:
    """Apply the staged replacement at the view's next epoch (at or after its MCE); waits up to ``timeout``."""
    client = client or redis_client.connect(settings)
    replacement_id = request_apply(settings, view, client=client)
    return wait_for_apply(settings, view, replacement_id, timeout, client=client, on_wait=on_wait)


def discard_replacement(settings: Settings, view: str, *, client: redis.Redis | None = None) -> str:
    """Drop the staged replacement and its state; returns its id. A pending apply is cancelled with it."""
    catalog, store, _ = _stores(settings, client)
    try:
        entry = _view(catalog, view)
        staged = staged_in(entry)
        discarded = store.discard(view)
        if discarded is None and staged is None:
            _staged(store, view)  # raises: says why nothing is staged
        if staged is not None:
            catalog.put(without_staged(entry))
        return discarded or (staged[0] if staged else "")
    finally:
        catalog.close()


def complete_apply(catalog: CatalogStore, store: ReplacementStore, view: str) -> CatalogEntry:
    """Bring the catalog in line with Redis after an interrupted staging or apply; returns the entry.

    An apply commits in Redis (the view's state, MCE and the record) before the catalog entry is
    rewritten; a crash in between leaves the record 'applied' at a version the catalog lacks, which is
    rolled forward here. A staged replacement the catalog knows but Redis does not (Redis was wiped,
    or staging stopped half-way) is recorded again; its consumer hydrates it anew.
    """
    entry = catalog.get(view)
    record = store.record(view)
    if record is not None and record.status is Status.APPLIED and record.applied_version is not None \
            and record.applied_version > entry.version:
        plan = plan_for(catalog, view, record.sql)
        entry = applied_entry(entry, record.sql, plan.schema, plan.sources, record.applied_version)
        catalog.put(entry)
    elif record is None and (staged := staged_in(entry)) is not None:
        store.stage(view, *staged)
    return entry


def _decoded(entry_key: Callable[[Row], Key], raw: dict[bytes, bytes]) -> dict[Key, Row]:
    rows = [decode_row(value) for value in raw.values()]
    return {entry_key(row): row for row in rows}


def diff_replacement(settings: Settings, view: str, *, samples: int = 5, timeout: float = 10.0,
                     client: redis.Redis | None = None) -> DiffSummary:
    """What applying the replacement would change, view and replacement read at the same epoch.

    They are at the same epoch whenever the consumer is between epochs (the replacement commits each
    epoch just before the view); this polls for such a moment for up to ``timeout`` seconds.
    """
    catalog, store, _ = _stores(settings, client)
    entry = _view(catalog, view)
    record = _staged(store, view)
    plan = plan_replacement(catalog, entry, record.sql)
    deadline = time.monotonic() + timeout
    while True:
        view_mce, old, mce, new = store.read_both(view)
        if mce is not None and mce == (view_mce or 0):
            break
        if time.monotonic() >= deadline:
            state = "not hydrated yet" if mce is None else f"at epoch {mce}"
            raise ReplacementError(f"{view}: the replacement ({state}) and the view (MCE {view_mce}) did not "
                                   f"meet at one epoch within {timeout:g}s; is `mvlog run-view {view}` running?")
        time.sleep(0.05)
    changes = diff_rows(_decoded(entry.schema.key_of, old), _decoded(plan.schema.key_of, new), plan.schema)
    return summarize(mce, changes, samples)


def replacement_rows(settings: Settings, view: str, *, client: redis.Redis | None = None
                     ) -> tuple[ReplacementRecord, ViewPlan, list[Row]]:
    """The staged replacement's own rows (and its record: ``mce`` is the epoch they reflect)."""
    catalog, store, _ = _stores(settings, client)
    entry = _view(catalog, view)
    record = _staged(store, view)
    plan = plan_replacement(catalog, entry, record.sql)
    pipe = store.redis.pipeline(transaction=True)
    pipe.hget(store.key(view), "mce")
    pipe.hgetall(store.key(view, "rows"))
    mce, raw = pipe.execute()
    record = ReplacementRecord(record.view, record.id, record.sql, record.status,
                               int(mce) if mce is not None else None, record.apply_requested,
                               fields=record.fields)
    return record, plan, [decode_row(value) for value in raw.values()]


def list_replacements(settings: Settings, *, client: redis.Redis | None = None) -> list[ReplacementRecord]:
    """Every view's replacement record (staged, applied or discarded), by view name."""
    catalog, store, _ = _stores(settings, client)
    records = [store.record(entry.name) for entry in catalog.all() if entry.kind == "view"]
    return [r for r in records if r is not None]
