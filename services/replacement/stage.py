"""A view's staged replacement as a stage of its epoch pipeline: followed, hydrated, then cut over.

The view's consumer already reads every upstream epoch the replacement needs, so it feeds them to the
replacement too (:mod:`mvlog.services.replacement.follower`): no second reader of the upstreams, and the
cut-over happens at an epoch boundary of the one process that writes the view's changelog (no
cross-process handshake). :meth:`ReplacementStage.upkeep` picks up a staged, discarded or
apply-requested replacement and brings it to the view's MCE; :meth:`ReplacementStage.before_epoch`
feeds it each epoch and, once an apply is pending and the replacement has the epoch, takes the epoch:
its changes are the diff between the two definitions' rows, committed through the view's
:class:`~mvlog.services.pipeline.committer.EpochCommitter` like any epoch. Where the view's epochs run in
Spark's tasks, the replacement's run there too, first (:meth:`ReplacementStage.follow_in_tasks`,
:mod:`mvlog.services.replacement.tasks`), and so does the cut-over, when the replacement keys its rows
like the view (:meth:`ReplacementStage.cut_over_in_tasks`, :mod:`mvlog.services.replacement.cut_over`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame

from mvlog.catalog import CatalogEntry, CatalogError
from mvlog.changes import Mutation, Op
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter, CommittedEpoch, encode_batch
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.replacement_store import ReplacementGoneError, ReplacementRecord, ReplacementStore
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.key_order import order_member
from mvlog.replacement import APPLY_MUTATION, ReplacementError, Status, applied_entry, diff_rows
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.committer import EpochCommitter, EpochWithdrawn, ScriptCommit
from mvlog.services.pipeline.reading import UpstreamReader
from mvlog.services.pipeline.stage import EpochWork
from mvlog.services.pipeline.task_epochs import TaskEpochs
from mvlog.services.replacement.cut_over import cut_over_in_log, cut_over_in_tasks, same_keys
from mvlog.services.replacement.follower import ReplacementFollower
from mvlog.services.replacement.hydration import derivation_in_tasks, first_inputs, hydration_start
from mvlog.services.replacement.operations import plan_replacement
from mvlog.services.replacement.tasks import ReplacementCommits, follower_tasks
from mvlog.views import ChangeBatch, ViewDefinitionError, ViewOperator, ViewPlan

log = logging.getLogger(__name__)

#: ``adopt(entry, plan, operator)``: the view's definition after a cut-over, for the consumer to run.
Adopt = Callable[[CatalogEntry, ViewPlan, ViewOperator], None]


class ReplacementStage:
    """Maintains the staged replacement of view ``entry``, if any, and applies it when asked."""

    def __init__(self, entry: CatalogEntry, catalog: CatalogStore, replacements: ReplacementStore, store: ViewStore,
                 snapshots: SnapshotStore, reader: UpstreamReader, committer: EpochCommitter, adopt: Adopt) -> None:
        self.entry, self.catalog, self.replacements, self.store = entry, catalog, replacements, store
        self._snapshots, self._reader, self._committer, self._adopt = snapshots, reader, committer, adopt
        self.follower: ReplacementFollower | None = None  # the staged replacement, hydrated read-only
        #: The follower's task path, if its definition runs in tasks (built once per follower).
        self._tasks: tuple[ReplacementFollower, tuple[TaskEpochs, ReplacementCommits] | None] | None = None
        self.cut_overs_in_tasks = 0  # replacements this stage cut over in Spark's tasks

    @property
    def finished(self) -> bool:
        return False  # a replacement may be staged at any time

    @property
    def idle(self) -> bool:
        return self.follower is None  # none staged, discarded or to apply (as of the last upkeep)

    @property
    def follows_in_tasks(self) -> bool:
        """Whether the view's epochs may run in Spark's tasks with this stage's work on them done there too
        (:meth:`follow_in_tasks`, :meth:`cut_over_in_tasks`): no replacement, or a hydrated one whose
        definition runs in tasks and whose apply, if pending, they can cut over."""
        follower = self.follower
        if follower is None:
            return True
        return (follower.mce is not None and self._task_path() is not None
                and (not follower.apply_requested or self._cut_over_fits_tasks()))

    def cuts_over_in_tasks(self, resumed: bool) -> bool:
        """Whether the view's next micro-batch in tasks starts with the cut-over (:meth:`cut_over_in_tasks`):
        an apply is pending and Spark's tasks can cut over (the replacement hydrated, following in tasks,
        keying its rows like the view). Not before the view's consumer completed a micro-batch in tasks
        (``resumed``): until then some partitions may hold the view's next epoch under the old definition;
        unless the cut-over began already, which is then that epoch."""
        follower = self.follower
        return (follower is not None and self._cut_over_fits_tasks()
                and (resumed or follower.cut_epoch is not None))

    def _cut_over_fits_tasks(self) -> bool:
        follower = self.follower
        return (follower is not None and follower.mce is not None
                and (follower.apply_requested or follower.cut_epoch is not None)
                and self._task_path() is not None and same_keys(self.entry.schema, follower.plan.schema))

    def before_micro_batch(self, view_tasks: TaskEpochs, upto: int | None, batch: DataFrame | None,
                           cut_over: bool) -> bool:
        """Before the view's micro-batch in tasks (the epochs up to ``upto``, or the stream's ``batch``): the
        cut-over if ``cut_over`` (:meth:`cut_over_in_tasks`), then the replacement's epochs of the micro-batch
        where it follows in tasks (:meth:`follow_in_tasks`; else its upkeep catches it up). Whether the view
        has epochs of the micro-batch left to apply (not when a cut-over was its last epoch)."""
        if cut_over:
            self.cut_over_in_tasks(view_tasks, upto)  # adopts the new definition, its task path the follower's
        self.follow_in_tasks(self._reader, upto, batch)
        return upto is None or upto > self._committer.mce

    def cut_over_in_tasks(self, view_tasks: TaskEpochs, upto: int | None) -> bool:
        """With an apply pending (:meth:`cuts_over_in_tasks`), cut over in Spark's tasks at the view's next
        upstream epoch up to ``upto`` (or the view's plan bound): the replacement followed there first, or,
        ahead of its view after a crash, the view's epochs before the replacement's run first
        (``view_tasks``: the view's own task path). A cut-over that began already completes at its epoch.
        True when the view was cut over (its new definition adopted)."""
        follower = self.follower
        if follower is None or follower.mce is None:
            return False
        bound = view_tasks.plan_through() if upto is None else min(upto, view_tasks.plan_through())
        cut = follower.cut_epoch
        if cut is None:
            following = view_tasks.next_epoch(self._committer.mce)
            if following is None or following > bound:
                return False  # no new upstream epoch yet
            cut = max(following, follower.mce)  # the replacement's epoch when it is ahead of its view
        if cut > bound:
            return False  # past this micro-batch: the view's epochs before it go first
        if follower.mce < cut:
            # The replacement to that epoch exactly: a cut-over fixed again from the log after a Redis wipe
            # (_with_cut_over_in_log) has its replacement hydrated anew to the view's MCE.
            self.follow_in_tasks(self._reader, cut, None)
            if self.follower is not follower or follower.mce != cut:
                return False  # discarded or failed meanwhile
        if (following := view_tasks.next_epoch(self._committer.mce)) is not None and following < cut:
            view_tasks.apply(self._reader, cut - 1)  # the view's epochs before the replacement's
        if (following := view_tasks.next_epoch(self._committer.mce)) != cut:
            raise RuntimeError(f"{self.entry.name}: the replacement's cut-over is at epoch {cut}, but the view's next "
                               f"epoch is {following} (MCE {self._committer.mce})")
        view, entry = self.entry.name, self.catalog.get(self.entry.name)  # staging bumped its version
        version = entry.version + 1
        settings, spark = self._reader.settings, self._reader.spark
        if not cut_over_in_tasks(spark, settings, self.entry, follower.plan.schema, self._committer,
                                 self.replacements, follower.id, cut, self._mutation(follower, version), version,
                                 view_tasks.committer.start_offsets(), view_tasks.on_written):
            follower.apply_requested = False  # withdrawn meanwhile, or discarded: the next upkeep says which
            log.info("%s: replacement %s not cut over at epoch %d (withdrawn or discarded)", view, follower.id, cut)
            return False
        self.cut_overs_in_tasks += 1
        self._applied(entry, follower, version, cut, "in Spark's tasks")
        return True

    def follow_in_tasks(self, reader: UpstreamReader, upto: int | None, batch: DataFrame | None) -> int:
        """Before the view's micro-batch in tasks (the epochs up to ``upto``, or the stream's ``batch``):
        the replacement's epochs of it, computed and staged by Spark's tasks and committed into the
        replacement (:mod:`~mvlog.services.replacement.tasks`); the number committed."""
        follower, path = self.follower, self._task_path()
        if follower is None or follower.mce is None or path is None:
            return 0  # none in tasks, or not hydrated yet: nothing to follow from
        try:
            return path[0].apply(reader, upto, batch)
        except ReplacementGoneError:
            self.follower = None  # discarded, or replaced by another: the next upkeep picks that up
        except Exception as error:  # a broken replacement must not stop the view
            self._failed(follower.id, error)
        return 0

    @property
    def epochs_in_tasks(self) -> int:
        """Epochs of the current replacement committed by Spark's tasks (by this consumer)."""
        return self._tasks[1][1].epochs_committed if self._tasks is not None and self._tasks[1] is not None else 0

    def _task_path(self) -> tuple[TaskEpochs, ReplacementCommits] | None:
        follower = self.follower
        if follower is None:
            return None
        if self._tasks is None or self._tasks[0] is not follower:
            reader = self._reader
            self._tasks = (follower, follower_tasks(reader.settings, self.store.redis, self.entry, reader.upstreams,
                                                    follower, self.replacements))
        return self._tasks[1]

    def upkeep(self) -> None:
        """Pick up a staged, discarded or apply-requested replacement and bring it to the view's MCE:
        hydrated from scratch, or caught up after a restart."""
        record = self.replacements.record(self.entry.name)
        if record is None or record.status is not Status.STAGED or "error" in (record.fields or {}):
            self.follower = None
            return
        follower, mce = self.follower, self._committer.mce
        if follower is None or follower.id != record.id:
            try:
                plan = plan_replacement(self.catalog, self.entry, record.sql)
            except (CatalogError, ViewDefinitionError) as error:
                self._failed(record.id, error)
                return
            record = self._with_cut_over_in_log(record)
            follower = self.follower = ReplacementFollower(record, plan, self.replacements)
        follower.apply_requested, follower.cut_epoch = record.apply_requested, record.cut_epoch
        if follower.mce is None:
            # Each upstream from its snapshot or its whole changelog: a trimmed changelog alone would give
            # the replacement wrong rows, and its apply a wrong diff.
            upstreams = self._reader.upstreams
            try:
                start = hydration_start(self._reader.settings, self.store, self._snapshots, upstreams, mce)
            except ReplacementError as error:
                self._failed(record.id, error)
                return
            settings, spark = self._reader.settings, self._reader.spark
            derivation = derivation_in_tasks(settings, self.store.redis, spark, self.entry, follower.plan, start)
            if derivation is not None:
                follower.start_in_tasks(derivation, start)
            else:
                follower.start(start.epoch, first_inputs(start, spark, upstreams, self._reader.changes),
                               start.describe())
            if follower.stale:
                self.follower = None
                return
        if follower.mce is not None and follower.mce < mce:  # up to the view: in tasks where it runs there
            self.follow_in_tasks(self._reader, mce, None)
        if self.follower is follower and (follower.mce is None or follower.mce < mce):
            follower.hydrate(mce, lambda after, upto: self._reader.history(self.entry.sources, after, upto))

    def _with_cut_over_in_log(self, record: ReplacementRecord) -> ReplacementRecord:
        """``record``, with its cut-over fixed again where the view's partitions hold one of it above the
        MCE that the record does not know of (:func:`cut_over_in_log`: Redis lost the record mid cut-over),
        so that Spark's tasks complete the cut-over at that epoch instead of the view refusing it. Not on
        the driver's way when every partition holds it: that is the driver's one transaction of the
        cut-over, which its roll-forward completes."""
        if record.cut_epoch is not None:
            return record
        view, mce, settings = self.entry.name, self._committer.mce, self._reader.settings
        offsets = self.store.index.offsets_after(view, self.entry.partitions, mce or None)
        held = cut_over_in_log(settings, self.entry, offsets, record.id)
        if not held or (len(held) == self.entry.partitions and not settings.operators_in_tasks):
            return record
        cut = min(held.values())
        if not self.replacements.resume_cut_over(view, record.id, cut):
            return record
        log.warning("%s: replacement %s's cut-over at epoch %d is in the changelog but not in its record (Redis "
                    "lost it): completing it there", view, record.id, cut)
        return self.replacements.record(view) or record

    def before_epoch(self, work: EpochWork) -> None:
        """Feed the epoch to the replacement; cut over to it at this epoch when an apply is pending."""
        follower = self.follower
        if follower is None:
            return
        try:
            follower.follow(work.epoch, work.inputs)
        except Exception as error:  # a broken replacement must not stop the view
            self._failed(follower.id, error)
            return
        if follower.stale:
            self.follower = None
        elif follower.cut_epoch is not None:  # some partitions may hold it: the driver's way would write them again
            raise RuntimeError(f"{self.entry.name}: the replacement's cut-over began in Spark's tasks at epoch "
                               f"{follower.cut_epoch}; only they can complete it (MVLOG_OPERATORS_IN_TASKS=true)")
        elif follower.apply_requested and follower.mce == work.epoch:
            # Exactly there: a replacement ahead of the view (its epochs committed first, the view's not,
            # before a crash) is cut over once the view reaches it.
            work.taken = self._cut_over(work.epoch, follower)

    def after_commit(self, work: EpochWork) -> None:
        pass

    def _failed(self, replacement_id: str, error: BaseException) -> None:
        """A replacement that cannot be maintained stops; the view itself carries on unchanged."""
        log.warning("%s: replacement %s stopped: %s", self.entry.name, replacement_id, error)
        self.replacements.fail(self.entry.name, replacement_id, f"{type(error).__name__}: {error}")
        self.follower = None

    def _cut_over(self, epoch: int, follower: ReplacementFollower) -> bool:
        """Epoch ``epoch``'s changes are diff(view rows at the MCE, replacement rows at ``epoch``), with an
        apply_replacement mutation on its barriers; then one Redis script moves the replacement's rows
        and state into the view's and commits the epoch. False (nothing applied) when the apply was
        withdrawn or discarded meanwhile: the epoch is then redone under the old definition, and readers
        drop the Kafka attempt by the chain rule, as for any epoch that reached Kafka but not Redis."""
        view, schema = self.entry.name, follower.plan.schema
        entry = self.catalog.get(view)  # staging bumped its version
        version = entry.version + 1
        _, old_raw, _, new_raw = self.replacements.read_both(view)
        old = {self.entry.schema.key_of(row): row for row in map(decode_row, old_raw.values())}
        new = {schema.key_of(row): row for row in map(decode_row, new_raw.values())}
        changes = ChangeBatch.from_changes(schema, diff_rows(old, new, schema))
        mutation = self._mutation(follower, version)
        encoded = encode_batch(self.entry.key_columns, changes)
        # The key-order index (backfills of views built on this one read it) follows the diff.
        members: dict[str, list[bytes]] = {}
        for op, key, vnode, key_bytes in zip(encoded.ops, changes.keys, encoded.vnodes, encoded.keys, strict=True):
            members.setdefault(op, []).append(order_member(vnode, key, key_bytes))
        added, removed = members.get(Op.CREATE.value, []), members.get(Op.DELETE.value, [])
        follows = self._committer.mce

        def produce(writer: ChangelogWriter) -> CommittedEpoch:
            return writer.commit_batches(epoch, follows, [encoded], mutation=mutation)

        def apply(index: Mapping[int, IndexEntry]) -> bool:
            if not self.replacements.apply(view, follower.id, epoch, index, version, added, removed):
                raise EpochWithdrawn(f"{view}: replacement {follower.id} withdrawn or discarded")
            return True

        if self._committer.commit(epoch, produce, ScriptCommit(apply)) is None:
            follower.apply_requested = False
            log.info("%s: replacement %s not applied at epoch %d (withdrawn or discarded)", view, follower.id, epoch)
            return False
        self._applied(entry, follower, version, epoch, f"{len(changes)} change(s)")
        return True

    def _mutation(self, follower: ReplacementFollower, version: int) -> Mutation:
        """What the cut-over's barriers carry (the same in every attempt at it)."""
        return Mutation(APPLY_MUTATION, self.entry.name, {"replacement_id": follower.id, "sql": follower.sql,
                                                           "previous_sql": self.entry.sql, "version": version})

    def _applied(self, entry: CatalogEntry, follower: ReplacementFollower, version: int, epoch: int,
                 how: str) -> None:
        """After the cut-over's commit: the catalog's entry rewritten, the new definition adopted."""
        self.entry = applied_entry(entry, follower.sql, follower.plan.schema, follower.plan.sources, version)
        self.catalog.put(self.entry)
        self._adopt(self.entry, follower.plan, follower.operator)
        self.follower = None
        log.info("%s: replacement %s applied at epoch %d (%s), version %d", entry.name, follower.id, epoch, how,
                 version)
