"""Rebuilding Redis from Kafka after it was wiped (invariant I6): nothing an operator has to do.

Redis is a projection of Kafka. After a wipe (FLUSHALL, a new empty Redis), the first mvlog process
that notices rebuilds it, under a Redis lock so several processes noticing at once rebuild it once:

1. the catalog, from the compacted catalog topic;
2. per table and view, in dependency order: rows, epoch index and MCE, by rolling the (empty) serving
   state forward over the object's own changelog, and a chunked backfill's positions, counters and
   journal from the ``backfill_progress`` mutations on its barriers;
3. per view, its operator state, which no changelog holds: re-derived from the upstreams' rows at the
   view's MCE, just restored (see :mod:`mvlog.services.rederive.state_rebuild`), then swapped in with the rows;
   for a view still backfilling, from the upstream keys its positions cover only (what its rows hold);
   an object's last epoch that nothing proved committed is applied once a view built on it turns up;
4. every step registered with :func:`register_rebuild_step`, in registration order;
5. the control-plane marker, whose absence is how a wipe is recognised.

Who notices: a table writer or view consumer whose epoch commit finds Redis no longer at its MCE
(``ServingStateLostError``, or an MCE that went missing), and ``CatalogStore.get`` for the catalog.
A live process passes the barriers of its own last committed epoch as proof to the roll-forward: on a
broker that delivers aborted records (Tansu), the index or a later barrier is what proves a changelog's
last epoch committed. The proof is never put in the index ahead of the roll-forward, which extends the
index in epoch order: a reader meeting a half-rebuilt index with the last epoch alone in it would plan
that epoch next and skip the ones before it (a view two epochs or more behind would lose those).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from graphlib import TopologicalSorter

import redis
from redis.exceptions import LockError

from mvlog.catalog import CatalogEntry
from mvlog.changes import IndexEntry
from mvlog.config import Settings
from mvlog.connectors.recovery import ChangelogTrimmedError, LogTail, commit_held, roll_forward
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.epoch import SEQUENCE_MASK, epoch_from_millis
from mvlog.services.rederive.state_rebuild import (
    RESTORE_TIMEOUT_S,
    ViewNotRestorableError,
    restore_or_leave,
    until_restorable,
)

log = logging.getLogger(__name__)

RebuildStep = Callable[[Settings, redis.Redis, CatalogEntry], None]
_REBUILD_STEPS: list[RebuildStep] = []
LOCK_TIMEOUT_S = 600.0  # how long a process waits for another one's rebuild
LOCK_LEASE_S = 15.0  # the rebuild lock's lease, renewed while the rebuild runs


def rebuild_lock_name(prefix: str) -> str:
    """The Redis lock a rebuild holds (a Redis key, so it is gone with a wipe too)."""
    return f"{prefix}:control-plane:rebuild"


def rebuild_running(client: redis.Redis, prefix: str) -> bool:
    """Whether a process holds the rebuild's lock right now."""
    return bool(client.exists(rebuild_lock_name(prefix)))


