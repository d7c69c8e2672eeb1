"""The pure parts of a top-N's operator in Spark's tasks (issue 19, item 2): which views take the top-N
routing, that one operator per partition of ranking groups followed by a consolidation per view partition
gives the single operator's changes and state (the join's two steps, :class:`SplitJoin`), and where each
group's rows and state key go. No broker, no Spark: the shuffles run in
``tests/integration/test_operators_in_tasks.py``."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from mvlog.views import ChangeBatch, ViewOperator, plan_view
from mvlog.views.keyed_routing import operator_key_routing, routed_by_operator_key
from mvlog.views.state import InMemoryState
from mvlog.views.topn_routing import TopNRouting, top_n_of_one_view

from .test_join_routing import A, B, SplitJoin, _a, _changes

TOP_NS = [
    # Per group of a string column, the two largest x (NULLs last by default for DESC in Spark).
    "SELECT id, s, x FROM (SELECT id, s, x, ROW_NUMBER() OVER (PARTITION BY s ORDER BY x DESC) AS rn FROM a) t "
    "WHERE rn <= 2",
    # Per nullable int group (updates move rows between groups), rank selected, a WHERE inside.
    "SELECT id, k, rn FROM (SELECT id, k, x, ROW_NUMBER() OVER (PARTITION BY k ORDER BY x NULLS FIRST, s) AS rn "
    "FROM a WHERE id > 1) t WHERE rn <= 3",
    # Per float group (-0.0 and 0.0 one group, as the operator folds them).
    "SELECT id, s FROM (SELECT id, s, x, ROW_NUMBER() OVER (PARTITION BY x ORDER BY id DESC) AS rn FROM a) t "
    "WHERE rn = 1",
    # No PARTITION BY: one group, ranked by one task.
    "SELECT id, x FROM (SELECT id, x, ROW_NUMBER() OVER (ORDER BY x DESC, id) AS rn FROM a) t WHERE rn <= 3",
]


@pytest.mark.parametrize(("sql", "taken"), [
    *((sql, True) for sql in TOP_NS),
    ("SELECT id, bid FROM (SELECT a.id, b.bid, ROW_NUMBER() OVER (PARTITION BY a.s ORDER BY b.w) AS rn "
     "FROM a JOIN b ON a.k = b.k2) t WHERE rn <= 2", False),  # over a join: a chain of two keyed steps
    ("SELECT s, count(*) AS n FROM a GROUP BY s", False),
])
def test_which_views_the_top_n_routing_takes(sql: str, taken: bool) -> None:
    plan = plan_view("v", sql, {"a": A, "b": B})
    assert top_n_of_one_view(plan) is taken
    assert routed_by_operator_key(plan) is taken
    assert isinstance(operator_key_routing(plan, 3), TopNRouting) is taken


@pytest.mark.parametrize("sql", TOP_NS)
@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_ranking_groups_computed_apart_then_consolidated_per_view_partition_give_the_single_operators_changes(
        sql: str, partitions: int) -> None:
    """Each task ranks its groups only (their state keys its own), the view rows it emits are routed to
    their view partitions and consolidated there (a row moving to another group: out of one group's top N
    in one task, into the other's in another); the union is the single operator's, epoch by epoch."""
    split = SplitJoin(plan_view("v", sql, {"a": A}), partitions)
    rng = random.Random(partitions * 7 + len(sql))
    rows: dict[int, dict[str, object]] = {}
    for _ in range(12):
        split.epoch({"a": ChangeBatch.from_changes(A, _changes(rng, rows, 14, _a))})
    if "PARTITION BY k" in sql or "PARTITION BY x" in sql:  # groups of a few rows, some emptied
        assert split.emptied > 0, "no ranking group emptied: its state delete went untested"
    assert split.view, "the top N ended empty: nothing ranked at the end"


def test_a_groups_rows_and_state_key_go_to_one_partition_and_a_global_top_n_to_one_task() -> None:
    plan = plan_view("v", TOP_NS[2], {"a": A})
    routing = TopNRouting(plan, 4)
    rows = pa.Table.from_pylist([{"id": i, "k": 0, "x": x, "s": "a"} for i, x in enumerate([0.0, -0.0, 0.5, None])])
    parts = routing.partitions_of(0, rows).to_pylist()
    assert parts[0] == parts[1], "-0.0 and 0.0 are one ranking group"
    state = ViewOperator(plan).apply_epoch({"a": ChangeBatch.from_changes(A, [])}, InMemoryState())
    assert state.state_writes == {}
    changes = _changes(random.Random(1), {}, 10, _a)
    writes = ViewOperator(plan).apply_epoch({"a": ChangeBatch.from_changes(A, changes)}, InMemoryState()).state_writes
    signed = ChangeBatch.from_changes(A, changes).signed()[0]
    assert sorted(set(routing.partitions_of_state_keys(list(writes)))) == sorted(set(
        routing.partitions_of(0, signed).to_pylist()))
    one = TopNRouting(plan_view("v", TOP_NS[3], {"a": A}), 4)
    assert len(set(one.partitions_of(0, signed).to_pylist())) == 1
    with pytest.raises(ValueError, match="not a top-N group's state key"):
        routing.partitions_of_state_keys([b"g[1]"])
    with pytest.raises(ValueError, match="reads one view"):
        routing.partitions_of(1, rows)
