"""The incremental view operator: one epoch of upstream changes in, the view's changes out.

The operator is pure. Everything it remembers between epochs is read through a ``StateReader`` and
returned as ``state_writes``, which the caller persists atomically with the view's rows and committed
epoch; replaying an epoch against the state it started from gives the same output.

Input and output are :class:`~mvlog.views.change_batch.ChangeBatch` es, the one shape of change data:
each upstream's changes of the epoch in, the view's changes out (at most one per view key, ``before``
the view row before the epoch and ``after`` the row after it). In between, the changes become signed
rows (-1 before, +1 after) in one Arrow batch, filtered and projected or aggregated with
``pyarrow.compute``. A filter/project view of an upstream that changes each key once per epoch (what
every mvlog changelog carries) never turns a row into a Python object; a join matches, and an
aggregate folds its groups, row by row inside their stages, and an upstream that changes a key
several times in one epoch is netted per key first.

Subqueries in FROM, WITH queries, the subqueries of IN/EXISTS and the branches of a UNION ALL are
operators nested in the view's (``ViewPlan.inner``): they run first on the epoch's changes of their
upstreams, their state under their own key prefix, and their output changes are the input of the
query that reads them.

To hydrate a new view's state (backfill), feed the upstream's rows as ``READ`` changes, in one epoch or
in chunks over several.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from mvlog.views.aggregate import AggregateStage
from mvlog.views.batch import WEIGHT, JoinedRow, build_batch, referenced_columns
from mvlog.views.change_batch import ChangeBatch, consolidate_signed
from mvlog.views.deltas import SignedRow, consolidate, net_changes, net_rows_changed_once
from mvlog.views.evaluate import arrow_type, column_field, evaluate
from mvlog.views.join import JoinStage
from mvlog.views.plan import ViewPlan
from mvlog.views.query import Source
from mvlog.views.share import WHOLE, OperatorShare
from mvlog.views.state import PrefixedState, StateReader, inner_prefix
from mvlog.views.topn import TopNStage
from mvlog.views.union import union_changes
from mvlog.views.window import expand as expand_windows


@dataclass(frozen=True)
class EpochOutput:
    """What one epoch of a view gives: its changes, and the operator state to persist with them."""

    changes: ChangeBatch  # at most one per view key
    state_writes: dict[bytes, bytes | None] = field(default_factory=dict)  # None deletes the key

    def state_puts_and_deletes(self) -> tuple[dict[bytes, bytes], list[bytes]]:
        """:attr:`state_writes` as the commits take them (:func:`puts_and_deletes`)."""
        return puts_and_deletes(self.state_writes)


def puts_and_deletes(writes: Mapping[bytes, bytes | None]) -> tuple[dict[bytes, bytes], list[bytes]]:
    """State writes as the commits take them: the keys set (with their values), the keys deleted (None)."""
    return {k: v for k, v in writes.items() if v is not None}, [k for k, v in writes.items() if v is None]


class ViewOperator:
    """Maintains one view; holds only its plan, so one instance can serve any number of epochs."""

    def __init__(self, plan: ViewPlan, *, share: OperatorShare = WHOLE,
                 inner_shares: Mapping[str, OperatorShare] | None = None) -> None:
        """``share``: what this operator maintains of the view, when a Spark task runs it for one view
        partition (:meth:`~mvlog.views.routing.GroupRouting.share`): a windowed GROUP BY's task keeps
        only its own windows, and only one task maintains a global aggregate's row. ``inner_shares``:
        the same for subqueries and WITH queries (and a union's branches), by name: the first step of a
        GROUP BY over a windowed or global one, or of a union with such a branch, runs where the inner
        query's groups are (:mod:`mvlog.views.nested_routing`, :mod:`mvlog.views.union_routing`)."""
        self.plan = plan
        self._owned = share.rows
        query = plan.query
        self._columns = referenced_columns(query)
        self._join = JoinStage(query) if len(query.sources) > 1 and not plan.union else None
        self._aggregate = AggregateStage(query, global_row=share.global_row) if query.is_aggregate else None
        self._top_n = TopNStage(query, plan.schema) if query.top_n is not None else None
        # Subqueries and WITH queries: operators of their own, run first, each with its state under its
        # own prefix; their output changes are the input of this query's source of that name.
        shares = inner_shares or dict(share.inner)  # a subquery's own subqueries: its share's
        self._inner = [(name, ViewOperator(inner, share=shares.get(name, WHOLE)), inner_prefix(name))
                       for name, inner in plan.inner]

    def apply_epoch(self, changes: Mapping[str, ChangeBatch], state: StateReader) -> EpochOutput:
        """The view's output for one epoch, given each upstream's changes of that epoch (by view name;
        an absent upstream had none) and the operator state as of the previous epoch."""
        unknown = sorted(set(changes) - set(self.plan.sources))
        if unknown:
            raise ValueError(f"view {self.plan.name!r} reads {', '.join(self.plan.sources)}, "
                             f"not {', '.join(unknown)}")
        query = self.plan.query
        writes: dict[bytes, bytes | None] = {}
        if self._inner:
            changes = self._with_inner(changes, state, writes)
            if self.plan.union:
                branches = [changes[name] for name, _, _ in self._inner]
                return EpochOutput(union_changes(self.plan.schema, [p for _, p in self.plan.inner], branches), writes)
        if self._join is not None:
            netted: dict[str, list[SignedRow]] = {}
            for source in query.sources:
                if source.view not in netted:
                    netted[source.view] = self._netted(source, changes.get(source.view))
            rows = self._join.apply([netted[s.view] for s in query.sources], state, writes)
            if not rows and self._aggregate is None:
                return EpochOutput(ChangeBatch.empty(self.plan.schema), writes)
            return self._apply_batch(build_batch(query, rows, self._columns), state, writes)
        source = query.sources[0]
        batch = changes.get(source.view)
        if batch is None or batch.one_change_per_key():
            return self._apply_batch(self._signed_columns(source, batch), state, writes)
        one_side: list[JoinedRow] = [(weight, (values,)) for weight, values in self._netted(source, batch)]
        return self._apply_batch(build_batch(query, one_side, self._columns), state, writes)

    def _with_inner(self, changes: Mapping[str, ChangeBatch], state: StateReader,
                    writes: dict[bytes, bytes | None]) -> dict[str, ChangeBatch]:
        """``changes`` and the epoch's changes of each subquery (its operator run on them), under its name."""
        changes = dict(changes)
        for name, operator, prefix in self._inner:
            inputs = {view: changes[view] for view in operator.plan.sources if view in changes}
            output = operator.apply_epoch(inputs, PrefixedState(state, prefix))
            writes.update({prefix + key: value for key, value in output.state_writes.items()})
            changes[name] = output.changes
        return changes

    def joined(self, changes: Mapping[str, ChangeBatch], state: StateReader,
               writes: dict[bytes, bytes | None]) -> pa.Table:
        """The first step of an aggregate over a join (a semi or anti join's subquery run first), or over a
        subquery that keeps state (a GROUP BY over a GROUP BY, or over a join's): the epoch's joined rows,
        or the subquery's changes, signed (column ``WEIGHT``) and filtered by WHERE, whose groups
        :meth:`aggregate_joined` folds; the first step's state writes go to ``writes``. The two steps give
        :meth:`apply_epoch`'s output, and each can run where its state is: the join's per join key (the
        subquery's per its groups, or per the join key among them), the aggregate's per group."""
        assert self._aggregate is not None and not self.plan.union
        if self._inner:
            changes = self._with_inner(changes, state, writes)
        query = self.plan.query
        if self._join is None:
            source = query.sources[0]
            batch = self._signed_columns(source, changes.get(source.view))
        else:
            netted = {s.view: self._netted(s, changes.get(s.view)) for s in query.sources}
            rows = self._join.apply([netted[s.view] for s in query.sources], state, writes)
            batch = build_batch(query, rows, self._columns)
        return batch.filter(evaluate(query.where, batch)) if query.where is not None else batch

    def aggregate_joined(self, batch: pa.Table, state: StateReader) -> EpochOutput:
        """The second step of an aggregate over a join: :meth:`joined`'s rows folded into their groups."""
        assert self._aggregate is not None
        writes: dict[bytes, bytes | None] = {}
        changes = self._aggregate.apply(self._grouped_input(batch), state, writes)
        return EpochOutput(ChangeBatch.from_changes(self.plan.schema, changes), writes)

    def _grouped_input(self, batch: pa.Table) -> pa.Table:
        """A filtered batch as the aggregate or the top-N takes it: a copy of each row per window it falls
        in (a windowed GROUP BY), then only the rows of this operator's share."""
        if self.plan.query.window is not None:
            batch = expand_windows(batch, self.plan.query.window)
        return batch.filter(self._owned(batch)) if self._owned is not None else batch

    def _netted(self, source: Source, batch: ChangeBatch | None) -> list[SignedRow]:
        """Per upstream key: the retraction of its row before the epoch and the assertion of its row
        after it, summed over the key's changes (as Python values: a join matches them row by row). Every
        mvlog writer's batch changes a key once: then there is nothing to sum."""
        if batch is None:
            return []
        if batch.one_change_per_key():
            return net_rows_changed_once(((before, after) for _, before, after in batch.change_rows()), source.schema)
        return net_changes(batch.to_changes(), source.schema)

    def _signed_columns(self, source: Source, batch: ChangeBatch | None) -> pa.Table:
        """The operator's Arrow batch of a one-view definition, straight from the upstream's columns."""
        rows, weights = (batch if batch is not None else ChangeBatch.empty(source.schema)).signed()
        arrays: dict[str, pa.Array | pa.ChunkedArray] = {
            column_field(0, c.name): rows.column(c.name).cast(arrow_type(c.type))
            for c in source.schema.columns if (0, c.name) in self._columns}
        arrays[WEIGHT] = weights
        return pa.table(arrays)

    def _apply_batch(self, batch: pa.Table, state: StateReader, writes: dict[bytes, bytes | None]) -> EpochOutput:
        query = self.plan.query
        if query.where is not None:
            batch = batch.filter(evaluate(query.where, batch))  # NULL drops the row, as in SQL
        batch = self._grouped_input(batch)
        if self._aggregate is not None:
            changes = self._aggregate.apply(batch, state, writes)
            return EpochOutput(ChangeBatch.from_changes(self.plan.schema, changes), writes)
        if self._top_n is not None:
            changes = self._top_n.apply(batch, state, writes)
            return EpochOutput(ChangeBatch.from_changes(self.plan.schema, changes), writes)
        weights = batch.column(WEIGHT).to_pylist()
        if self._join is None:
            # The view's key is the upstream's, and the upstream's rows are netted: each view key has at
            # most one row per sign, so the rows consolidate without becoming Python objects.
            outputs = pa.table({o.name: evaluate(o.expr, batch) for o in query.outputs})
            return EpochOutput(consolidate_signed(outputs, weights, self.plan.schema), writes)
        # A join's view key may get several rows per sign (both sides changed): summed row by row.
        values = [(o.name, evaluate(o.expr, batch).to_pylist()) for o in query.outputs]
        signed = [(weight, {name: column[i] for name, column in values}) for i, weight in enumerate(weights)]
        return EpochOutput(ChangeBatch.from_changes(self.plan.schema, consolidate(signed, self.plan.schema)), writes)
