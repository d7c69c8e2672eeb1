"""Where a staged replacement's hydration starts: an upstream's snapshot, or its changelog's first epoch.

Hydration computes the replacement's rows at the view's MCE from its upstreams' history. Replaying an
upstream's whole changelog needs it retained from its first epoch, which Kafka retention ends; a
snapshot (``mvlog snapshot``) keeps the upstream's rows at an epoch E instead. So each upstream starts
from its newest snapshot at or before the view's MCE whose later epochs its changelog still holds, or
else from its changelog's first epoch; with neither, the replacement cannot be hydrated, and says why.

The replacement's first state is computed at one epoch F: the newest chosen snapshot's epoch (the
view's MCE when every upstream replays its changelog). Each upstream's rows at F are its snapshot's rows
(as ``r`` changes) plus its changes after the snapshot up to F, fed to the operator in one step, as a
snapshot backfill does (the snapshot's rows pass through the driver); the follower then catches up
over (F, MCE] from the changelog and follows the view's epochs. Nothing is written to the view's
changelog either way.

Where the operators run in Spark's tasks (``Settings.operators_in_tasks``) and the replacement's
operator is one they run (one upstream, by the key it passes through or by its groups), hydration
runs there too (:func:`hydrate_in_tasks`): Spark SQL folds the log up to
the epoch before F, a task per view partition computes epoch F with the replacement's operator and
stages its partition's rows and state, and one script makes them the replacement's. From a snapshot,
the tasks read its files instead, as the rows at F. A two-view equi-join replacement is hydrated by
one task per join-key partition (:class:`~mvlog.services.rederive.join_tasks.JoinRebuild`, as a join's
rebuild after a Redis wipe): each side folded to F from its snapshot, if any, and its changelog. The
driver then never holds the upstreams' rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis
from pyspark.sql import SparkSession

from mvlog.catalog import CatalogEntry, CatalogError
from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.retention import starts_the_log
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import EpochIndex
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import ReplacementError, applied_entry
from mvlog.replay import ReplayRangeError
from mvlog.services.rederive.derive import DerivationPlan, plan_derivation
from mvlog.services.rederive.join_tasks import JoinRebuild, KeyedView, SideRead
from mvlog.services.rederive.tasks import TaskDerivation
from mvlog.services.snapshot_compaction import check_changelog_after, read_snapshot
from mvlog.snapshot_plan import SnapshotError, SnapshotRecord
from mvlog.views import ViewPlan
from mvlog.views.key_routing import one_upstream_routing
from mvlog.views.keyed_routing import operator_key_routing, routed_by_operator_key

log = logging.getLogger(__name__)

#: ``changes_of(upstream, after, upto)``: the upstream's changes of its epochs in ``(after, upto]``.
ChangesOf = Callable[[str, int, int], list[Change]]


@dataclass(frozen=True)
class HydrationStart:
    """Per upstream, the snapshot hydration loads (None: its changelog is replayed from its first epoch)."""

    snapshots: Mapping[str, SnapshotRecord | None]
    view_mce: int

    @property
    def epoch(self) -> int:
        """F, the epoch of the replacement's first state."""
        return max((s.epoch for s in self.snapshots.values() if s is not None), default=self.view_mce)

    def describe(self) -> str:
        return "; ".join(f"{name}: snapshot at epoch {s.epoch}" if s is not None
                         else f"{name}: changelog from its first epoch" for name, s in self.snapshots.items())


def hydration_start(settings: Settings, store: ViewStore, snapshots: SnapshotStore,
                    upstreams: Mapping[str, CatalogEntry], view_mce: int) -> HydrationStart:
    """Choose each upstream's start (raises :class:`ReplacementError` naming an upstream that has neither
    a usable snapshot nor its whole changelog)."""
    chosen: dict[str, SnapshotRecord | None] = {}
    for name, entry in upstreams.items():
        record = snapshots.latest(name, at_or_before=view_mce)
        why_not = f"it has no snapshot at or before epoch {view_mce}"
        if record is not None:
            try:
                check_changelog_after(settings, store, entry, record.epoch)
                chosen[name] = record
                continue
            except SnapshotError as error:
                why_not = f"its snapshot at epoch {record.epoch} is not covered by the changelog ({error})"
        if not starts_the_log(settings, store.index, name):
            raise ReplacementError(
                f"cannot hydrate: the changelog of {name} no longer starts at its first epoch (Kafka retention) "
                f"and {why_not}; a replacement starts from an upstream's snapshot or from its whole changelog")
        chosen[name] = None
    return HydrationStart(chosen, view_mce)


def first_inputs(start: HydrationStart, spark: SparkSession, upstreams: Mapping[str, CatalogEntry],
                 changes_of: ChangesOf) -> dict[str, list[Change]]:
    """Each upstream's rows at ``start.epoch`` as changes: its snapshot's rows, then its later changes."""
    inputs: dict[str, list[Change]] = {}
    for name, record in start.snapshots.items():
        changes = snapshot_reads(spark, upstreams[name], record) if record is not None else []
        after = record.epoch if record is not None else 0
        if start.epoch > after:
            changes.extend(changes_of(name, after, start.epoch))
        inputs[name] = changes
    return inputs


