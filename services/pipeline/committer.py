"""The one owner of an epoch's commit order: Kafka first, then Redis, Redis rolled forward when behind.

Every writer of a changelog commits its epochs the same way, whether it is a table writer, a view
consumer, a snapshot load or a replacement's cut-over:

1. **Redis holds the MCE the writer follows**, before the epoch is computed and again after: a table's
   before-images and a view's operator state are read from Redis, and a wiped Redis would read as "no
   rows". When it does not, the object is recovered from Kafka (the control plane rebuilt, or another
   process's rebuild waited for; then its rows rolled forward over its own changelog) and the epoch is
   computed again (:meth:`EpochCommitter.compute`).
2. **The Kafka transaction**: the epoch's changes and barriers (and a table's consumed input offsets), on
   the object's :class:`~mvlog.connectors.kafka.changelog_writer.ChangelogWriter`, whose transactional id
   fenced every earlier writer of the object.
3. **The Redis commit**: rows, state, epoch index and MCE at once. Its form is the caller's
   (:class:`RedisSide`): a table streams its commands while the epoch is produced
   (:class:`~mvlog.connectors.redis.streamed_commit.StreamedCommit` is one), a view runs one script, a snapshot
   load swaps staged keys in, a cut-over moves the replacement's keys into the view's.
4. **Redis lost meanwhile** (wiped, or the commit found an MCE it does not follow): recover as in 1, with
   the epoch's barriers as proof that it committed (:attr:`EpochCommitter.last_committed`: on a broker
   or a rebuilt index that cannot tell, the roll-forward would otherwise abandon it).
5. **Refused** (Redis already at or above the epoch, with no wipe to explain it): another writer of the
   object is running; :class:`AnotherWriterError`.

Where the epoch becomes final differs between writers, and is said once, by :class:`CommitPoint`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from typing import Any, Protocol, TypeVar, overload

import redis

from mvlog.catalog import CatalogEntry, ViewDroppedError
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, CommittedEpoch
from mvlog.connectors.kafka.retention import has_records
from mvlog.connectors.recovery import LogTail, roll_forward
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.view_store import Lifecycle, ServingStateLostError, ViewStore
from mvlog.services.control_plane import recover_after_wipe

log = logging.getLogger(__name__)

T = TypeVar("T")


class CommitPoint(Enum):
    """Where an epoch becomes final, which decides what the writer follows after a crash or a wipe."""

    #: A table writer: the epoch's transaction commits its input (a source's consumed offsets, rows
    #: nobody can send again), so once Kafka committed it, it is the epoch the next one follows, and Redis
    #: is rolled forward to it. Redis found at any other MCE after a recovery means another writer.
    KAFKA = "kafka"
    #: A view consumer: its input is its upstreams' changelogs, read again at will, so Redis is the commit
    #: point; an epoch that reached Kafka only is redone under a new transaction and readers drop the
    #: abandoned attempt (the chain rule). A recovery may find Redis past the consumer (its own epochs
    #: that reached Kafka), which the consumer then skips.
    REDIS = "redis"


class RedisSide(Protocol):
    """The Redis half of one epoch's commit, made before the Kafka transaction, finished after it."""

    def finish(self, index: Mapping[int, IndexEntry]) -> bool:
        """Apply the epoch (``index``: its barriers' offsets): True when applied, False when Redis refused
        it (at or below its MCE). Raises :class:`ServingStateLostError` when Redis lost the MCE it
        follows, :class:`EpochWithdrawn` to decline the epoch on purpose."""
        ...

    def abort(self) -> None:
        """Forget what was prepared: the Kafka transaction did not commit."""
        ...


class ScriptCommit:
    """A :class:`RedisSide` that prepares nothing and applies the epoch with one call (a script)."""

    def __init__(self, apply: Callable[[Mapping[int, IndexEntry]], bool]) -> None:
        self._apply = apply

    def finish(self, index: Mapping[int, IndexEntry]) -> bool:
        return self._apply(index)

    def abort(self) -> None:
        pass


class EpochWithdrawn(Exception):  # noqa: N818 (an outcome, not a failure)
    """Raised by a :class:`RedisSide` that declines its epoch after Kafka committed it (a replacement whose
    apply was withdrawn meanwhile): readers drop the Kafka attempt by the chain rule, and the writer
    redoes the epoch. Only a :attr:`CommitPoint.REDIS` writer may do that."""


