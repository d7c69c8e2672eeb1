"""I6 on the real stack: Redis is wiped (FLUSHALL) under a running pipeline t1 -> mv1 -> mv2 and everything
comes back from Kafka without operator action; the pipeline carries on and the oracle holds throughout.

The wipe is a real FLUSHALL, on a redis-server of this test's own (the session's Redis is shared).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.recovery import roll_forward
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services import control_plane
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import alter_view, create_view

from ..oracle import check_oracle

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NAMES = ("t1", "mv1", "mv2", "mv3", "mv4", "mv5", "mv6")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def create_chain(settings: Settings, client: redis.Redis) -> tuple[str, ...]:
    """mv1 (a filter of t1), mv2 (a GROUP BY of mv1) and mv3, a LEFT JOIN of the two: its state indexes both
    sides by k; rows of mv1 whose k has no group in mv2 (every row of it deleted) are null-extended. mv4, a
    top-N of mv1 per k (in tasks: re-derived by ranking group), mv5, a global aggregate of mv1, and mv6, a
    union of a filter and a GROUP BY of mv1 (in tasks: re-derived by a join's two steps, a side per branch).
    (The shapes added in session 35 are re-derived by the same jobs: ``test_replay.py``'s ``--rebuild``.)"""
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE v1 > 0", client=client)
    create_view(settings, "mv2", "SELECT k, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi "
                "FROM mv1 GROUP BY k", client=client)
    create_view(settings, "mv3", "SELECT a.id, a.v1, b.n FROM mv1 a LEFT JOIN mv2 b ON a.k = b.k", client=client)
    create_view(settings, "mv4", "SELECT id, k, v1 FROM (SELECT id, k, v1, ROW_NUMBER() OVER (PARTITION BY k "
                "ORDER BY v1 DESC) AS rn FROM mv1) t WHERE rn <= 2", client=client)
    create_view(settings, "mv5", "SELECT count(*) AS n, sum(v1) AS s FROM mv1", client=client)
    create_view(settings, "mv6", "SELECT id, v1 FROM mv1 WHERE v1 > 4 UNION ALL SELECT v1, count(*) AS n FROM mv1 "
                "GROUP BY v1", client=client)
    return NAMES[1:]


def snapshot(client: redis.Redis, settings: Settings) -> dict[str, Any]:
    store = ViewStore(client, settings.topic_prefix)
    prefix = settings.topic_prefix
    return {
        "catalog": client.hgetall(CatalogStore(settings, client).key),
        **{f"{name}:{what}": client.hgetall(f"{prefix}:{{{name}}}:{what}") for name in NAMES
           for what in ("rows", "opstate")},
        **{f"{name}:mce": store.mce(name) for name in NAMES},
    }


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_flushall_under_a_running_pipeline(path: str, make_settings: Callable[..., Settings], own_redis: str,
                                           spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``tasks``: the views' operators run in Spark's tasks (mv3's join too); the table writer's rebuild
    leaves their operator state to their consumers, which re-derive it in Spark's tasks before their next
    epoch."""
    tasks = {"operators_in_tasks": True, "tasks_min_records": 0} if path == "tasks" else {}
    settings = make_settings(redis_url=own_redis, **tasks)
    caplog.set_level(logging.WARNING, logger="mvlog.services.rederive.state_rebuild")
    client = redis.Redis.from_url(own_redis)
    store = ViewStore(client, settings.topic_prefix)
    rng = random.Random(3)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client,
                      auto_commit=False)
    views = create_chain(settings, client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in views]

    def write_epochs(count: int) -> int:
        for _ in range(count):
            for _ in range(5):
                if rng.random() < 0.2:
                    t1.delete([rng.randrange(15)])
                else:
                    t1.upsert([{"id": rng.randrange(15), "v1": rng.randrange(-2, 9), "k": rng.choice("abc")}])
            last = t1.flush()
        return last

    def caught_up(epoch: int) -> Callable[[], bool]:
        return lambda: all((store.mce(name) or 0) >= epoch for name in views)

    try:
        for consumer in consumers:
            consumer.start()
        wait_for(caught_up(write_epochs(6)), "the views to catch up before the wipe")
        before = snapshot(client, settings)
        assert before["mv2:opstate"] and before["mv2:rows"] and before["mv3:opstate"] and before["mv3:rows"]

        client.flushall()
        assert client.dbsize() == 0

        # The pipeline carries on: the next epoch (empty, so rows stay as they were) makes the table writer
        # notice, rebuild everything from Kafka, and commit; the view consumers follow without a restart.
        empty = t1.flush()
        wait_for(caught_up(empty), "the views to pass the first epoch after the wipe")
        after = snapshot(client, settings)
        assert after["catalog"] == before["catalog"]
        for name in NAMES:
            assert after[f"{name}:rows"] == before[f"{name}:rows"], name
            assert after[f"{name}:opstate"] == before[f"{name}:opstate"], name
            assert after[f"{name}:mce"] == empty, name
        assert not CatalogStore(settings, client).wiped()
        in_tasks = {getattr(r, "rederived_in_tasks", None) for r in caplog.records} - {None}
        assert in_tasks == (set(views) if settings.operators_in_tasks else set()), in_tasks
        assert not any(store.meta(name).get("rederive") for name in views)

        wait_for(caught_up(write_epochs(5)), "the views to keep up after the wipe")
    finally:
        for consumer in consumers:
            consumer.stop()
        t1.close()
    checked = check_oracle(settings, client, list(NAMES))
    assert checked >= 3 * 12, "the oracle held at every committed epoch of the views, before and after"
    client.close()


def backfilling(consumer: ViewConsumer) -> bool:
    """Whether the consumer still runs a backfill (a function: mypy would keep an earlier assert's narrowing)."""
    return consumer.backfill is not None


#: Views created online over t1 (and t2) with a chunked backfill: a GROUP BY, a join whose backfill walks
#: both sides, and a self-join whose one walk of t1 feeds both sides.
BACKFILLED = {"mv1": "SELECT k, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi FROM t1 WHERE v1 > 0 "
                     "GROUP BY k",
              "mvj": "SELECT a.id, a.v1, b.w FROM t1 a JOIN t2 b ON a.k = b.k",
              "mvs": "SELECT a.id, b.id AS id2, a.v1, b.k FROM t1 a JOIN t1 b ON a.v1 = b.id"}


@pytest.mark.parametrize("path", ["driver", "tasks"])
def test_flushall_during_a_chunked_backfill(path: str, make_settings: Callable[..., Settings], own_redis: str,
                                            spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Views created online lose nothing when Redis is wiped while they backfill: their positions, counters
    and journals come back from their own changelogs (the backfill_progress mutations on their barriers),
    their operator state is re-derived from the upstream keys those positions cover, and the backfills
    resume where they were instead of starting over (which would drop the changes of keys they already
    hold).

    "tasks": the views and their backfills run in Spark's tasks, whose chunk of an epoch is saved in Redis
    until that epoch commits: a wipe that loses it after a partition committed the epoch (or while the
    rebuild holds that epoch back for want of proof) has it read again from the epoch's barriers. The
    rebuild leaves the views' operator state to their consumers, whose tasks re-derive it from the keys
    the restored positions cover (the join's, a task per join-key partition, from both sides')."""
    tasks = {"operators_in_tasks": True, "tasks_min_records": 0} if path == "tasks" else {}
    settings = make_settings(redis_url=own_redis, backfill_batch_rows=8, **tasks)
    caplog.set_level(logging.WARNING, logger="mvlog.services.rederive.state_rebuild")
    client = redis.Redis.from_url(own_redis)
    store = ViewStore(client, settings.topic_prefix)
    rng = random.Random(5)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client,
                      auto_commit=False)
    t2 = Table.create(settings, "t2", {"k": "string", "w": "int"}, ["k"], client=client, auto_commit=False)

    def write_epoch() -> int:
        for _ in range(6):
            if rng.random() < 0.2:
                t1.delete([rng.randrange(120)])
            else:
                t1.upsert([{"id": rng.randrange(120), "v1": rng.randrange(-2, 9), "k": rng.choice("abcd")}])
        t2.upsert([{"k": rng.choice("abcde"), "w": rng.randrange(10)}])
        epoch = t1.flush()
        t2.flush()
        return epoch  # where both views get: the join plans through the least latest epoch of t1 and t2

    t1.upsert([{"id": i, "v1": rng.randrange(-2, 9), "k": rng.choice("abcd")} for i in range(120)])
    t2.upsert([{"k": k, "w": i} for i, k in enumerate("abc")])
    t1.flush()
    t2.flush()
    for name, sql in BACKFILLED.items():
        create_view(settings, name, sql, client=client, backfill="chunked")
        alter_view(settings, name, client=client, backfill_rate_limit=15)  # about 8 s for t1's rows

    def rows_done(name: str) -> int:
        return int(store.backfill_state(name).get(b"rows_done", 0))

    def done(name: str) -> bool:
        return b"done" in store.backfill_state(name)

    def advance() -> None:
        epoch = write_epoch()
        for consumer in consumers:
            consumer.wait_for_epoch(epoch)

    def run_until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            advance()

    def kept(name: str) -> dict[str, Any]:
        keys = {what: f"{settings.topic_prefix}:{{{name}}}:{what}" for what in ("rows", "opstate", "backfill")}
        return {what: client.hgetall(key) for what, key in keys.items()} | {"journal": store.backfill_journal(name)}

    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in BACKFILLED]
    assert all((consumer.tasks is not None) is settings.operators_in_tasks for consumer in consumers)
    try:
        for consumer in consumers:
            consumer.start()
        run_until(lambda: all(rows_done(name) >= 20 for name in BACKFILLED), "a part of the backfills")
        for consumer in consumers:
            consumer.stop()
        assert not any(done(name) for name in BACKFILLED)
        before = {name: kept(name) for name in BACKFILLED}
        mces = {name: store.mce(name) for name in BACKFILLED}

        # 1. The consumers are stopped: the table writers notice the wipe and rebuild everything, the views
        # included; with the operators in tasks, the views' consumers re-derive their operator state.
        client.flushall()
        t1.flush()
        t2.flush()
        assert all(bool(store.meta(name).get("rederive")) is settings.operators_in_tasks for name in BACKFILLED)
        restored = {name: store.mce(name) for name in BACKFILLED}
        consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in BACKFILLED]
        in_tasks = {getattr(r, "rederived_in_tasks", None) for r in caplog.records} - {None}
        assert in_tasks == (set(BACKFILLED) if settings.operators_in_tasks else set()), in_tasks
        for name in BACKFILLED:
            if restored[name] == mces[name]:
                assert kept(name) == before[name], name
            else:
                # On Tansu nothing proves the last epoch of a stopped writer committed (see control_plane): it
                # is abandoned and redone by the next consumer; everything else comes back as it was.
                at = restored[name]
                assert at is not None and at < (mces[name] or 0)
                journal = store.backfill_journal(name)
                assert before[name]["journal"][:len(journal)] == journal
        resumed = {name: rows_done(name) for name in BACKFILLED}
        assert all(resumed[name] > 0 and not done(name) for name in BACKFILLED)

        # 2. The consumers resume from the restored positions; Redis is wiped again while they run.
        for consumer in consumers:
            assert consumer.backfill is not None and consumer.backfill.rows_done == resumed[consumer.entry.name]
            consumer.start()
        run_until(lambda: all(rows_done(name) >= resumed[name] + 15 or done(name) for name in BACKFILLED),
                  "more of the backfills")
        assert not all(done(name) for name in BACKFILLED)
        client.flushall()
        run_until(lambda: all(done(name) for name in BACKFILLED), "the end of the backfills")
        for consumer in consumers:
            assert not backfilling(consumer) and (chunked := consumer.backfills.chunked) is not None and chunked.done

        # 3. Wiped once more after they finished: they stay finished (the last payload says so).
        client.flushall()
        advance()
        assert all(done(name) for name in BACKFILLED) and not any(backfilling(c) for c in consumers)
        advance()
    finally:
        for consumer in consumers:
            consumer.stop()
        t1.close()
        t2.close()
    checked = check_oracle(settings, client, ["t1", "t2", *BACKFILLED], spark)
    assert checked >= 20, "the oracle held at every epoch: on the covered keys while backfilling, in full after"
    client.close()


def test_a_rebuild_killed_half_way_is_taken_over_within_one_lease(make_settings: Callable[..., Settings],
                                                                  own_redis: str, spark: Any) -> None:
    """A process killed while it rebuilds leaves the rebuild lock behind and Redis half rebuilt (here: t1
    restored, mv1's rows rolled forward without its operator state). The next process waits for the
    lock's lease (renewed only while its holder lives), not for the longest rebuild, and finishes it."""
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    store = ViewStore(client, settings.topic_prefix)
    rng = random.Random(11)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client,
                      auto_commit=False)
    views = create_chain(settings, client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name in views]
    try:
        for _ in range(5):
            t1.upsert([{"id": rng.randrange(15), "v1": rng.randrange(-2, 9), "k": rng.choice("abc")}
                       for _ in range(5)])
            t1.delete([rng.randrange(15)])
            t1.flush()
            for consumer in consumers:
                consumer.catch_up()
        before = snapshot(client, settings)
        # What the live processes would prove about their last epochs (see control_plane.restore).
        proofs = {name: store.index.entries_at(name, 3, store.mce(name)) for name in NAMES}
        catalog = CatalogStore(settings, client)
        entries = {name: catalog.get(name) for name in NAMES}

        client.flushall()
        dead = client.lock(f"{settings.topic_prefix}:control-plane:rebuild", timeout=control_plane.LOCK_LEASE_S,
                           thread_local=False)
        assert dead.acquire(blocking=False)  # ... and its holder is killed: nobody renews or releases it
        catalog.rebuild_from_topic()
        control_plane.restore(settings, client, entries["t1"], proofs["t1"])
        roll_forward(settings, store, entries["mv1"], proven=proofs["mv1"])  # rows, no operator state yet
        assert store.mce("mv1") == before["mv1:mce"] and not client.exists(f"{settings.topic_prefix}:{{mv2}}:meta")

        started = time.monotonic()
        assert control_plane.ensure_control_plane(settings, client, proofs)
        assert time.monotonic() - started < control_plane.LOCK_LEASE_S + 60, "waited for more than one lease"
        if settings.operators_in_tasks:  # (``--operators-in-tasks``) the views' state is left to their consumers
            assert all(store.meta(name).get("rederive") for name in ("mv1", "mv2"))
            for consumer in consumers:  # ... whose writers re-derive it in tasks before their next epoch
                assert consumer.committer.ensure_serving_state()
        assert snapshot(client, settings) == before
        assert not catalog.wiped()
        catalog.close()
    finally:
        for consumer in consumers:
            consumer.stop()
        t1.close()
    client.close()


def test_a_table_epoch_a_view_read_survives_a_wipe_while_the_writer_is_down(make_settings: Callable[..., Settings],
                                                                            own_redis: str, spark: Any) -> None:
    """Redis is wiped while t1 has no writer. Nothing in Kafka says t1's last epoch committed (on Tansu
    aborted records are delivered too, and no later barrier names it), but mv1 was built on it, which it
    only does with committed epochs: the next writer keeps that epoch instead of abandoning it under mv1."""
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    store = ViewStore(client, settings.topic_prefix)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client,
                      auto_commit=False)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE v1 > 0", client=client)
    consumer = ViewConsumer(settings, "mv1", spark=spark, client=client)
    try:
        for i in range(4):
            t1.upsert([{"id": i, "v1": i - 1, "k": "a"}, {"id": i + 10, "v1": 5, "k": "b"}])
            last = t1.flush()
        assert consumer.catch_up() == last
        t1.close()  # the writer is down when Redis is wiped

        client.flushall()
        t1 = Table.open(settings, "t1", client, auto_commit=False)
        assert store.mce("t1") == last, "t1's last epoch, which mv1 read, was abandoned"
        t1.upsert([{"id": 1, "v1": 7, "k": "c"}])
        t1.delete([2])
        after = t1.flush()
        assert consumer.catch_up() == after
    finally:
        consumer.stop()
        t1.close()
    assert check_oracle(settings, client, ["t1", "mv1"]) >= 5
    client.close()


def test_a_rebuild_ends_while_a_table_writer_keeps_writing(make_settings: Callable[..., Settings],
                                                           own_redis: str) -> None:
    """A table writer started after the wipe rolls its own table forward and writes on (its MCE is back;
    the rebuild of everything else is not its job). Another process then rebuilds the control plane:
    the table's changelog never goes idle, so the rebuild rolls it forward up to its own start and ends."""
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    store = ViewStore(client, settings.topic_prefix)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client,
                      auto_commit=False)
    for i in range(3):
        t1.upsert([{"id": i, "v1": i, "k": "a"}])
        t1.flush()
    t1.close()
    client.flushall()
    writer = Table.open(settings, "t1", redis.Redis.from_url(own_redis))  # commits an epoch every 200 ms
    try:
        writer.upsert([{"id": 9, "v1": 9, "k": "b"}])
        before = store.mce("t1") or 0
        wait_for(lambda: (store.mce("t1") or 0) > before, "the new writer's first epoch")
        assert CatalogStore(settings, client).wiped()
        started = time.monotonic()
        assert control_plane.ensure_control_plane(settings, client)
        assert time.monotonic() - started < 60, "the rebuild followed the live changelog"
        mce = store.mce("t1") or 0
        wait_for(lambda: (store.mce("t1") or 0) > mce, "the writer to carry on after the rebuild")
    finally:
        writer.close()
    assert check_oracle(settings, client, ["t1"]) == 0  # a table: its Redis rows equal its changelog
    client.close()


def test_a_view_created_during_a_wipe_leaves_the_wipe_for_the_rebuild(make_settings: Callable[..., Settings],
                                                                     own_redis: str) -> None:
    """DDL into a wiped Redis reloads the catalog and does not put the control-plane marker back: the
    processes that have not noticed the wipe yet still do, and rebuild the rest."""
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    catalog = CatalogStore(settings, client)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "k": "string"}, ["id"], client=client,
                      auto_commit=False)
    t1.upsert([{"id": 1, "v1": 3, "k": "a"}])
    epoch = t1.flush()
    t1.close()
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE v1 > 0", client=client)
    client.flushall()
    create_view(settings, "mv2", "SELECT count(*) AS n FROM mv1", client=client)
    assert catalog.wiped() and catalog.names() == ["mv1", "mv2", "t1"]
    assert control_plane.ensure_control_plane(settings, client)
    assert not catalog.wiped() and ViewStore(client, settings.topic_prefix).mce("t1") in (epoch, None)
    catalog.close()
    client.close()
