"""Creating and dropping views: plan the definition, register it in the catalog, create its topic."""

from __future__ import annotations

import shutil
import time

import redis

from mvlog.catalog import CatalogEntry, CatalogError
from mvlog.config import Settings
from mvlog.connectors.kafka.retention import starts_the_log
from mvlog.connectors.kafka.topics import delete_topic, ensure_changelog
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.consumer_lease import ConsumerLeases
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.table_writers import TableWriters
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.epoch import EpochClock
from mvlog.snapshot_plan import BackfillChoice, SnapshotError, choose_backfill
from mvlog.views import ViewPlan, plan_view
from mvlog.views.seed import unseedable


class DependentViewsError(CatalogError):
    pass


#: View settings kept in the catalog entry's ``options`` (so they are rebuilt from Kafka with it).
#: ``max_epoch_lag``: backpressure bound in epochs (absent: upstreams never wait for this view).
#: ``backfill_rate_limit``: rows/s cap of this view's backfill (absent: no cap).
VIEW_OPTIONS: frozenset[str] = frozenset({"max_epoch_lag", "backfill_rate_limit"})


def plan_for(catalog: CatalogStore, name: str, sql: str) -> ViewPlan:
    """Plan ``sql`` against the catalog's current schemas (raises ViewDefinitionError naming the problem)."""
    upstreams = {entry.name: entry.schema for entry in catalog.all()}
    return plan_view(name, sql, upstreams)


#: How a new view gets its upstreams' existing rows: ``changelog`` replays the upstream changelog from its
#: start (needs the whole log retained); ``chunked`` backfills online from the upstreams' serving state;
#: ``snapshot`` starts from the upstream's latest snapshot and replays the epochs after it; ``auto`` picks
#: snapshot when the upstream has one and holds more than ``snapshot_backfill_min_rows`` rows, else chunked.
BACKFILL_METHODS: tuple[str, ...] = ("chunked", "changelog", "snapshot", "auto")


def resolve_backfill(settings: Settings, client: redis.Redis, sources: tuple[str, ...],
                     requested: str, *, join: bool = False, unseedable: str | None = None) -> BackfillChoice:
    """The concrete backfill method for a view over ``sources`` (see :func:`mvlog.snapshot_plan.choose_backfill`)."""
    snapshots = SnapshotStore.of(settings, client)
    store = ViewStore(client, settings.topic_prefix)
    try:
        choice = choose_backfill(requested, sources, {s: snapshots.latest(s) for s in sources},
                                 {s: store.row_count(s) for s in sources}, settings.snapshot_backfill_min_rows,
                                 join=join, unseedable=unseedable)
    except SnapshotError as error:
        raise CatalogError(str(error)) from error
    if choice.method == "changelog":
        for source in sources:
            _require_whole_changelog(settings, store, source)
    return choice


def _require_whole_changelog(settings: Settings, store: ViewStore, source: str) -> None:
    """A changelog backfill replays ``source``'s changelog from its first epoch: refuse it when retention
    deleted that start (the view would silently miss the rows of the deleted epochs)."""
    if store.index.oldest(source, 0) is None or starts_the_log(settings, store.index, source):
        return  # no epoch yet, or the whole history is there
    raise CatalogError(f"--backfill changelog needs the changelog of {source} from its first epoch, but Kafka's "
                       f"retention deleted its start: use --backfill chunked (from {source}'s rows) or snapshot "
                       f"(from a snapshot of {source} the changelog still covers)")


def create_view(settings: Settings, name: str, sql: str, *, client: redis.Redis | None = None,
                partitions: int | None = None, backfill: str = "changelog") -> CatalogEntry:
    """Register view ``name``; nothing is created when the definition is refused."""
    if backfill not in BACKFILL_METHODS:
        raise CatalogError(f"unknown backfill method {backfill!r}; known: {', '.join(BACKFILL_METHODS)}")
    client = client or redis_client.connect(settings)
    catalog = CatalogStore(settings, client)
    if (existing := catalog.find(name)) is not None:
        raise CatalogError(f"{existing.kind} {name!r} already exists")
    plan = plan_for(catalog, name, sql)
    # A subquery's state, a join's and a top-N's are not seeded from a snapshot: chunked (see unseedable).
    choice = resolve_backfill(settings, client, plan.sources, backfill, join=plan.is_join,
                              unseedable=None if plan.is_join else unseedable(plan))
    options = {"backfill": choice.method} if choice.method != "changelog" else {}
    if backfill == "auto":
        options["backfill_auto"] = choice.reason  # why auto chose it (shown by create-view)
    entry = CatalogEntry(name, "view", plan.schema, partitions or settings.partitions,
                         created_epoch=EpochClock().next(), sql=sql, sources=plan.sources, options=options)
    ensure_changelog(settings, name, entry.partitions)
    catalog.put(entry)
    ViewStore(client, settings.topic_prefix).set_lifecycle(name, Lifecycle.CREATING)
    catalog.close()
    return entry


