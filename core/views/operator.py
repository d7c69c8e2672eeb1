"""The incremental view operator: one epoch of upstream changes in, the view's changes out.

The operator is pure. Everything it remembers between epochs is read through a ``StateReader`` and
returned as ``state_writes``, which the caller persists atomically with the view's rows and committed
epoch; replaying an epoch against the state it started from gives the same output.

Per epoch: upstream changes are netted per key into signed rows (-1 before, +1 after), joined (if the
view joins two views), turned into one Arrow batch, filtered and projected or aggregated with
``pyarrow.compute``, and consolidated into at most one change per view key whose ``before`` is the view
row before the epoch and whose ``after`` is the row after it.

To hydrate a new view's state (backfill), feed the upstream's rows as ``READ`` changes, in one epoch or
in chunks over several.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mvlog.changes import Change
from mvlog.row_schema import Row
from mvlog.views.aggregate import AggregateStage
from mvlog.views.batch import WEIGHT, JoinedRow, build_batch, referenced_columns
from mvlog.views.deltas import SignedRow, consolidate, net_changes
from mvlog.views.evaluate import evaluate
from mvlog.views.join import JoinStage
from mvlog.views.plan import ViewPlan
from mvlog.views.state import StateReader


@dataclass(frozen=True)
class EpochOutput:
    changes: list[Change]  # the view's changes of the epoch, at most one per key
    state_writes: dict[bytes, bytes | None] = field(default_factory=dict)  # None deletes the key


class ViewOperator:
    """Maintains one view; holds only its plan, so one instance can serve any number of epochs."""

    def __init__(self, plan: ViewPlan) -> None:
        self.plan = plan
        query = plan.query
        self._columns = referenced_columns(query)
        self._join = JoinStage(query) if plan.is_join else None
        self._aggregate = AggregateStage(query) if query.is_aggregate else None

    def apply_epoch(self, changes: Mapping[str, Sequence[Change]], state: StateReader) -> EpochOutput:
        """The view's output for one epoch, given each upstream's changes of that epoch (by view name;
        an absent upstream had none) and the operator state as of the previous epoch."""
        unknown = sorted(set(changes) - set(self.plan.sources))
        if unknown:
            raise ValueError(f"view {self.plan.name!r} reads {', '.join(self.plan.sources)}, "
                             f"not {', '.join(unknown)}")
        query = self.plan.query
        netted: dict[str, list[SignedRow]] = {}
        for source in query.sources:
            if source.view not in netted:
                netted[source.view] = net_changes(changes.get(source.view, ()), source.schema)
        writes: dict[bytes, bytes | None] = {}
        rows: list[JoinedRow]
        if self._join is not None:
            rows = self._join.apply([netted[s.view] for s in query.sources], state, writes)
        else:
            rows = [(weight, (values,)) for weight, values in netted[query.sources[0].view]]
        if not rows and self._aggregate is None:
            return EpochOutput([], writes)
        batch = build_batch(query, rows, self._columns)
        if query.where is not None:
            batch = batch.filter(evaluate(query.where, batch))  # NULL drops the row, as in SQL
        if self._aggregate is not None:
            return EpochOutput(self._aggregate.apply(batch, state, writes), writes)
        outputs = [(o.name, evaluate(o.expr, batch).to_pylist()) for o in query.outputs]
        weights = batch.column(WEIGHT).to_pylist()
        signed: list[tuple[int, Row]] = [
            (weight, {name: values[i] for name, values in outputs}) for i, weight in enumerate(weights)]
        return EpochOutput(consolidate(signed, self.plan.schema), writes)
