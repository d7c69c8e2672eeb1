"""The commit order of :class:`EpochCommitter`, as pure logic: Kafka, Redis and the rebuild are stand-ins that
record what was called (the integration tests run the same committer on the real broker and Redis)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import pytest
import redis

from mvlog.catalog import CatalogEntry
from mvlog.changes import IndexEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import CommittedEpoch
from mvlog.connectors.redis.view_store import Lifecycle, ServingStateLostError
from mvlog.row_schema import RowSchema
from mvlog.services.pipeline import committer as committer_module
from mvlog.services.pipeline.committer import (
    AnotherWriterError,
    CommitPoint,
    EpochCommitter,
    EpochWithdrawn,
    ScriptCommit,
)

Index = dict[int, IndexEntry]


class _Index:
    def entries_at(self, view: str, partitions: int, epoch: int | None) -> Index | None:
        return None if epoch is None else {0: IndexEntry(epoch, 0, 0)}


class _Store:
    """The MCE and lifecycle of one object, as Redis would hold them."""

    def __init__(self, mce: int | None) -> None:
        self.mce_value, self.index = mce, _Index()
        self.lifecycles: list[Lifecycle] = []
        self.rederive = False  # a rebuild left the view's operator state to its consumer

    def mce(self, view: str) -> int | None:
        return self.mce_value

    def mce_and_rederive(self, view: str) -> tuple[int | None, bool]:
        return self.mce_value, self.rederive

    def holds(self, view: str, epoch: int) -> bool:
        return self.mce_value == epoch

    def set_lifecycle(self, view: str, state: Lifecycle, reason: str = "") -> None:
        self.lifecycles.append(state)


class _Catalog:
    def __init__(self) -> None:
        self.is_wiped = False

    def wiped(self) -> bool:
        return self.is_wiped

    def find(self, name: str) -> object:
        return object()


class _Writer:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Side:
    """A Redis side that records its calls in ``log`` and applies as ``apply`` says."""

    def __init__(self, log: list[str], apply: Callable[[Mapping[int, IndexEntry]], bool]) -> None:
        self.log, self._apply = log, apply

    def finish(self, index: Mapping[int, IndexEntry]) -> bool:
        self.log.append("redis")
        return self._apply(index)

    def abort(self) -> None:
        self.log.append("abort")


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A store at MCE 10, a catalog, and the rebuild: it sets the MCE to ``world["rebuilt"]`` and records
    the proof it was given."""
    store, catalog = _Store(10), _Catalog()
    state: dict[str, Any] = {"store": store, "catalog": catalog, "rebuilt": 10, "proofs": []}

    def recover_after_wipe(settings: Settings, client: Any, entry: CatalogEntry, own_last: Index | None) -> int:
        state["proofs"].append(own_last)
        store.mce_value = state["rebuilt"]
        store.rederive = bool(state.get("leave"))  # the rebuild left the view's state to its consumer
        catalog.is_wiped = False
        return int(state["rebuilt"])

    monkeypatch.setattr(committer_module, "ViewStore", lambda client, prefix: store)
    monkeypatch.setattr(committer_module, "ChangelogWriter", _Writer)
    monkeypatch.setattr(committer_module, "recover_after_wipe", recover_after_wipe)
    return state


def _committer(world: dict[str, Any], point: CommitPoint,
               rederive: Callable[[], object] | None = None) -> EpochCommitter:
    entry = CatalogEntry("v", "view", RowSchema.of({"id": "int"}, ["id"]), 1)
    return EpochCommitter(Settings(), cast(redis.Redis, None), entry, commit_point=point,
                          derived_state=point is CommitPoint.REDIS, lifecycle=lambda: Lifecycle.BACKFILLING,
                          catalog=world["catalog"], rederive=rederive)


def _produce(log: list[str], epoch: int) -> Callable[[Any], CommittedEpoch]:
    def produce(writer: Any) -> CommittedEpoch:
        log.append("kafka")
        return CommittedEpoch(epoch, {0: IndexEntry(epoch, 5, 1)})

    return produce


@pytest.mark.parametrize("point", list(CommitPoint))
def test_kafka_then_redis_then_the_mce(world: dict[str, Any], point: CommitPoint) -> None:
    committer = _committer(world, point)
    log: list[str] = []
    assert committer.mce == 10 and committer.last_committed == {0: IndexEntry(10, 0, 0)}

    def apply(index: Mapping[int, IndexEntry]) -> bool:
        world["store"].mce_value = 11
        return True

    committed = committer.commit(11, _produce(log, 11), _Side(log, apply))
    assert log == ["kafka", "redis"]
    assert committed is not None and committer.mce == 11 and committer.last_committed == committed.index


def test_a_failed_transaction_aborts_the_redis_side(world: dict[str, Any]) -> None:
    committer = _committer(world, CommitPoint.KAFKA)
    log: list[str] = []

    def produce(writer: Any) -> CommittedEpoch:
        raise RuntimeError("broker gone")

    with pytest.raises(RuntimeError, match="broker gone"):
        committer.commit(11, produce, _Side(log, lambda index: True))
    assert log == ["abort"] and committer.mce == 10


