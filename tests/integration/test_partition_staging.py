"""An epoch staged per partition by Spark tasks and committed by the driver in one script
(``PartitionStaging``, ``lua/partition_commit.lua``), on a real redis-server."""

from __future__ import annotations

import pytest
import redis

from mvlog.changes import IndexEntry
from mvlog.config import Settings
from mvlog.connectors.redis.epoch_commit import EpochCommit, ServingStateLostError
from mvlog.connectors.redis.partition_staging import PartitionStaging, StagedCounts, StagingIncompleteError
from mvlog.connectors.redis.replacement_store import (
    CutOverBegunError,
    CutOverNotReachedError,
    ReplacementGoneError,
    ReplacementStore,
)
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.replacement import Status


def _stage(staging: PartitionStaging, epoch: int, partition: int, puts: dict[bytes, bytes],
           deletes: list[bytes], state_puts: dict[bytes, bytes] | None = None,
           state_deletes: list[bytes] | None = None) -> StagedCounts:
    commit = EpochCommit(epoch, puts, deletes, {}, order_puts=[b"o" + k for k in puts],
                         order_deletes=[b"o" + k for k in deletes], state_puts=state_puts,
                         state_deletes=state_deletes or [])
    return staging.stage("v", partition, commit)


def test_staged_partitions_commit_together_with_the_index_and_the_mce(
        settings: Settings, redis_client: redis.Redis) -> None:
    staging = PartitionStaging(redis_client, settings.topic_prefix)
    store = ViewStore(redis_client, settings.topic_prefix)
    many = {f"k{i}".encode(): f"v{i}".encode() for i in range(5000)}  # several Lua chunks
    staged = {0: _stage(staging, 10, 0, many, []), 1: _stage(staging, 10, 1, {b"a": b"1"}, [])}
    index = {0: IndexEntry(10, 4, 5000), 1: IndexEntry(10, 2, 1)}
    assert staging.commit("v", 10, 0, staged, index)
    assert store.mce("v") == 10 and store.row_count("v") == 5001
    assert store.get_rows("v", [b"k4999", b"a"]) == {b"k4999": b"v4999", b"a": b"1"}
    assert redis_client.zcard(f"{settings.topic_prefix}:{{v}}:keyorder") == 5001
    assert [e.offset for e in store.index.between("v", 1, 0, 10)] == [2]
    assert not any(redis_client.exists(k) for p in (0, 1) for k in staging.staged_keys("v", 10, p))

    # The next epoch deletes and puts; an empty partition stages nothing and commits.
    staged = {0: _stage(staging, 11, 0, {b"k1": b"new"}, [b"k2"]), 1: _stage(staging, 11, 1, {}, [])}
    assert staging.commit("v", 11, 10, staged, {0: IndexEntry(11, 9, 2), 1: IndexEntry(11, 3, 0)})
    assert store.get_rows("v", [b"k1", b"k2"]) == {b"k1": b"new"}
    assert redis_client.zscore(f"{settings.topic_prefix}:{{v}}:keyorder", b"ok2") is None

    # A retry of a committed epoch changes nothing.
    staged = {0: _stage(staging, 11, 0, {b"zombie": b"1"}, []), 1: _stage(staging, 11, 1, {}, [])}
    assert not staging.commit("v", 11, 10, staged, {0: IndexEntry(11, 9, 2), 1: IndexEntry(11, 3, 0)})
    assert store.get_rows("v", [b"zombie"]) == {} and store.mce("v") == 11


def test_staged_operator_state_commits_with_the_rows(settings: Settings, redis_client: redis.Redis) -> None:
    """A GROUP BY's partitions stage the state of their groups too; the commit swaps it into the view's
    one operator state (partitions own disjoint keys), deletes included, and checks it is whole."""
    staging = PartitionStaging(redis_client, settings.topic_prefix)
    store = ViewStore(redis_client, settings.topic_prefix)
    many = {f"g[{i}]".encode(): b"s" for i in range(3000)}
    staged = {0: _stage(staging, 10, 0, {b"a": b"1"}, [], many),
              1: _stage(staging, 10, 1, {b"b": b"2"}, [], {b'g["b"]': b"n=1"})}
    assert staged[0].state_puts == 3000
    assert staging.commit("v", 10, 0, staged, {0: IndexEntry(10, 1, 1), 1: IndexEntry(10, 1, 1)})
    assert store.get_state("v", [b"g[2999]", b'g["b"]']) == {b"g[2999]": b"s", b'g["b"]': b"n=1"}

    staged = {0: _stage(staging, 11, 0, {}, [b"a"], {b"g[1]": b"t"}, [b"g[2]"]),
              1: _stage(staging, 11, 1, {}, [], {}, [b'g["b"]'])}
    redis_client.delete(staging.staged_keys("v", 11, 1)[5])  # a partition's staged state deletes lost
    index = {0: IndexEntry(11, 3, 1), 1: IndexEntry(11, 2, 0)}
    with pytest.raises(StagingIncompleteError):
        staging.commit("v", 11, 10, staged, index)
    assert store.mce("v") == 10 and store.get_state("v", [b'g["b"]']) == {b'g["b"]': b"n=1"}
    staged[1] = _stage(staging, 11, 1, {}, [], {}, [b'g["b"]'])
    assert staging.commit("v", 11, 10, staged, index)
    assert store.get_state("v", [b"g[1]", b"g[2]", b'g["b"]']) == {b"g[1]": b"t"}
    assert redis_client.hlen(f"{settings.topic_prefix}:{{v}}:opstate") == 2999