def snapshot_reads(spark: SparkSession, upstream: CatalogEntry, record: SnapshotRecord) -> list[Change]:
    """The snapshot's rows as ``r`` (read) changes, applied like creates."""
    columns = [f"`{c}`" for c in upstream.schema.names]
    rows = read_snapshot(spark, upstream, record.path).select(*columns).toArrow().to_pylist()
    keys = upstream.key_columns
    return [Change(Op.READ, tuple(row[k] for k in keys), None, row) for row in rows]


def derivation_in_tasks(settings: Settings, client: redis.Redis, spark: SparkSession, entry: CatalogEntry,
                        plan: ViewPlan, start: HydrationStart) -> TaskDerivation | JoinRebuild | None:
    """The hydration of view ``entry``'s replacement ``plan`` in Spark's tasks, or None where it stays the
    driver's: the setting off, an operator the tasks do not run (a join other than an equi-join of two
    sources, a top-N over a join), other upstreams than the view's, or no upstream epoch at F.
    From an upstream's snapshot, the tasks read its files; else Spark SQL folds the changelog up to F."""
    if not settings.operators_in_tasks or sorted(plan.sources) != sorted(entry.sources):
        return None
    if routed_by_operator_key(plan):  # a join (a self-join reads one view), a top-N, a union
        return _join_in_tasks(settings, client, spark, entry, plan, start)
    if len(plan.sources) != 1:
        return None
    upstream = CatalogStore(settings, client).get(plan.sources[0])
    routing = one_upstream_routing(plan, upstream.key_columns, entry.partitions)
    if routing is None:
        return None
    replacement = applied_entry(entry, plan.sql, plan.schema, plan.sources, entry.version)
    if (snapshot := start.snapshots.get(upstream.name)) is not None:
        at_snapshot = DerivationPlan.at_snapshot(entry.name, upstream.name, snapshot.epoch)
        return TaskDerivation(settings, client, at_snapshot, replacement, upstream, plan, routing, spark,
                              snapshot=snapshot)
    try:
        derivation = plan_derivation(settings, client, entry.name, start.epoch, start.epoch)
    except (CatalogError, ReplayRangeError) as error:
        log.info("%s: a replacement hydrated on the driver: %s", entry.name, error)
        return None
    if derivation.last != start.epoch:
        log.info("%s: a replacement hydrated on the driver: the upstream's epochs plan through %d, not F (%d)",
                 entry.name, derivation.last, start.epoch)
        return None
    return TaskDerivation(settings, client, derivation, replacement, upstream, plan, routing, spark)


def _join_in_tasks(settings: Settings, client: redis.Redis, spark: SparkSession, entry: CatalogEntry,
                   plan: ViewPlan, start: HydrationStart) -> JoinRebuild | None:
    """An equi-join replacement's hydration in tasks (of two views, or of one with itself), a top-N's or a
    union's: each side's rows at F folded from its snapshot (if it starts from one) and its changelog up to
    its last epoch at or before F."""
    if (routing := operator_key_routing(plan, entry.partitions)) is None:
        return None
    catalog, index = CatalogStore(settings, client), EpochIndex(client, settings.topic_prefix)
    reads = {}
    for name in routing.upstreams():
        last = index.before(name, 0, start.epoch + 1)
        reads[name] = SideRead(last.epoch if last is not None else 0, start.snapshots.get(name))
    replacement = applied_entry(entry, plan.sql, plan.schema, plan.sources, entry.version)
    keyed = KeyedView(replacement, tuple(catalog.get(name) for name in routing.upstreams()), plan, routing)
    return JoinRebuild(settings, client, start.epoch, keyed, reads, spark)


def hydrate_in_tasks(derivation: TaskDerivation | JoinRebuild, replacements: ReplacementStore, replacement_id: str,
                     start: HydrationStart) -> bool:
    """The replacement's first state at ``start.epoch``: staged by the tasks, a view partition each, then
    made the replacement's in one script with its record's hydration fields; False (nothing kept) when
    the replacement was discarded or replaced meanwhile."""
    view, started = derivation.view.name, time.monotonic()
    replacements.clear_hydration(view)
    staged = derivation.staged("replacement")
    fields: dict[str, str | int] = {"hydration_epoch": start.epoch,
                                    "hydrated_from": f"{start.describe()}, in Spark's tasks"}
    if not replacements.swap_hydration(view, replacement_id, start.epoch, fields):
        return False
    log.info("%s: replacement %s hydrated in Spark's tasks at epoch %d (%d rows) in %.1f s", view, replacement_id,
             start.epoch, staged.rows, time.monotonic() - started)
    return True