@pytest.mark.parametrize("point", list(CommitPoint))
def test_a_lost_redis_is_rolled_forward_with_the_epoch_as_proof(world: dict[str, Any], point: CommitPoint) -> None:
    committer = _committer(world, point)
    log: list[str] = []
    world["rebuilt"] = 11  # the roll-forward finds the epoch in Kafka

    def lost(index: Mapping[int, IndexEntry]) -> bool:
        raise ServingStateLostError("wiped")

    committed = committer.commit(11, _produce(log, 11), _Side(log, lost))
    assert committed is not None and committer.mce == 11
    assert world["proofs"] == [committed.index]  # the epoch's own barriers prove it committed
    assert world["store"].lifecycles == [Lifecycle.BACKFILLING]


@pytest.mark.parametrize("point", list(CommitPoint))
def test_a_refusal_means_another_writer(world: dict[str, Any], point: CommitPoint) -> None:
    committer = _committer(world, point)
    world["store"].mce_value = 12  # another writer committed meanwhile
    with pytest.raises(AnotherWriterError):
        committer.commit(11, _produce([], 11), ScriptCommit(lambda index: False))
    # A table's epoch is final in Kafka (its input offsets committed with it); a view's is not.
    assert committer.mce == (11 if point is CommitPoint.KAFKA else 10)


def test_a_withdrawn_epoch_is_redone(world: dict[str, Any]) -> None:
    committer = _committer(world, CommitPoint.REDIS)
    proof = committer.last_committed

    def withdraw(index: Mapping[int, IndexEntry]) -> bool:
        raise EpochWithdrawn("apply withdrawn")

    assert committer.commit(11, _produce([], 11), ScriptCommit(withdraw)) is None
    assert committer.mce == 10 and committer.last_committed == proof  # the Kafka attempt proves nothing


def test_a_view_commit_into_a_redis_being_rebuilt_waits_for_the_rebuild(world: dict[str, Any]) -> None:
    committer = _committer(world, CommitPoint.REDIS)
    world["rebuilt"] = 11

    def applied_then_wiped(index: Mapping[int, IndexEntry]) -> bool:
        world["store"].mce_value, world["catalog"].is_wiped = 11, True
        return True

    assert committer.commit(11, _produce([], 11), ScriptCommit(applied_then_wiped)) is not None
    assert len(world["proofs"]) == 1 and committer.mce == 11


def test_compute_again_when_redis_is_lost_while_computing(world: dict[str, Any]) -> None:
    committer, calls = _committer(world, CommitPoint.KAFKA), []

    def compute() -> int:
        calls.append(1)
        if len(calls) == 1:
            world["store"].mce_value = None  # wiped under the computation
        return len(calls)

    assert committer.compute(compute) == 2 and committer.mce == 10


def test_compute_skips_an_epoch_the_rebuild_rolled_forward(world: dict[str, Any]) -> None:
    committer = _committer(world, CommitPoint.REDIS)
    world["rebuilt"] = 12

    def compute() -> int:
        world["catalog"].is_wiped = True
        return 1

    assert committer.compute(compute, 11) is None and committer.mce == 12


def test_state_a_rebuild_left_to_the_consumer_is_rederived_before_the_next_epoch(world: dict[str, Any]) -> None:
    """Another process rebuilt Redis and left the view's operator state to its consumer: the MCE is the
    consumer's, the catalog no longer wiped, only the mark says so; the state is re-derived once, before
    the epoch is computed, and the epoch is computed as usual."""
    log: list[str] = []

    def rederive() -> None:
        log.append("rederive")
        world["store"].rederive = False  # the re-derivation clears the mark

    def compute() -> int:
        log.append("compute")
        return 7

    committer = _committer(world, CommitPoint.REDIS, rederive)
    world["store"].rederive = True
    assert committer.compute(compute, 11) == 7
    assert log == ["rederive", "compute"] and committer.mce == 10
    assert committer.ensure_serving_state() is False  # nothing left


def test_a_wipe_found_by_the_consumer_rederives_what_its_rebuild_left(world: dict[str, Any]) -> None:
    """The consumer finds Redis wiped and rebuilds it itself (the rebuild marks its own view): it
    re-derives the state after the roll-forward, then goes on."""
    calls: list[int | None] = []
    committer = _committer(world, CommitPoint.REDIS, lambda: calls.append(world["store"].mce_value))
    world["store"].mce_value, world["rebuilt"], world["leave"] = None, 10, True
    world["catalog"].is_wiped = True
    assert committer.ensure_serving_state() is True
    assert calls == [10], "re-derived once, after the roll-forward restored the MCE"


def test_a_table_refuses_a_redis_rebuilt_past_it(world: dict[str, Any]) -> None:
    committer = _committer(world, CommitPoint.KAFKA)
    world["store"].mce_value, world["rebuilt"] = None, 12
    with pytest.raises(AnotherWriterError):
        committer.ensure_serving_state()


def test_the_load_writer_is_swapped_back(world: dict[str, Any]) -> None:
    committer = _committer(world, CommitPoint.REDIS)
    usual = committer.writer
    with committer.writer_configured({"transaction.timeout.ms": 1}):
        load = committer.writer
        assert load is not usual and usual.closed  # type: ignore[attr-defined]
    assert committer.writer not in (usual, load) and load.closed  # type: ignore[attr-defined]
