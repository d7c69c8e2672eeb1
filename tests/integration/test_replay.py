"""``mvlog replay`` on the real stack: re-derived epochs equal the original changelog, re-delivery moves a
consumer group to exactly an epoch's first record, dry runs change nothing, bad input is refused clearly."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from mvlog.changes import Change, Epoch
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.epoch import epoch_millis
from mvlog.schemas.codec import TYPE_BARRIER, decode_barrier, record_type
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.rederive.derive import Derivation, new_replay_topic, plan_derivation
from mvlog.services.rederive.join_tasks import JoinDerivation, JoinRebuild
from mvlog.services.rederive.tasks import TaskDerivation
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle
from .test_cli_views import mvlog, ok, refused

pytestmark = [pytest.mark.integration, pytest.mark.spark]

VIEWS = [
    ("mv1", "SELECT * FROM t1 WHERE deleted = false"),
    ("mv2", "SELECT sum(v1) AS s FROM mv1"),
    # Through a WITH query (a filter/project: routed by its rows' groups, run first by each task).
    ("mvg", "WITH m AS (SELECT k, v1 FROM mv1 WHERE v1 <> 3) "
            "SELECT k, count(*) AS n, min(v1) AS lo, max(v1) AS hi, avg(v1) AS a FROM m GROUP BY k"),
    ("mvj", "SELECT a.id, a.v1, b.w FROM mv1 a JOIN t2 b ON a.v1 = b.id"),
    ("mvs", "SELECT a.id, b.id AS id2, a.v1, b.k FROM mv1 a JOIN mv1 b ON a.v1 = b.id"),  # a self-join
    ("mvjg", "SELECT a.k, count(*) AS n, sum(b.w) AS s FROM mv1 a JOIN t2 b ON a.v1 = b.id GROUP BY a.k"),
    # A hopping window over ``id`` as the time (ms): a row in three windows, in the tasks of their partitions.
    ("mvw", "SELECT window.start, k, count(*) AS n, sum(v1) AS s FROM mv1 GROUP BY window(id, '6 milliseconds', "
            "'2 milliseconds'), k"),
    # A windowed GROUP BY over an anti join (its subquery run in the join-key tasks, each row without a
    # match then sent to the tasks of its windows' partitions).
    ("mvja", "SELECT window.start, a.k, count(*) AS n, max(a.v1) AS hi FROM mv1 a WHERE NOT EXISTS (SELECT 1 "
             "FROM t2 b WHERE b.id = a.v1 AND b.w > 0) GROUP BY window(a.id, '6 milliseconds', '2 milliseconds'), a.k"),
    # A global aggregate over a LEFT JOIN (folded by its one row's partition's task).
    ("mvjn", "SELECT count(*) AS n, sum(b.w) AS s FROM mv1 a LEFT JOIN t2 b ON a.v1 = b.id"),
    ("mvt", "SELECT id, k, v1, rn FROM (SELECT id, k, v1, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v1 DESC) AS rn "
            "FROM mv1) t WHERE rn <= 2"),
    # A top-N over a join ranked per join key (Nexmark q9's shape): per row of t2, its mv1 row of highest id.
    ("mvjr", "SELECT id, v1, w FROM (SELECT a.id, a.v1, b.w, ROW_NUMBER() OVER (PARTITION BY b.id "
             "ORDER BY a.id DESC) AS rn FROM mv1 a JOIN t2 b ON a.v1 = b.id) r WHERE rn = 1"),
    # A chain of joins on one key, mv1 read twice: every step in the key's task.
    ("mvjc", "SELECT a.id, b.id AS id2, c.id AS id3 FROM mv1 a JOIN t2 b ON a.v1 = b.id LEFT JOIN mv1 c "
             "ON b.id = c.v1 AND c.k = 'a'"),
    # A GROUP BY over a GROUP BY: mv1's rows by their k, the subquery's rows by their count.
    ("mvgg", "SELECT n, count(*) AS c, min(k) AS lo FROM (SELECT k, count(*) AS n FROM mv1 GROUP BY k) g GROUP BY n"),
    # A UNION ALL over three views: filters (each input row to its own key's task) and a GROUP BY (by group,
    # its state there), then the output by the view key.
    ("mvu", "SELECT id, v1 FROM mv1 WHERE v1 > 0 UNION ALL SELECT w, count(*) AS n FROM t2 GROUP BY w "
            "UNION ALL SELECT id, v1 * 10 FROM t1 WHERE k = 'a' UNION ALL SELECT a.id, b.w FROM mv1 a JOIN t2 b "
            "ON a.v1 = b.id "  # and a join branch: mv1's and t2's rows routed for it by its join key
            # and a join of subqueries (mv1's rows by the join key of their groups, t2's by their filtered id)
            # and a GROUP BY over a filter subquery (mv1's rows by the group of the subquery's row)
            "UNION ALL SELECT p.v1, q.w FROM (SELECT v1, count(*) AS n FROM mv1 GROUP BY v1) p "
            "JOIN (SELECT id, w FROM t2 WHERE w > 0) q ON p.v1 = q.id "
            "UNION ALL SELECT b, count(*) AS n FROM (SELECT v1 % 3 AS b FROM mv1 WHERE id > 2) f GROUP BY b"),
    # A join of subqueries (a GROUP BY on a key among its groups, a filter): each side's rows to the task of
    # the join key they will have, where the groups, the filter and the join run.
    ("mvgj", "SELECT p.v1, p.n, q.id, q.w FROM (SELECT v1, count(*) AS n FROM mv1 GROUP BY v1) p "
             "JOIN (SELECT id, w FROM t2 WHERE w > 0) q ON p.v1 = q.id"),
]
GROUPED = ("mv2", "mvg", "mvw")  # one-upstream aggregates, in the GROUP BY's tasks: global, grouped, windowed
# Views run by operator key in tasks (the join's two shuffles: JoinDerivation, JoinRebuild): the joins and
# a top-N (its ranking groups by k, rows moving between groups as k changes), a top-N over a join, a chain
# of joins, a GROUP BY over a GROUP BY, a union and a join of subqueries.
JOINS = ("mvj", "mvs", "mvjg", "mvja", "mvjn", "mvt", "mvjr", "mvjc", "mvgg", "mvu", "mvgj")


def build(settings: Settings, client: redis.Redis, spark: Any, epochs: int = 8, seed: int = 7) -> list[ViewConsumer]:
    """t1 -> mv1 -> mv2, mvg; mv1 JOIN t2 -> mvj; mv1 JOIN mv1 -> mvs, with ``epochs`` epochs of inserts,
    updates and deletes."""
    rng = random.Random(seed)
    t1 = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean", "k": "string"}, ["id"],
                      client=client, auto_commit=False)
    t2 = Table.create(settings, "t2", {"id": "int", "w": "int"}, ["id"], client=client, auto_commit=False)
    for name, sql in VIEWS:
        create_view(settings, name, sql, client=client)
    consumers = [ViewConsumer(settings, name, spark=spark, client=client) for name, _ in VIEWS]
    for _ in range(epochs):
        for _ in range(6):
            if rng.random() < 0.25:
                t1.delete([rng.randrange(12)])
            else:
                t1.upsert([{"id": rng.randrange(12), "v1": rng.randrange(-3, 5), "deleted": rng.random() < 0.2,
                            "k": rng.choice("ab")}])
        t2.upsert([{"id": rng.randrange(-3, 5), "w": rng.randrange(4)}])
        t1.flush()
        t2.flush()
    t1.close()
    t2.close()
    for consumer in consumers:
        consumer.catch_up()
    return consumers


def read_log(settings: Settings, client: redis.Redis, name: str) -> list[Epoch]:
    entry = CatalogStore(settings, client).get(name)
    store = ViewStore(client, settings.topic_prefix)
    with ChangelogReader(settings, name, entry.key_columns, entry.partitions, store.index,
                         upto_epoch=store.mce(name)) as reader:
        return list(reader.epochs(idle_timeout=10.0))


def as_bag(changes: list[Change]) -> Counter[str]:
    return Counter(json.dumps([c.op.value, c.key, c.before, c.after], sort_keys=True, default=str) for c in changes)


def record_progress(into: list[tuple[int, int]], done: int, total: int) -> None:
    into.append((done, total))


def stop(consumers: list[ViewConsumer]) -> None:
    for consumer in consumers:
        consumer.stop()


def test_rederived_epochs_equal_the_original_changelog(settings: Settings, redis_client: redis.Redis,
                                                       spark: Any) -> None:
    """Every view (filter, global sum, GROUP BY with min/max/avg, join): the epochs re-derived from the
    upstreams for a range in the middle of the log equal the view's changelog, change for change, with
    the same prev_epoch chain; the Spark engine agrees with the local one."""
    consumers = build(settings, redis_client, spark)
    try:
        for name, _ in VIEWS:
            original = read_log(settings, redis_client, name)
            first, last = original[3].epoch, original[-2].epoch
            plan = plan_derivation(settings, redis_client, name, first, last)
            expected = [e for e in original if first <= e.epoch <= last]
            assert plan.epochs == [e.epoch for e in expected]
            for engine in ("local", "spark") if name in (*GROUPED, *JOINS) else ("local",):
                derived = list(Derivation(settings, redis_client, plan, engine, spark=spark).epochs())
                assert [d.epoch for d in derived] == [e.epoch for e in expected], (name, engine)
                assert [d.prev_epoch for d in derived] == [e.prev_epoch for e in expected], (name, engine)
                for mine, theirs in zip(derived, expected, strict=True):
                    assert as_bag(mine.changes.to_changes()) == as_bag(theirs.changes), (name, engine, mine.epoch)
    finally:
        stop(consumers)


def test_derive_into_topic_and_dry_run(settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    """The CLI's dry run lists the epochs and offsets and creates nothing; --execute writes a new changelog
    whose epochs (read back as any changelog) equal the view's."""
    consumers = build(settings, redis_client, spark, epochs=5)
    stop(consumers)
    original = read_log(settings, redis_client, "mvg")
    first = original[1].epoch
    dry = json.loads(ok(mvlog(settings, "replay", "derive", "mvg", "--from-epoch", str(first), "--into-topic",
                              "--topic-name", "mvg.inspect", "--output", "json")).stdout)
    assert dry["dry_run"] and not dry["executed"] and dry["epochs"] == len(original) - 1
    assert dry["upstreams"][0]["view"] == "mv1" and dry["upstreams"][0]["partitions"]
    topics = AdminClient({"bootstrap.servers": settings.bootstrap_servers}).list_topics(timeout=10).topics
    assert settings.changelog_topic("mvg.inspect") not in topics, "a dry run creates no topic"
    done = json.loads(ok(mvlog(settings, "replay", "derive", "mvg", "--from-epoch", str(first), "--into-topic",
                               "--topic-name", "mvg.inspect", "--execute", "--output", "json")).stdout)
    assert done["executed"] and done["epochs_written"] == len(original) - 1
    entry = CatalogStore(settings, redis_client).get("mvg")
    store = ViewStore(redis_client, settings.topic_prefix)
    with ChangelogReader(settings, "mvg.inspect", entry.key_columns, entry.partitions, store.index,
                         upto_epoch=original[-1].epoch) as reader:
        copied = list(reader.epochs(idle_timeout=10.0))
    assert [e.epoch for e in copied] == [e.epoch for e in original[1:]]
    for mine, theirs in zip(copied, original[1:], strict=True):
        assert as_bag(mine.changes) == as_bag(theirs.changes)
    # Never into a view's own changelog, nor twice into the same one.
    assert "mv1 is an existing table or view" in refused(mvlog(settings, "replay", "derive", "mvg", "--into-topic",
                                                               "--topic-name", "mv1"))
    assert "already holds re-derived epochs" in refused(mvlog(settings, "replay", "derive", "mvg", "--into-topic",
                                                              "--topic-name", "mvg.inspect", "--execute"))