def test_a_lost_staging_or_a_wiped_mce_applies_nothing(settings: Settings, redis_client: redis.Redis) -> None:
    staging = PartitionStaging(redis_client, settings.topic_prefix)
    store = ViewStore(redis_client, settings.topic_prefix)
    staged = {0: _stage(staging, 10, 0, {b"a": b"1"}, []), 1: _stage(staging, 10, 1, {b"b": b"2"}, [])}
    redis_client.delete(staging.staged_keys("v", 10, 1)[0])  # expired, or lost with a Redis restart
    index = {0: IndexEntry(10, 1, 1), 1: IndexEntry(10, 1, 1)}
    with pytest.raises(StagingIncompleteError):
        staging.commit("v", 10, 0, staged, index)
    assert store.mce("v") is None and store.get_rows("v", [b"a"]) == {}

    staged[1] = _stage(staging, 10, 1, {b"b": b"2"}, [])  # a task of the next attempt stages it again
    with pytest.raises(ServingStateLostError):  # follows an MCE Redis does not hold (wiped)
        staging.commit("v", 10, 7, staged, index)
    assert staging.commit("v", 10, 0, staged, index) and store.row_count("v") == 2


def test_a_joins_rows_and_state_staged_by_two_tasks_keep_each_other(settings: Settings,
                                                                   redis_client: redis.Redis) -> None:
    """A join stages a partition's rows (its view-partition task) and its state (its join-key task) apart:
    each leaves the other's keys alone, in either order and when staged again, and the commit takes both
    halves with their counts added up."""
    staging = PartitionStaging(redis_client, settings.topic_prefix)
    store = ViewStore(redis_client, settings.topic_prefix)
    rows = EpochCommit(10, {b"a": b"1"}, [], {}, order_puts=[b"oa"])
    state = EpochCommit(10, {}, [], {}, state_puts={b"j0[1]": b"x"}, state_deletes=[b"j1[2]"])
    counts_state = staging.stage("v", 0, state, rows=False)
    counts_rows = staging.stage("v", 0, rows, state=False)
    assert (counts_rows.puts, counts_rows.state_puts, counts_state.puts, counts_state.state_puts) == (1, 0, 0, 1)
    staging.stage("v", 0, state, rows=False)  # a join-key task run again (its shuffle output lost)
    both = StagedCounts(counts_rows.puts, counts_rows.deletes, counts_rows.order_puts, counts_rows.order_deletes,
                        counts_state.state_puts, counts_state.state_deletes)
    redis_client.hset(f"{settings.topic_prefix}:{{v}}:opstate", b"j1[2]", b"old")
    assert staging.commit("v", 10, 0, {0: both}, {0: IndexEntry(10, 1, 1)})
    assert store.get_rows("v", [b"a"]) == {b"a": b"1"}
    assert store.get_state("v", [b"j0[1]", b"j1[2]"]) == {b"j0[1]": b"x"}