@contextmanager
def _rebuild_lock(client: redis.Redis, name: str) -> Iterator[None]:
    """The lock of one rebuild, its lease renewed every third of :data:`LOCK_LEASE_S` while held.

    A rebuild takes seconds to minutes (it reads every changelog), and the process running it may be
    killed half-way: a lease as long as the longest rebuild would then keep every other process waiting
    that long. With a short renewed lease the next process takes over within ``LOCK_LEASE_S``, and
    finishes the rebuild (each step starts from what Redis holds, epoch commits are atomic).
    """
    lock = client.lock(name, timeout=LOCK_LEASE_S, blocking_timeout=LOCK_TIMEOUT_S, thread_local=False)
    if not lock.acquire():
        raise LockError(f"{name}: another process has been rebuilding for more than {LOCK_TIMEOUT_S:.0f} s")
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(LOCK_LEASE_S / 3):
            try:
                lock.extend(LOCK_LEASE_S, replace_ttl=True)
            except (LockError, redis.RedisError) as exc:  # lost it: the rebuild goes on, the next one redoes it
                log.warning("rebuild lock %s: %s", name, exc)
                return

    renewer = threading.Thread(target=renew, name="mvlog-rebuild-lock", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        with contextlib.suppress(LockError):
            lock.release()


def register_rebuild_step(step: RebuildStep) -> RebuildStep:
    """Run ``step(settings, client, entry)`` for every table and view (dependency order) after the rows,
    index and MCE are back, during a rebuild. Usable as a decorator."""
    if step not in _REBUILD_STEPS:
        _REBUILD_STEPS.append(step)
    return step


def restore(settings: Settings, client: redis.Redis, entry: CatalogEntry,
            own_last: dict[int, IndexEntry] | None = None, derive_state: bool | None = None,
            upto_epoch: int | None = None) -> int | None:
    """Bring one table or view's serving state back from Kafka; returns its MCE.

    ``own_last``: the index entries of the last epoch the caller (the object's writer) committed: the
    proof that it committed, for the roll-forward (see :func:`~mvlog.connectors.recovery.roll_forward`).
    ``derive_state``: re-derive a view's operator state, or leave it to the view's consumer
    (:func:`~mvlog.services.rederive.state_rebuild.restore_or_leave`; default: when Redis had no MCE for it).
    ``upto_epoch``: roll forward no further (the object's writer may be running; see ``roll_forward``).
    """
    store = ViewStore(client, settings.topic_prefix)
    before = store.mce(entry.name)
    downstreams = CatalogStore(settings, client).views_reading(entry.name) if before is None else []
    after = roll_forward(settings, store, entry, proven=own_last, downstreams=downstreams,
                         upto_epoch=upto_epoch).last_committed
    if entry.kind == "view" and after and (derive_state or (derive_state is None and before is None)):
        restore_or_leave(settings, client, entry)  # (left to the view's consumer: the caller, or its next run)
    return store.mce(entry.name)


def ensure_control_plane(settings: Settings, client: redis.Redis,
                         proven: Mapping[str, dict[int, IndexEntry] | None] | None = None) -> bool:
    """Rebuild everything from Kafka if Redis was wiped; True if this call rebuilt it.

    Objects whose state cannot be restored yet (a view whose upstream is behind it) are left to their
    own process, which restores them with :func:`restore` once its upstream is back. ``proven``: per
    table or view, the barriers of the last epoch the caller committed to it (see :func:`restore`).
    """
    catalog = CatalogStore(settings, client)
    if not catalog.wiped():
        return False
    with _rebuild_lock(client, rebuild_lock_name(settings.topic_prefix)):
        if not catalog.wiped():
            return False  # another process rebuilt it while we waited
        started = time.monotonic()
        # Writers of the other objects may be running (a table writer restarted meanwhile, say): their
        # changelogs never go idle, so each is rolled forward up to the epochs opened before now.
        upto = epoch_from_millis(time.time_ns() // 1_000_000, SEQUENCE_MASK)
        loaded = catalog.rebuild_from_topic()
        entries = {e.name: e for e in catalog.all()}
        order = TopologicalSorter({name: [s for s in e.sources if s in entries] for name, e in entries.items()})
        took: dict[str, float] = {}
        held: dict[str, LogTail] = {}  # objects whose last epoch awaits a view built on it as proof
        store = ViewStore(client, settings.topic_prefix)
        for name in order.static_order():
            entry = entries[name]
            took[name] = time.monotonic()
            own = (proven or {}).get(name)
            try:
                tail = roll_forward(settings, store, entry, proven=own, upto_epoch=None if own else upto)
            except ChangelogTrimmedError as error:  # that object stays down, with the reason; the rest goes on
                log.error("rebuild: %s", error)
                store.set_lifecycle(name, Lifecycle.FAILED, str(error))
                took[name] = time.monotonic() - took[name]
                continue
            if tail.held is not None:
                held[name] = tail
            if tail.last_committed and store.lifecycle(name) is None:  # a backfill's epochs restored their own
                store.set_lifecycle(name, Lifecycle.LIVE)
            for source in entry.sources:  # this view's epochs prove its upstreams' last ones committed
                waiting = held.get(source)
                if waiting is not None and waiting.held is not None and (
                        waiting.held.epoch in tail.seen or store.index.at(name, 0, waiting.held.epoch)):
                    commit_held(store, entries[source], held.pop(source))
                    if entries[source].kind == "view":
                        _restore_state(settings, client, entries[source])
            if entry.kind == "view":  # always: a rebuilder killed half-way may have left rows without it
                _restore_state(settings, client, entry)
            for step in _REBUILD_STEPS:
                step(settings, client, entry)
            took[name] = time.monotonic() - took[name]
        catalog.mark_rebuilt()
        catalog.close()
    log.warning("Redis was wiped: rebuilt %d catalog entries and their state from Kafka in %.1f s (%s)",
                loaded, time.monotonic() - started, ", ".join(f"{n} {s:.1f} s" for n, s in took.items()))
    return True


def _restore_state(settings: Settings, client: redis.Redis, entry: CatalogEntry) -> None:
    try:
        restore_or_leave(settings, client, entry)
    except ViewNotRestorableError as exc:  # left to the view's consumer, which restores itself
        log.warning("rebuild: %s", exc)


def recover_after_wipe(settings: Settings, client: redis.Redis, entry: CatalogEntry,
                       own_last: dict[int, IndexEntry] | None, timeout: float = RESTORE_TIMEOUT_S) -> int | None:
    """What a live writer does on finding Redis wiped: make sure the control plane is rebuilt (its own
    last epoch proven committed by ``own_last``), then restore its own state (retrying while its upstream
    catches up)."""
    ensure_control_plane(settings, client, {entry.name: own_last})
    return until_restorable(lambda: restore(settings, client, entry, own_last, derive_state=True), timeout)