def test_rebuild_restores_serving_state_and_the_pipeline_carries_on(settings: Settings, redis_client: redis.Redis,
                                                                    spark: Any) -> None:
    """After the view's rows and operator state are lost (a GROUP BY's, a join's), `replay derive --rebuild
    --execute --engine spark` restores both exactly in Spark's tasks; a dry run does nothing; the views then
    keep up with new epochs and the oracle holds."""
    consumers = build(settings, redis_client, spark, epochs=5)
    stop(consumers)
    store = ViewStore(redis_client, settings.topic_prefix)
    rows_key, state_key = f"{settings.topic_prefix}:{{mvg}}:rows", f"{settings.topic_prefix}:{{mvg}}:opstate"
    order_key = f"{settings.topic_prefix}:{{mvg}}:keyorder"
    rows, state = redis_client.hgetall(rows_key), redis_client.hgetall(state_key)
    order = redis_client.zrange(order_key, 0, -1)
    assert rows and state and len(order) == len(rows)
    redis_client.delete(rows_key, state_key, order_key)
    ok(mvlog(settings, "replay", "derive", "mvg", "--rebuild"))
    assert not redis_client.exists(rows_key), "a dry run changes nothing"
    # The GROUP BY's operator runs in Spark's tasks: each partition's rows and state are rebuilt by its task.
    out = json.loads(ok(mvlog(settings, "replay", "derive", "mvg", "--rebuild", "--execute", "--engine", "spark",
                              "--output", "json")).stdout)
    assert out["in_tasks"] and out["executed"] and out["rows"] == len(rows), out
    assert redis_client.hgetall(rows_key) == rows
    assert redis_client.hgetall(state_key) == state
    assert redis_client.zrange(order_key, 0, -1) == order
    assert not redis_client.exists(f"{settings.topic_prefix}:{{mvg}}:rows.rebuild"), "the staging is swapped in"
    # The joins' rebuilds run in tasks too, a task per join-key partition: rows, key order and both sides'
    # indexes as they were (the self-join's: one read of mv1, routed once per side; the GROUP BY over a
    # join's: its joined rows then folded by a task per group partition, its groups' state beside).
    for join in ("mv2", "mvw", *JOINS):  # a global aggregate's by its one row's partition's task
        join_keys = [f"{settings.topic_prefix}:{{{join}}}:{what}" for what in ("rows", "opstate", "keyorder")]
        join_rows, join_state = redis_client.hgetall(join_keys[0]), redis_client.hgetall(join_keys[1])
        join_order = redis_client.zrange(join_keys[2], 0, -1)
        assert join_rows and join_state, join
        redis_client.delete(*join_keys)
        if join == "mvjg":  # the CLI once (a process and a Spark each), the same jobs in this one for the others
            out = json.loads(ok(mvlog(settings, "replay", "derive", join, "--rebuild", "--execute", "--engine",
                                      "spark", "--output", "json")).stdout)
            assert out["in_tasks"] and out["executed"] and out["rows"] == len(join_rows), out
        else:
            plan = plan_derivation(settings, redis_client, join, store.mce(join))
            tasks = (TaskDerivation.for_plan(settings, redis_client, plan, spark)
                     or JoinRebuild.for_plan(settings, redis_client, plan, spark))
            assert tasks is not None, join
            assert tasks.rebuild().rows == len(join_rows), join
        assert redis_client.hgetall(join_keys[0]) == join_rows, join
        assert redis_client.hgetall(join_keys[1]) == join_state, join
        assert redis_client.zrange(join_keys[2], 0, -1) == join_order, join
    with Table.open(settings, "t1", client=redis_client, auto_commit=False) as t1:
        t1.upsert([{"id": 1, "v1": -9, "deleted": False, "k": "a"}, {"id": 2, "v1": 40, "deleted": False, "k": "b"}])
        t1.flush()
    for name in ("mv1", *GROUPED, *JOINS):
        consumer = ViewConsumer(settings, name, spark=spark, client=redis_client)
        consumer.catch_up()
        consumer.stop()
    assert store.mce("mvg") == store.mce("mv2") == store.mce("mvw") == store.mce("t1")
    assert check_oracle(settings, redis_client, ["t1", "t2", "mv1", *GROUPED, *JOINS]) > 0