def test_a_staged_replacements_partitions_commit_into_its_own_keys(settings: Settings,
                                                                    redis_client: redis.Redis) -> None:
    """The epochs a staged replacement follows in Spark's tasks: staged beside the view's own staging of the
    same epoch and partition (its scope), committed into the replacement's rows and state with its MCE, the
    view's keys untouched; refused at or below its MCE, when a partition's staging is lost, and once the
    replacement is discarded (nothing applied each time)."""
    replacements = ReplacementStore(redis_client, settings.topic_prefix)
    view_staging = PartitionStaging(redis_client, settings.topic_prefix)
    store = ViewStore(redis_client, settings.topic_prefix)
    assert replacements.stage("v", "r1", "SELECT 1") is None
    assert replacements.commit("v", "r1", 9, {b"old": b"0", b"gone": b"0"}, [], {b"g[1]": b"s"}, [])

    def stage(epoch: int, partition: int, puts: dict[bytes, bytes], deletes: list[bytes],
              state: dict[bytes, bytes], state_deletes: list[bytes]) -> StagedCounts:
        commit = EpochCommit(epoch, puts, deletes, {}, state_puts=state, state_deletes=state_deletes)
        return replacements.staging.stage("v", partition, commit)

    mine = {0: stage(10, 0, {b"a": b"1"}, [b"gone"], {b"g[2]": b"t"}, [b"g[1]"]),
            1: stage(10, 1, {b"b": b"2"}, [], {}, [])}
    view_mine = _stage(view_staging, 10, 0, {b"view": b"row"}, [])  # the view's own partition 0 of epoch 10
    assert set(replacements.staging.staged_keys("v", 10, 0)).isdisjoint(view_staging.staged_keys("v", 10, 0))
    assert replacements.commit_partitions("v", "r1", 10, mine)
    assert replacements.rows("v") == {b"old": b"0", b"a": b"1", b"b": b"2"}
    assert replacements.get_state("v", [b"g[1]", b"g[2]"]) == {b"g[2]": b"t"}
    record = replacements.record("v")
    assert record is not None and record.mce == 10
    assert store.mce("v") is None and store.get_rows("v", [b"a", b"view"]) == {}  # the view's keys untouched
    assert redis_client.hlen(view_staging.staged_keys("v", 10, 0)[0]) == 1  # the view's staging too
    assert view_mine.puts == 1 and not any(redis_client.exists(k) for p in (0, 1)
                                           for k in replacements.staging.staged_keys("v", 10, p))

    again = {0: stage(10, 0, {b"a": b"other"}, [], {}, []), 1: stage(10, 1, {}, [], {}, [])}
    assert not replacements.commit_partitions("v", "r1", 10, again)  # at its MCE: a retried epoch
    assert replacements.rows("v")[b"a"] == b"1"

    lost = {0: stage(11, 0, {b"c": b"3"}, [], {}, []), 1: stage(11, 1, {b"d": b"4"}, [], {}, [])}
    redis_client.delete(replacements.staging.staged_keys("v", 11, 1)[0])
    with pytest.raises(StagingIncompleteError):
        replacements.commit_partitions("v", "r1", 11, lost)
    assert b"c" not in replacements.rows("v")

    assert replacements.discard("v") == "r1"
    with pytest.raises(ReplacementGoneError):
        replacements.commit_partitions("v", "r1", 11, {0: stage(11, 0, {b"c": b"3"}, [], {}, [])})
    assert replacements.rows("v") == {}


