"""A view's operator state at its MCE, re-derived from its upstreams' serving rows after a Redis wipe.

No changelog holds a view's operator state (per-group sums and counts, the min/max multisets, a join's
indexes of both sides), but it is a function of the upstream rows at the view's MCE: fed to the operator
as one epoch of ``READ`` changes (its hydration path), they give back that state and the view's rows.
During a rebuild the upstreams come back first (dependency order), so those rows are in Redis already
(:func:`~mvlog.connectors.rows_at_epoch.rows_at_epoch`: its serving rows with its later epochs undone).
This replaces reading each upstream's whole changelog per view, which made a rebuild minutes long.

A view still backfilling holds the upstream keys its positions cover only: only those take part, on
either path.

With the operators in Spark's tasks (``Settings.operators_in_tasks``), a rebuild leaves the operator state
of a view the tasks can re-derive to that view's consumer (:func:`restore_or_leave`: marked ``rederive``
in its ``meta``), which has a Spark session, and whose writer re-derives it before its next epoch
(:func:`rederive_state`): Spark SQL folds the upstream's changelog up to the epoch before the MCE, and a task
per view partition computes that epoch and stages its partition's rows and state, swapped in by the driver
in one step (:meth:`~mvlog.services.rederive.tasks.TaskDerivation.rebuild`); a two-view join's tasks
are one per join-key partition, each hydrating its join keys from both sides' folded changelogs
(:mod:`mvlog.services.rederive.join_tasks`). The process that rebuilds never holds the upstreams' rows
then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from pyspark.sql import SparkSession

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
from mvlog.services.rederive.derive import RedisRebuildSink, plan_derivation
from mvlog.services.view_ddl import plan_for
from mvlog.views import ChangeBatch, InMemoryState, ViewOperator
from mvlog.views.key_routing import one_upstream_routing
from mvlog.views.keyed_routing import routed_by_operator_key

log = logging.getLogger(__name__)

#: How long a writer retries restoring its view's state while an upstream is behind the view in Redis.
RESTORE_TIMEOUT_S = 120.0

T = TypeVar("T")


class ViewNotRestorableError(RuntimeError):
    """A view's operator state cannot be re-derived yet (an upstream is behind it in Redis, or the view's
    consumer committed meanwhile): left to the view's own consumer, which restores itself."""


def until_restorable(attempt: Callable[[], T], timeout: float = RESTORE_TIMEOUT_S) -> T:
    """``attempt()``, tried again every half second while it raises :class:`ViewNotRestorableError` (an
    upstream catching up), for ``timeout`` seconds at most."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return attempt()
        except ViewNotRestorableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


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


def left_to_consumer(settings: Settings, client: redis.Redis, entry: CatalogEntry) -> bool:
    """Whether a rebuild leaves ``entry``'s operator state to the view's consumer: the operators run in
    Spark's tasks (``Settings.operators_in_tasks``, the deployment's setting), the view's operator is one
    they run (one upstream by key or by group, an equi-join of two views or of one with itself, a top-N, a
    union). A view still backfilling is re-derived by its tasks from the upstream keys its
    backfill covers (:attr:`~mvlog.services.rederive.tasks.DeriveJob.covers`)."""
    if not settings.operators_in_tasks or entry.kind != "view":
        return False
    catalog = CatalogStore(settings, client)
    plan = plan_for(catalog, entry.name, entry.sql or "")
    if routed_by_operator_key(plan):  # a join, a GROUP BY over one, a top-N, a union (of any views)
        return True
    return (len(entry.sources) == 1
            and one_upstream_routing(plan, catalog.get(entry.sources[0]).key_columns, entry.partitions) is not None)


def restore_or_leave(settings: Settings, client: redis.Redis, entry: CatalogEntry) -> None:
    """A rebuild's step for view ``entry``: its operator state re-derived now, or left to its consumer
    (marked, see :func:`left_to_consumer`)."""
    if left_to_consumer(settings, client, entry):
        ViewStore(client, settings.topic_prefix).mark_rederive(entry.name)
        log.info("%s: operator state left for the view's consumer to re-derive in Spark's tasks", entry.name)
        return
    restore_view_state(settings, client, entry)


def rederive_state(settings: Settings, client: redis.Redis, entry: CatalogEntry, spark: SparkSession | None
                   ) -> int | None:
    """The consumer's side of :func:`restore_or_leave`: re-derive the view's operator state (and rows) at
    its MCE, in Spark's tasks when ``spark`` is given and the tasks can (else the driver's way), and clear
    the mark; retried while an upstream is behind the view in Redis. Returns the MCE."""
    def attempt() -> int | None:
        mce = _rederive_in_tasks(settings, client, entry, spark) if spark is not None else None
        if mce is None:
            mce = restore_view_state(settings, client, entry)
        ViewStore(client, settings.topic_prefix).clear_rederive(entry.name)
        return mce

    return until_restorable(attempt)


def _rederive_in_tasks(settings: Settings, client: redis.Redis, entry: CatalogEntry, spark: SparkSession
                       ) -> int | None:
    """:func:`restore_view_state` computed by Spark's tasks
    (:meth:`~mvlog.services.rederive.tasks.TaskDerivation.rebuild` of the MCE alone, or a join's
    :class:`~mvlog.services.rederive.join_tasks.JoinRebuild`; an upstream whose changelog no longer starts at
    its first epoch read from its snapshot, :func:`~mvlog.services.rederive.plan_derivation`); None when the
    tasks cannot (an operator they do not run, an upstream with neither its whole changelog nor a snapshot)."""
    # Their Spark jobs: imported in a consumer's process only.
    from mvlog.services.rederive.join_tasks import JoinRebuild
    from mvlog.services.rederive.tasks import TaskDerivation

    store = ViewStore(client, settings.topic_prefix)
    mce = store.mce(entry.name)
    if mce is None:
        return None
    for upstream, at in store.mce_many(entry.sources).items():
        if (at or 0) < mce:
            raise ViewNotRestorableError(f"{entry.name}: its upstream {upstream} is at epoch {at} in Redis, "
                                         f"below the view's MCE {mce}")
    catalog = CatalogStore(settings, client)
    covers = _backfill_coverage(store, entry, {name: catalog.get(name) for name in entry.sources})
    derivation: TaskDerivation | JoinRebuild | None
    try:
        plan = plan_derivation(settings, client, entry.name, mce, mce)
        derivation = (JoinRebuild.for_plan(settings, client, plan, spark, covers)
                      or TaskDerivation.for_plan(settings, client, plan, spark, covers))
    except ReplayRangeError as exc:
        log.warning("%s: operator state re-derived the driver's way: %s", entry.name, exc)
        return None
    if derivation is None:
        return None
    started = time.monotonic()
    try:
        rebuilt = derivation.rebuild()
    except ReplayRangeError as exc:  # the MCE moved: another consumer of the view runs
        raise ViewNotRestorableError(str(exc)) from exc
    log.warning("%s: operator state re-derived in Spark's tasks at epoch %d (%d rows) in %.1f s", entry.name, mce,
                rebuilt.rows, time.monotonic() - started, extra={"rederived_in_tasks": entry.name})
    return mce