def _consume_all(settings: Settings, client: redis.Redis, view: str, group: str) -> list[tuple[int, int, int]]:
    """(partition, offset, epoch) of everything the group receives up to the last committed barrier."""
    entry = CatalogStore(settings, client).get(view)
    store = ViewStore(client, settings.topic_prefix)
    ends = {p: e.offset for p in range(entry.partitions) if (e := store.index.latest(view, p)) is not None}
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": group,
                         "session.timeout.ms": 6000, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([settings.changelog_topic(view)])
    seen: list[tuple[int, int, int]] = []
    position: dict[int, int] = {}
    deadline = time.monotonic() + 60
    try:
        while any(position.get(p, -1) < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"group {group} did not reach the end: {position} < {ends}"
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            partition, offset = message.partition() or 0, message.offset() or 0
            epoch = (decode_barrier(message.value() or b"").epoch if record_type(message.headers()) == TYPE_BARRIER
                     else 0)
            seen.append((partition, offset, epoch))
            position[partition] = offset
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen


def test_redeliver_from_an_epoch(settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    """A dry run moves nothing; --execute moves the group to the first record of epoch e on every partition,
    and the group then receives exactly the records from there to the end; --to-datetime gives the same."""
    consumers = build(settings, redis_client, spark, epochs=6)
    stop(consumers)
    group = f"{settings.topic_prefix}.g"
    everything = _consume_all(settings, redis_client, "mv1", group)
    store = ViewStore(redis_client, settings.topic_prefix)
    epochs = [e.epoch for e in store.index.between("mv1", 0, 0, store.mce("mv1") or 0)]
    target = epochs[3]
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    topic = settings.changelog_topic("mv1")

    def committed() -> dict[int, int]:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(3)])
        return {tp.partition: tp.offset for tp in admin.list_consumer_group_offsets([request])[group].result(10)
                .topic_partitions}

    before = committed()
    dry = json.loads(ok(mvlog(settings, "replay", "redeliver", "mv1", "--group", group, "--to-epoch", str(target),
                              "--output", "json")).stdout)
    assert dry["dry_run"] and dry["epoch"] == target and committed() == before
    starts = {p: store.index.before("mv1", p, target).offset + 1 for p in range(3)}  # type: ignore[union-attr]
    assert {p["partition"]: p["offset"] for p in dry["partitions"]} == starts
    assert all(p["epochs"] == len(epochs) - 3 for p in dry["partitions"])
    table = ok(mvlog(settings, "replay", "redeliver", "mv1", "--group", group, "--to-epoch", str(target),
                     "--execute")).stdout
    assert "moved" in table and committed() == starts
    again = _consume_all(settings, redis_client, "mv1", group)
    expected = [(p, o) for p, o, _ in everything if o >= starts[p]]
    assert sorted((p, o) for p, o, _ in again) == sorted(expected), "exactly the records from e's first record on"
    assert min(e for _, _, e in again if e) == target
    # The same reset by time: the first epoch opened at or after the target's millisecond.
    millis = epoch_millis(target)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000)) + f".{millis % 1000:03d}"
    by_time = json.loads(ok(mvlog(settings, "replay", "redeliver", "mv1", "--group", group, "--to-datetime", iso,
                                  "--output", "json")).stdout)
    assert by_time["epoch"] == target