class AnotherWriterError(RuntimeError):
    """Redis refused an epoch it should have taken: another writer of the object is running."""


class EpochCommitter:
    """Commits the epochs of one table or view, in the order this module describes, and recovers it.

    :attr:`mce` is the epoch the next one follows; :attr:`last_committed`, the barriers of the last epoch
    this writer committed to Kafka: proof for a roll-forward that Redis lost it.
    """

    def __init__(self, settings: Settings, client: redis.Redis, entry: CatalogEntry, *, commit_point: CommitPoint,
                 derived_state: bool, lifecycle: Callable[[], Lifecycle] = lambda: Lifecycle.LIVE,
                 catalog: CatalogStore | None = None, rederive: Callable[[], object] | None = None) -> None:
        """``derived_state``: the object has operator state that only the control-plane rebuild re-derives
        (a view), so a missing control-plane marker counts as lost state too, and is waited for; a table's
        state is its rows, which its own roll-forward restores. ``lifecycle``: the state to set after a
        recovery (a view still backfilling stays so). ``rederive``: re-derives a view's operator state
        that a rebuild left to its consumer (:func:`~mvlog.services.rederive.state_rebuild.restore_or_leave`),
        before the next epoch is computed."""
        self.settings, self.entry, self.commit_point = settings, entry, commit_point
        self._redis, self._derived_state, self._lifecycle = client, derived_state, lifecycle
        self._rederive = rederive
        self.store = ViewStore(client, settings.topic_prefix)
        self.catalog = catalog or CatalogStore(settings, client)
        # A new transactional producer fences every earlier writer of the object.
        self.writer = self._new_writer()
        self.mce = 0
        self.last_committed: dict[int, IndexEntry] | None = None
        self.epochs_committed = 0  # by this committer
        self._reload()

    @classmethod
    def for_table(cls, settings: Settings, client: redis.Redis, entry: CatalogEntry) -> EpochCommitter:
        return cls(settings, client, entry, commit_point=CommitPoint.KAFKA, derived_state=False)

    @classmethod
    def for_view(cls, settings: Settings, client: redis.Redis, entry: CatalogEntry, catalog: CatalogStore,
                 lifecycle: Callable[[], Lifecycle], rederive: Callable[[], object]) -> EpochCommitter:
        return cls(settings, client, entry, commit_point=CommitPoint.REDIS, derived_state=True,
                   lifecycle=lifecycle, catalog=catalog, rederive=rederive)

    @property
    def name(self) -> str:
        return self.entry.name

    def _new_writer(self, producer_config: Mapping[str, Any] | None = None) -> ChangelogWriter:
        return ChangelogWriter(self.settings, self.entry.name, self.entry.key_columns, self.entry.partitions,
                               producer_config=dict(producer_config or {}) or None)

    def _reload(self) -> None:
        """Follow what Redis holds now (at the start, after a roll-forward)."""
        self.mce = self.store.mce(self.name) or 0
        self.last_committed = self.store.index.entries_at(self.name, self.entry.partitions, self.mce or None)

    # --- at the start -----------------------------------------------------------------------------

    def roll_forward(self, downstreams: list[CatalogEntry]) -> LogTail:
        """Apply the epochs a killed writer left in Kafka only (a table's start); ``downstreams``, the views
        built on the object, prove its last epoch committed should Redis have lost it. With the
        :attr:`CommitPoint.KAFKA` point the log's last epoch is final too (this writer fenced the one that
        wrote it, and its transaction committed a source's offsets): it is applied, never abandoned."""
        tail = roll_forward(self.settings, self.store, self.entry, downstreams=downstreams,
                            last_is_final=self.commit_point is CommitPoint.KAFKA)
        self._reload()
        return tail

    def rebuild_if_wiped(self) -> None:
        """Rebuild Redis from Kafka (or wait for another process's rebuild) when it was wiped and the
        object's changelog has epochs (a view consumer's start)."""
        if (self.store.mce(self.name) is None or self.catalog.wiped()) and has_records(
                self.settings, self.settings.changelog_topic(self.name), self.entry.partitions):
            recover_after_wipe(self.settings, self._redis, self.entry, None)
        self._rederive_if_left()
        self._reload()

    # --- committing -------------------------------------------------------------------------------

    @overload
    def compute(self, compute: Callable[[], T]) -> T: ...

    @overload
    def compute(self, compute: Callable[[], T], epoch: int) -> T | None: ...

    def compute(self, compute: Callable[[], T], epoch: int | None = None) -> T | None:
        """``compute()`` from the serving state at :attr:`mce`: a lost Redis is recovered first, and the
        epoch computed again when it was lost while ``compute`` ran. None when the recovered state
        already holds ``epoch`` (its commit was rolled forward)."""
        self.ensure_serving_state()
        output = compute()
        while self.ensure_serving_state():
            if epoch is not None and epoch <= self.mce:
                return None
            output = compute()
        return output

    def commit(self, epoch: int, produce: Callable[[ChangelogWriter], CommittedEpoch],
               redis_side: RedisSide) -> CommittedEpoch | None:
        """Commit ``epoch``: ``produce(writer)`` runs its Kafka transaction (following :attr:`mce`), then
        ``redis_side`` applies it to Redis. None when the Redis side withdrew it (:class:`EpochWithdrawn`).
        """
        try:
            committed = produce(self.writer)
        except BaseException:
            redis_side.abort()
            raise
        proof, self.last_committed = self.last_committed, committed.index
        if self.commit_point is CommitPoint.KAFKA:
            self.mce = epoch
        try:
            applied = redis_side.finish(committed.index) or self.store.holds(self.name, epoch)  # a retry's
            lost = self._derived_state and self.catalog.wiped()  # committed into a Redis being rebuilt
        except ServingStateLostError:
            applied, lost = False, True
        except EpochWithdrawn:
            assert self.commit_point is CommitPoint.REDIS, "only a Redis commit point may redo an epoch"
            self.last_committed = proof
            return None
        if lost:
            self.recover()  # waits for the rebuild, rolls Redis forward over this epoch too
            applied = self.mce == epoch
        if not applied:
            raise AnotherWriterError(f"{self.entry.kind} {self.name}: epoch {epoch} is at or below the MCE in Redis "
                                     f"({self.store.mce(self.name)}); another writer of it is running")
        self.mce = epoch
        self.epochs_committed += 1
        return committed

    @contextmanager
    def writer_configured(self, producer_config: Mapping[str, Any]) -> Iterator[None]:
        """Commit with a writer of ``producer_config`` meanwhile (a snapshot load's long transaction and
        bounded queue). Same transactional id: it fences the usual writer, which is made again after."""
        self.writer.close()
        self.writer = self._new_writer(producer_config)
        try:
            yield
        finally:
            self.writer.close()
            self.writer = self._new_writer()

    # --- recovering -------------------------------------------------------------------------------

    def ensure_serving_state(self) -> bool:
        """True when Redis had lost the object's state (wiped) and it was recovered from Kafka (or a rebuild
        left a view's operator state to this consumer, which re-derived it now)."""
        mce, left = self.store.mce_and_rederive(self.name)
        if mce == (self.mce or None) and not (self._derived_state and self.catalog.wiped()):
            return left and self._rederive_if_left(marked=True)
        if self.catalog.find(self.name) is None and not self.catalog.wiped():
            raise ViewDroppedError(f"{self.name}: the {self.entry.kind} was dropped while this process wrote it")
        self.recover()
        return True

    def recover(self) -> None:
        """Rebuild the object's Redis state from Kafka, with :attr:`last_committed` as proof, and follow it."""
        log.warning("%s: Redis no longer holds its MCE %d: rebuilding from Kafka", self.name, self.mce)
        mce = recover_after_wipe(self.settings, self._redis, self.entry, self.last_committed) or 0
        if mce < self.mce:
            raise RuntimeError(f"{self.name}: Redis could only be rebuilt up to epoch {mce}, below this writer's "
                               f"{self.mce}")
        if mce > self.mce and self.commit_point is CommitPoint.KAFKA:
            raise AnotherWriterError(f"{self.entry.kind} {self.name}: Redis is at epoch {mce}, this writer at "
                                     f"{self.mce}; another writer of it is running")
        self.mce = mce
        self._rederive_if_left()
        self.store.set_lifecycle(self.name, self._lifecycle())

    def _rederive_if_left(self, *, marked: bool | None = None) -> bool:
        """Re-derive the view's operator state if a rebuild left it to this consumer; True if it did.
        ``marked``: whether the caller just read the rebuild's mark (None: read it here)."""
        if marked is None:
            marked = self.store.mce_and_rederive(self.name)[1]
        if self._rederive is None or not marked:
            return False
        self._rederive()
        return True

    def close(self) -> None:
        self.writer.close()
