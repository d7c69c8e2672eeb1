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

import pyarrow as pa

from mvlog.changes import Change
from mvlog.row_schema import Row
from mvlog.views.aggregate import AggregateStage
from mvlog.views.batch import WEIGHT, JoinedRow, build_batch, referenced_columns
from mvlog.views.change_batch import ChangeBatch, consolidate_signed
from mvlog.views.deltas import SignedRow, consolidate, net_changes
from mvlog.views.evaluate import arrow_type, column_field, evaluate
from mvlog.views.join import JoinStage
from mvlog.views.plan import ViewPlan
from mvlog.views.state import StateReader


@dataclass(frozen=True)
class EpochOutput:
    changes: list[Change]  # the view's changes of the epoch, at most one per key
    state_writes: dict[bytes, bytes | None] = field(default_factory=dict)  # None deletes the key


@dataclass(frozen=True)
class BatchOutput:
    """:class:`EpochOutput` of the columnar path: the changes' rows stay in Arrow."""

    batch: ChangeBatch
    state_writes: dict[bytes, bytes | None] = field(default_factory=dict)

    @property
    def changes(self) -> list[Change]:
        return self.batch.to_changes()


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
        return self._apply_batch(build_batch(query, rows, self._columns), state, writes)

    @property
    def reads_one_view(self) -> bool:
        """Whether :meth:`apply_signed` applies (a join nets and matches its two sides row by row)."""
        return self._join is None

    def apply_signed(self, rows: pa.Table, weights: pa.Array, state: StateReader) -> BatchOutput:
        """:meth:`apply_epoch` of a one-view definition whose input is already signed rows, columnar.

        ``rows`` has the upstream's columns (by name) and ``weights`` the sign of each row: the
        retraction (-1) of a key's row before the epoch and the assertion (+1) of its row after it, at
        most one of each per key (what one change per key and epoch gives; the caller checks). This is
        the path of the Spark consumer, whose input arrives in Arrow: a filter/project view's rows never
        become Python objects (its output is a :class:`ChangeBatch`); an aggregate's groups do.
        """
        if self._join is not None:
            raise ValueError(f"view {self.plan.name!r} joins two views: use apply_epoch")
        source = self.plan.query.sources[0]
        arrays: dict[str, pa.Array | pa.ChunkedArray] = {
            column_field(0, c.name): rows.column(c.name).cast(arrow_type(c.type))
            for c in source.schema.columns if (0, c.name) in self._columns}
        arrays[WEIGHT] = weights.cast(pa.int64())
        batch = pa.table(arrays)
        query = self.plan.query
        if query.where is not None:
            batch = batch.filter(evaluate(query.where, batch))  # NULL drops the row, as in SQL
        if self._aggregate is not None:
            writes: dict[bytes, bytes | None] = {}
            changes = self._aggregate.apply(batch, state, writes)
            return BatchOutput(ChangeBatch.from_changes(self.plan.schema, changes), writes)
        # The view's key is the upstream's, so each view key has at most one row per sign here.
        outputs = pa.table({o.name: evaluate(o.expr, batch) for o in query.outputs})
        return BatchOutput(consolidate_signed(outputs, batch.column(WEIGHT).to_pylist(), self.plan.schema))

    def _apply_batch(self, batch: pa.Table, state: StateReader, writes: dict[bytes, bytes | None]) -> EpochOutput:
        query = self.plan.query
        if query.where is not None:
            batch = batch.filter(evaluate(query.where, batch))  # NULL drops the row, as in SQL
        if self._aggregate is not None:
            return EpochOutput(self._aggregate.apply(batch, state, writes), writes)
        outputs = [(o.name, evaluate(o.expr, batch).to_pylist()) for o in query.outputs]
        weights = batch.column(WEIGHT).to_pylist()
        signed: list[tuple[int, Row]] = [
            (weight, {name: values[i] for name, values in outputs}) for i, weight in enumerate(weights)]
        return EpochOutput(consolidate(signed, self.plan.schema), writes)
