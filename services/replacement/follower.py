"""A staged replacement maintained read-only inside its view's consumer.

The view's Spark consumer already reads every upstream epoch the replacement needs, so it also feeds
them to the replacement's operator: no second reader of the upstream, and the cut-over happens at an
epoch boundary of the one process that writes the view's changelog (no cross-process handshake).
Per epoch the replacement commits first (its own Redis keys, see
:mod:`mvlog.connectors.redis.replacement_store`), then the view: after a crash the replacement is never
behind the view, so a restarted consumer redoes the view's epoch and skips the replacement's.

Hydration (the replacement's rows at the view's MCE) starts with :meth:`ReplacementFollower.start`:
the replacement's first state at an epoch F, from each upstream's snapshot or whole changelog (chosen
by :mod:`mvlog.services.replacement.hydration`), or with :meth:`~ReplacementFollower.start_in_tasks`
where Spark's tasks compute it; :meth:`~ReplacementFollower.hydrate` then catches up over the upstream
changelog's epochs after F through :data:`UpstreamHistory`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from mvlog.changes import Change
from mvlog.connectors.kafka.changelog_writer import encode_batch
from mvlog.connectors.redis.replacement_store import ReplacementRecord, ReplacementStore
from mvlog.services.rederive.join_tasks import JoinRebuild
from mvlog.services.rederive.tasks import TaskDerivation
from mvlog.services.replacement.hydration import HydrationStart, hydrate_in_tasks
from mvlog.views import ChangeBatch, ViewOperator, ViewPlan
from mvlog.views.state import StoredState

log = logging.getLogger(__name__)

#: ``history(after, upto)``: each upstream's changes of its epochs in ``(after, upto]``, in one list
#: per upstream (netting them in one operator step is exact: the operator sums signed rows per key).
UpstreamHistory = Callable[[int, int], Mapping[str, Sequence[Change]]]


class ReplacementFollower:
    """Hydrates and maintains one staged replacement of ``plan.name``; writes only its own keys."""

    def __init__(self, record: ReplacementRecord, plan: ViewPlan, store: ReplacementStore) -> None:
        self.id = record.id
        self.sql = record.sql
        self.plan = plan
        self.operator = ViewOperator(plan)
        self.store = store
        self.view = plan.name
        self.mce = record.mce  # None until hydrated
        self.apply_requested = record.apply_requested
        self.cut_epoch = record.cut_epoch  # a cut-over in Spark's tasks began there: it can only complete
        self.stale = False  # discarded (or replaced) under us: the consumer drops this follower
        self._state = StoredState(partial(store.get_state, self.view))  # its operator state, in Redis

    def start(self, epoch: int, inputs: Mapping[str, Sequence[Change]], origin: str) -> None:
        """The replacement's first state, at ``epoch``: ``inputs`` are its upstreams' rows there as
        changes; ``origin`` (which snapshot or changelog each came from) is recorded with it."""
        self._commit(epoch, self._batches(inputs), {"hydration_epoch": epoch, "hydrated_from": origin})
        log.info("%s: replacement %s started at epoch %d (%s)", self.view, self.id, epoch, origin)

    def start_in_tasks(self, derivation: TaskDerivation | JoinRebuild, start: HydrationStart) -> None:
        """The replacement's first state at ``start.epoch``, computed by Spark's tasks (``derivation``: the
        replacement's operator over its upstreams' snapshots and changelogs)."""
        if hydrate_in_tasks(derivation, self.store, self.id, start):
            self.mce = start.epoch
        else:
            self.stale = True

    def hydrate(self, upto: int, history: UpstreamHistory) -> None:
        """Bring a started replacement to epoch ``upto`` (e.g. after a restart)."""
        after = self.mce or 0
        changes = history(after, upto) if upto > after else {}
        self._commit(upto, self._batches(changes))
        log.info("%s: replacement %s hydrated at epoch %d", self.view, self.id, upto)

    def follow(self, epoch: int, inputs: Mapping[str, ChangeBatch]) -> None:
        """Apply one upstream epoch (skipped when the replacement is already there)."""
        if self.mce is not None and epoch > self.mce:
            self._commit(epoch, inputs)

    def _batches(self, changes: Mapping[str, Sequence[Change]]) -> dict[str, ChangeBatch]:
        """Upstream changes read in the row form (snapshots, changelog history) as the operator's input."""
        schemas = self.plan.upstream_schemas
        return {name: ChangeBatch.from_changes(schemas[name], found) for name, found in changes.items()}

    def _commit(self, epoch: int, inputs: Mapping[str, ChangeBatch],
                fields: Mapping[str, str | int] | None = None) -> None:
        if self.mce is not None and epoch <= self.mce:
            return
        output = self.operator.apply_epoch(inputs, self._state)
        rows = encode_batch(self.plan.schema.primary_key, output.changes)
        puts, deletes = output.state_puts_and_deletes()
        if self.store.commit(self.view, self.id, epoch, rows.row_puts, rows.row_deletes, puts, deletes, fields):
            self.mce = epoch
        else:
            self.stale = True