def test_a_cut_over_in_tasks_is_fixed_first_then_applied_from_the_partitions_staging(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A replacement's cut-over computed by Spark's tasks: fixed at the replacement's epoch only while an
    apply is pending (then neither withdrawn, discarded nor failed), and applied with one script from what
    each view partition's task staged: the replacement's rows and state become the view's, the staged
    key-order members applied, the index, the MCE and the record; refused while a partition's staging is
    lost, and a repeat after it applied changes nothing."""
    replacements = ReplacementStore(redis_client, settings.topic_prefix)
    staging = PartitionStaging(redis_client, settings.topic_prefix)
    store = ViewStore(redis_client, settings.topic_prefix)
    store.commit("v", EpochCommit(8, {b"a": b"0", b"z": b"9"}, [], {0: IndexEntry(8, 0, 2), 1: IndexEntry(8, 0, 0)},
                                  order_puts=[b"oa", b"oz"], state_puts={b"old": b"state"}))
    assert replacements.stage("v", "r1", "SELECT 1") is None
    assert replacements.commit("v", "r1", 9, {b"a": b"1", b"b": b"2"}, [], {b"g": b"s"}, [])
    assert not replacements.begin_cut_over("v", "r1", 9)  # no apply pending
    assert replacements.request_apply("v", "r1")
    with pytest.raises(CutOverNotReachedError, match="is at epoch 9, not at its cut-over's epoch 10"):
        replacements.begin_cut_over("v", "r1", 10)  # the replacement is not there
    assert not replacements.begin_cut_over("v", "r2", 9)  # another replacement
    assert replacements.begin_cut_over("v", "r1", 9) and replacements.begin_cut_over("v", "r1", 9)
    with pytest.raises(CutOverBegunError, match="began at epoch 9"):
        replacements.begin_cut_over("v", "r1", 10)
    with pytest.raises(CutOverBegunError):
        replacements.withdraw_apply("v", "r1")
    with pytest.raises(CutOverBegunError):
        replacements.discard("v")
    assert not replacements.fail("v", "r1", "boom")
    record = replacements.record("v")
    assert record is not None and record.cut_epoch == 9 and record.apply_requested
    assert "error" not in (record.fields or {})

    # Partition 0 inserts b, updates a and deletes z; partition 1 has nothing to change.
    staged = {0: staging.stage("v", 0, EpochCommit(9, {b"a": b"1", b"b": b"2"}, [b"z"], {},
                                                   order_puts=[b"oa", b"ob"], order_deletes=[b"oz"])),
              1: staging.stage("v", 1, EpochCommit(9, {}, [], {}))}
    index = {0: IndexEntry(9, 3, 3), 1: IndexEntry(9, 1, 0)}
    redis_client.delete(staging.staged_keys("v", 9, 0)[2])
    with pytest.raises(StagingIncompleteError):
        replacements.apply_partitions("v", "r1", 9, staged, index, 2)
    assert store.mce("v") == 8 and store.get_rows("v", [b"z"]) == {b"z": b"9"}  # nothing applied
    staged[0] = staging.stage("v", 0, EpochCommit(9, {b"a": b"1", b"b": b"2"}, [b"z"], {},
                                                  order_puts=[b"oa", b"ob"], order_deletes=[b"oz"]))
    assert replacements.apply_partitions("v", "r1", 9, staged, index, 2)
    assert store.mce("v") == 9
    assert store.get_rows("v", [b"a", b"b", b"z"]) == {b"a": b"1", b"b": b"2"}
    assert store.get_state("v", [b"g", b"old"]) == {b"g": b"s"}
    assert redis_client.zrange(staging._key("v", "keyorder"), 0, -1) == [b"oa", b"ob"]
    assert store.index.at("v", 0, 9) == IndexEntry(9, 3, 3)
    record = replacements.record("v")
    assert record is not None and record.status is Status.APPLIED and record.applied_epoch == 9
    assert record.applied_version == 2 and record.cut_epoch is None and not record.apply_requested
    assert not redis_client.exists(replacements.key("v", "rows"))
    assert not any(redis_client.exists(k) for p in (0, 1) for k in staging.staged_keys("v", 9, p))
    assert not replacements.apply_partitions("v", "r1", 9, staged, index, 2)  # applied: a retry's repeat
    with pytest.raises(ReplacementGoneError):
        replacements.apply_partitions("v", "r2", 9, staged, index, 2)


def test_a_cut_over_found_in_the_log_is_fixed_again_without_the_replacement_there(
        settings: Settings, redis_client: redis.Redis) -> None:
    """After a Redis wipe mid cut-over the record is staged again (not hydrated, no apply pending): the
    cut-over the partitions hold is fixed again at its epoch, the apply pending, whatever the replacement's
    epoch; only for the staged replacement's id, idempotently, and never at another epoch."""
    replacements = ReplacementStore(redis_client, settings.topic_prefix)
    assert not replacements.resume_cut_over("v", "r1", 9)  # nothing staged
    assert replacements.stage("v", "r1", "SELECT 1") is None
    assert not replacements.resume_cut_over("v", "r2", 9)  # another replacement
    record = replacements.record("v")
    assert record is not None and record.cut_epoch is None and not record.apply_requested
    assert replacements.resume_cut_over("v", "r1", 9) and replacements.resume_cut_over("v", "r1", 9)
    record = replacements.record("v")
    assert record is not None and record.cut_epoch == 9 and record.apply_requested and not record.hydrated
    with pytest.raises(CutOverBegunError, match="began at epoch 9"):
        replacements.resume_cut_over("v", "r1", 10)
    with pytest.raises(CutOverBegunError):
        replacements.withdraw_apply("v", "r1")
    with pytest.raises(CutOverBegunError):
        replacements.discard("v")
    # The tasks' diff of the replacement's rows waits for the replacement to be at the cut-over's epoch: not
    # hydrated yet, then behind it, it is an error (never a silent refusal, which the consumer would retry).
    with pytest.raises(CutOverNotReachedError, match="is at epoch None"):
        replacements.begin_cut_over("v", "r1", 9)
    assert replacements.commit("v", "r1", 8, {b"a": b"1"}, [], {}, [])
    with pytest.raises(CutOverNotReachedError, match="is at epoch 8, not at its cut-over's epoch 9"):
        replacements.begin_cut_over("v", "r1", 9)
    assert replacements.commit("v", "r1", 9, {b"b": b"2"}, [], {}, [])
    assert replacements.begin_cut_over("v", "r1", 9)
    assert replacements.resume_cut_over("v", "r1", 9)  # found in the log again: fixed, wherever the replacement is
