"""The pure parts of running a view's operator in Spark's tasks: which views can (no shuffle, no state),
and which epochs a partition still writes after an earlier attempt committed some (issue 19, slice 1)."""

from __future__ import annotations

import pytest

from mvlog.changes import Mutation
from mvlog.partition_epochs import (
    PartitionBarrier,
    PartitionLogError,
    cut_over_of,
    prev_epochs,
    require_next,
    resume_partition,
    same_definition,
)
from mvlog.replacement import APPLY_MUTATION
from mvlog.row_schema import RowSchema
from mvlog.views import plan_view
from mvlog.views.partitioning import runs_in_tasks, stateless_key_preserving

T1 = RowSchema.of({"id": "int", "v1": "int", "deleted": "boolean"}, ["id"])
T2 = RowSchema.of({"id": "int", "w": "int"}, ["id"])


def _keyed(sql: str) -> bool:
    return stateless_key_preserving(plan_view("v", sql, {"t1": T1, "t2": T2}), ["id"])


@pytest.mark.parametrize("sql", [
    "SELECT * FROM t1 WHERE deleted = false",
    "SELECT id, v1 + 1 AS v2 FROM t1 WHERE v1 > 0",
    "SELECT v1 FROM t1",  # the key is kept as a hidden column: still the upstream's
])
def test_filters_and_projections_keyed_like_their_upstream_run_in_tasks(sql: str) -> None:
    assert _keyed(sql)


@pytest.mark.parametrize("sql", [
    "SELECT id AS k, v1 FROM t1",  # renamed key: another encoded key, another vnode (a shuffle: key_routing)
    "SELECT v1, count(*) AS n FROM t1 GROUP BY v1",  # state, and a new key
    "SELECT a.id, a.v1, b.w FROM t1 a JOIN t2 b ON a.v1 = b.id",  # state, two upstreams
    "SELECT * FROM (SELECT id, v1, ROW_NUMBER() OVER (PARTITION BY deleted ORDER BY v1) AS rn FROM t1) "
    "WHERE rn <= 2",  # top-N keeps state
    "SELECT id, v1 FROM t1 UNION ALL SELECT id, w FROM t2",
])
def test_views_with_state_or_another_key_do_not(sql: str) -> None:
    assert not _keyed(sql)


def test_a_partition_count_unlike_the_upstreams_needs_a_shuffle() -> None:
    """By the view's key (``mvlog.views.key_routing``, tested in ``test_key_routing.py``)."""
    plan = plan_view("v", "SELECT * FROM t1 WHERE v1 > 0", {"t1": T1})
    assert runs_in_tasks(plan, ["id"], 4, 4)
    assert not runs_in_tasks(plan, ["id"], 4, 2)


def test_prev_epochs_chain_from_the_mce() -> None:
    assert prev_epochs(10, [12, 15, 20]) == {12: 10, 15: 12, 20: 15}
    assert prev_epochs(10, []) == {}


def _b(epoch: int, prev: int, offset: int = 0, records: int = 1) -> PartitionBarrier:
    return PartitionBarrier(epoch, prev, offset, records)


def test_nothing_committed_after_the_mce_writes_every_epoch() -> None:
    assert resume_partition(0, 10, [12, 15], []) == {}


def test_epochs_an_earlier_attempt_committed_are_not_written_again() -> None:
    found = [_b(12, 10, 5), _b(15, 12, 9)]
    assert resume_partition(1, 10, [12, 15, 20], found) == {12: found[0], 15: found[1]}


def test_committed_epochs_past_the_micro_batch_are_left_to_the_next_one() -> None:
    found = [_b(12, 10), _b(15, 12), _b(20, 15)]
    assert resume_partition(0, 10, [12], found) == {12: found[0]}


def test_barriers_at_or_below_the_mce_are_history() -> None:
    found = [_b(5, 0), _b(10, 5), _b(10, 5), _b(12, 10)]  # two attempts of 10 (the driver path redid it)
    assert resume_partition(0, 10, [12, 15], found) == {12: found[3]}


def test_a_second_attempt_of_an_epoch_in_the_partition_is_refused_not_doubled() -> None:
    with pytest.raises(PartitionLogError, match="names epoch 10, expected 12"):
        resume_partition(0, 10, [12, 15], [_b(12, 10), _b(12, 10)])


def test_a_chain_that_does_not_start_at_the_mce_is_refused() -> None:
    with pytest.raises(PartitionLogError, match="expected 10"):
        resume_partition(0, 10, [12], [_b(12, 11)])


def test_an_epoch_other_than_the_next_upstream_epoch_is_refused() -> None:
    with pytest.raises(PartitionLogError, match="where epoch 12 comes next"):
        resume_partition(0, 10, [12, 15], [_b(13, 10)])


def test_epochs_must_be_ascending_and_above_the_mce() -> None:
    with pytest.raises(ValueError):
        resume_partition(0, 10, [15, 12], [])
    with pytest.raises(ValueError):
        resume_partition(0, 10, [10], [])


def test_a_micro_batch_must_start_at_the_upstreams_next_epoch() -> None:
    require_next(0, 10, [12, 15], 12)
    require_next(0, 10, [], None)  # nothing to write
    with pytest.raises(PartitionLogError, match=r"starts at epoch 15.*is 12"):
        require_next(0, 10, [15], 12)  # 12 never computed: 15's barrier would name 10


def test_an_epoch_found_committed_as_a_cut_over_is_only_kept_as_the_same_cut_over() -> None:
    """A replacement's cut-over is a diff of two definitions: a partition that holds one must not be kept as
    the old definition's epoch, another replacement's cut-over, or the other way round, whatever the counts."""
    def cut(replacement_id: str) -> Mutation:
        return Mutation(APPLY_MUTATION, "v", {"replacement_id": replacement_id, "version": 3})

    progress = Mutation("backfill_progress", "v", {"positions": {}})
    assert cut_over_of(cut("r1")) == "r1" and cut_over_of(progress) is None and cut_over_of(None) is None
    assert same_definition(cut("r1"), cut("r1"))
    assert same_definition(None, None) and same_definition(progress, None) and same_definition(None, progress)
    assert not same_definition(cut("r1"), None)
    assert not same_definition(None, cut("r1"))
    assert not same_definition(cut("r1"), cut("r2"))
    assert not same_definition(progress, cut("r1"))