def test_replay_refuses_bad_input(settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    """Unknown view, epochs outside the retained range (naming the oldest retained epoch), a time before
    retention, and an active consumer group (naming its state and members) are refused in one line."""
    consumers = build(settings, redis_client, spark, epochs=4)
    stop(consumers)
    group = f"{settings.topic_prefix}.busy"
    assert "unknown table or view 'nope'" in refused(mvlog(settings, "replay", "redeliver", "nope", "-g", group,
                                                           "--to-earliest"))
    assert "unknown table or view 'nope'" in refused(mvlog(settings, "replay", "derive", "nope", "--rebuild"))
    store = ViewStore(redis_client, settings.topic_prefix)
    epochs = [e.epoch for e in store.index.between("mv1", 0, 0, store.mce("mv1") or 0)]
    for p in range(3):  # retention deleted the first two epochs (the index forgets them with Kafka)
        store.index.trim_before("mv1", p, epochs[2])
    error = refused(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-epoch", str(epochs[0])))
    assert f"oldest retained epoch {epochs[2]}" in error
    error = refused(mvlog(settings, "replay", "derive", "mv2", "--from-epoch", "1", "--into-topic"))
    assert "oldest retained epoch" in error
    error = refused(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-epoch", str(epochs[-1] + 1)))
    assert "above the last committed epoch" in error
    error = refused(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-datetime", "2001-01-01T00:00"))
    assert "before retention" in error and str(epochs[2]) in error
    error = refused(mvlog(settings, "replay", "derive", "mv2", "--into-topic", "--execute"))
    assert "mv1: re-deriving needs its changelog from its first epoch" in error
    # An active group: a member is consuming.
    member = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": group, "session.timeout.ms": 6000,
                       "client.id": "replay-test-member"})
    member.subscribe([settings.changelog_topic("mv1")])
    try:
        deadline = time.monotonic() + 30
        while not member.assignment():
            assert time.monotonic() < deadline
            member.poll(0.2)
        error = refused(mvlog(settings, "replay", "redeliver", "mv1", "-g", group, "--to-latest", "--execute"))
        assert f"consumer group {group} is active" in error and "members:" in error
    finally:
        member.close()


def test_derive_in_tasks_equals_the_changelog_and_resumes_an_earlier_attempt(
        settings: Settings, redis_client: redis.Redis, spark: Any) -> None:
    """A filter passing its upstream's key through (mv1) and a GROUP BY (mvg) are re-derived by a Spark
    task per partition, the joins (mvj, and mvs of mv1 with itself) by the live path's two shuffles (join
    key, then view key): the new changelog equals the view's, epoch for epoch and change for change, with
    the same prev_epoch chain.
    An earlier attempt that committed the first epochs of every partition (a task that died) is resumed:
    each partition holds each epoch's barrier exactly once. A global aggregate (mv2) is derived by the task
    of its one row's partition, the others writing barriers only. The CLI takes the task path with
    --engine spark (a windowed GROUP BY's job and an aggregate over a join's)."""
    consumers = build(settings, redis_client, spark)
    stop(consumers)
    catalog = CatalogStore(settings, redis_client)
    for name in JOINS:
        assert TaskDerivation.for_plan(settings, redis_client, plan_derivation(settings, redis_client, name)) is None
    assert JoinDerivation.for_plan(settings, redis_client, plan_derivation(settings, redis_client, "mv2")) is None
    for name in ("mv1", *GROUPED, *JOINS):
        entry = catalog.get(name)
        original = read_log(settings, redis_client, name)
        first, last = original[len(original) // 2].epoch, original[-2].epoch  # a hydration with groups
        plan = plan_derivation(settings, redis_client, name, first, last)
        tasks: TaskDerivation | JoinDerivation | None = (JoinDerivation if name in JOINS else TaskDerivation).for_plan(
            settings, redis_client, plan, spark)
        assert tasks is not None
        target = f"{name}.tasks"
        new_replay_topic(settings, redis_client, entry, target)
        earlier = tasks.derive_into(target, on_job=lambda job: replace(job, epochs=job.epochs[:2])).toArrow()  # type: ignore[arg-type, type-var]
        assert sorted(earlier.column("epoch").to_pylist()) == sorted(plan.epochs[:2] * entry.partitions)
        progress: list[tuple[int, int]] = []
        derived = tasks.run(target, partial(record_progress, progress))
        assert (derived.name, derived.epochs) == (target, len(plan.epochs))
        # The progress ends with every task of the job done: the upstream's reads and a task per partition.
        assert progress and progress[-1][0] == progress[-1][1] >= entry.partitions, progress
        for partition in range(entry.partitions):
            barriers = partition_barriers(settings, target, partition, 0)
            chain = list(zip(plan.epochs, [plan.prev_epoch, *plan.epochs[:-1]], strict=True))
            assert [(b.epoch, b.prev_epoch) for b in barriers] == chain, (name, partition)
        store = ViewStore(redis_client, settings.topic_prefix)
        with ChangelogReader(settings, target, entry.key_columns, entry.partitions, store.index,
                             upto_epoch=last) as reader:
            copied = list(reader.epochs(idle_timeout=10.0))
        expected = [e for e in original if first <= e.epoch <= last]
        assert [(e.epoch, e.prev_epoch) for e in copied] == [(e.epoch, e.prev_epoch) for e in expected], name
        for mine, theirs in zip(copied, expected, strict=True):
            assert as_bag(mine.changes) == as_bag(theirs.changes), (name, mine.epoch)
        assert derived.changes == sum(len(e.changes) for e in expected)
    for name in ("mvw", "mvjg"):  # the CLI: a process (and a Spark) each, so one of each kind of job
        done = json.loads(ok(mvlog(settings, "replay", "derive", name, "--into-topic", "--engine", "spark",
                                   "--execute", "--output", "json")).stdout)
        assert done["in_tasks"] and done["executed"] and done["epochs_written"] == len(read_log(settings, redis_client,
                                                                                                name))