def drop_view(settings: Settings, name: str, *, client: redis.Redis | None = None,
              stop_timeout: float = 60.0) -> str | None:
    """Drop a view (refused while other views read it, naming them), with its snapshots.

    A ``run-view`` process maintaining it is asked to stop that view first (its other views go on), and
    the drop waits for it; returns that process (``host:pid``), None when no consumer ran."""
    return drop_object(settings, name, "view", client=client, stop_timeout=stop_timeout)


def drop_table(settings: Settings, name: str, *, client: redis.Redis | None = None) -> None:
    """Drop a root table (refused while views read it, naming them): catalog entry, rows, snapshots and
    changelog topic."""
    drop_object(settings, name, "table", client=client)


def drop_object(settings: Settings, name: str, kind: str, *, client: redis.Redis | None = None,
                stop_timeout: float = 60.0) -> str | None:
    """Drop table or view ``name`` (``kind`` must be its kind): a table keeps the same things a view does
    (catalog entry, serving state and epoch index in Redis, snapshots, changelog topic), so both go the
    same way and nothing of either is left behind."""
    client = client or redis_client.connect(settings)
    catalog = CatalogStore(settings, client)
    entry = catalog.get(name)
    if entry.kind != kind:
        raise CatalogError(f"{name!r} is a {entry.kind}, not a {kind}")
    if dependents := catalog.dependents(name):
        verb, them = ("depends", "it") if len(dependents) == 1 else ("depend", "them")
        raise DependentViewsError(f"cannot drop {entry.kind} {name!r}: {', '.join(dependents)} {verb} on it; "
                                  f"drop {them} first")
    stopped = _stop_consumer(client, settings.topic_prefix, name, stop_timeout)
    catalog.delete(name)
    ViewStore(client, settings.topic_prefix).drop(name, entry.partitions)
    ReplacementStore(client, settings.topic_prefix).forget(name)
    TableWriters(client, settings.topic_prefix).forget(name)
    for snapshot in SnapshotStore.of(settings, client).drop(name):
        shutil.rmtree(snapshot.path, ignore_errors=True)
    delete_topic(settings, settings.changelog_topic(name))
    catalog.close()
    return stopped


def _stop_consumer(client: redis.Redis, prefix: str, name: str, timeout: float) -> str | None:
    """Ask the process holding ``name``'s consumer lease to stop it, and wait until it let go (a drop under
    a running consumer would otherwise fail it half-way through an epoch)."""
    leases = ConsumerLeases(client, prefix)
    if (holder := leases.holder(name)) is None:
        return None
    leases.request_stop(name, f"drop-view {name} asked for it")
    deadline = time.monotonic() + timeout
    while leases.holder(name) is not None:
        if time.monotonic() > deadline:
            raise CatalogError(f"cannot drop {name!r}: its consumer ({holder}) did not stop within {timeout:.0f} s; "
                               f"stop its mvlog run-view first")
        time.sleep(0.1)
    return holder


def alter_view(settings: Settings, name: str, *, client: redis.Redis | None = None,
               **options: int | None) -> CatalogEntry:
    """Change a view's settings (see :data:`VIEW_OPTIONS`); ``None`` removes a setting.

    Running services read the catalog entry again, so a change applies while they run.
    """
    if unknown := sorted(set(options) - VIEW_OPTIONS):
        raise CatalogError(f"unknown view setting(s): {', '.join(unknown)}; known: {', '.join(sorted(VIEW_OPTIONS))}")
    for key, value in options.items():
        if value is not None and value < 1:
            raise CatalogError(f"{key} must be at least 1, got {value}")
    client = client or redis_client.connect(settings)
    catalog = CatalogStore(settings, client)
    entry = catalog.get(name)
    if entry.kind != "view":
        raise CatalogError(f"{name!r} is a {entry.kind}, not a view")
    merged = dict(entry.options)
    for key, value in options.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = str(value)
    altered = entry.bumped(options=merged)
    catalog.put(altered)
    catalog.close()
    return altered


def view_option(entry: CatalogEntry, key: str) -> int | None:
    """An integer view setting of :data:`VIEW_OPTIONS`, or None when unset."""
    value = entry.options.get(key)
    return int(value) if value is not None else None
