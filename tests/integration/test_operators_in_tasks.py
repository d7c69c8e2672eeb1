"""Operators in Spark's tasks (issue 19, item 2; ``Settings.operators_in_tasks``), on the real stack
with a multi-process Spark (``local-cluster[2,1,1024]``: two executors in their own JVMs and Python
workers): filter/project views, a GROUP BY shuffled by its groups' partitions, and two-view inner, full
outer and anti joins shuffled by their join keys' partitions and then by their view key's, whose partitions
are computed, written (a Kafka transaction per partition) and staged by tasks (the GROUP BY's and the
joins' with their operator state), their epochs committed in Redis by the driver.

Also a filter whose key is its upstream's renamed (``id AS order_id``), over 2 partitions where its
upstream has 3: its input shuffled by the partition of its own key (``mvlog.views.key_routing``).

* I1: the views equal DuckDB's evaluation at every committed epoch, Redis equals their changelog, and
  an independent client reading the changelog (confluent-kafka and fastavro only) finds every epoch
  whole, one barrier per partition, though each partition committed in its own transaction.
* I2 with a transaction per partition: the driver SIGKILLed by a GROUP BY's task right after its
  partition committed an epoch (other partitions had or had not): the next consumer's tasks find what
  committed, recompute it from the committed state, write only the rest, and the view loses and doubles
  nothing; then the same with the join's task of view partition 0 (after its second shuffle). In the
  same run, a filter view's task kills only its own Python worker after its first
  epoch, and another of its tasks SIGKILLs its executor's JVM after its first epoch: Spark retries
  both (the second on the other executor, or on the one the cluster's worker starts in place of the
  dead one), and each retry finds its first epoch committed.
"""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.partition_epochs import PartitionBarrier
from mvlog.services.table_writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle
from .barrier_check import assert_barriers_once
from .independent_consumer import PartitionLog, check_whole_epochs, read_topic
from .processes.task_view_runner import run as run_views

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]

CLUSTER = "local-cluster[2,1,1024]"
VIEWS = [
    ("mvf", "SELECT * FROM t1 WHERE deleted = false"),
    ("mvp", "SELECT id, v1 + 1 AS v2, CASE WHEN v1 > 0 THEN 'pos' ELSE 'neg' END AS sign FROM t1"),
    ("mvf2", "SELECT id, v1 FROM mvf WHERE v1 > 0"),  # on a view maintained in tasks
    # A GROUP BY: shuffled by its groups' partitions, state per group read and staged by the tasks; about
    # three upstream keys a group, so updates and deletes empty groups (the changelog's deletes) and
    # move the extremes.
    ("mvg", "SELECT id % 40 AS b, count(*) AS n, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi, avg(v1) AS a "
            "FROM t1 WHERE deleted = false GROUP BY id % 40"),
]
# The upstream's key under another name, and over two partitions where t1 has three (either alone is
# enough): other key bytes, so the input is shuffled by the partition of the key it will have
# (mvlog.views.key_routing), no state.
RENAMED = ("mvr", "SELECT v1, id AS order_id FROM t1 WHERE v1 <> 0")


# A two-view inner join: both inputs shuffled by their join key's partition (the buckets' state read and
# staged by those tasks), the output shuffled again by the view key's partition, where it is written.
# About two t2 rows per join key, so deletes and updates of t2 empty buckets and move rows between them.
JOIN = ("mvj", "SELECT t1.id, t2.id AS id2, t1.v1, t2.w FROM t1 JOIN t2 ON t1.v1 = t2.k WHERE t1.deleted = false")
T2 = {"id": "int", "k": "int", "w": "int"}
LONE = 100  # the join key of one row of each side, inserted and then deleted: both its buckets empty
# A full outer join, the same way. Its LONE rows: t1's null-extended, then retracted when t2's arrives
# (its key's first match), then t2's null-extended when t1's leaves (its key's last match), then gone;
# random t2 updates and deletes empty and fill t2's buckets under t1's rows too.
FULL = ("mvjf", "SELECT t1.id, t2.id AS id2, t1.v1, t2.k, t2.w FROM t1 FULL JOIN t2 ON t1.v1 = t2.k")
# An anti join, the same way (t2's rows routed by the column its subquery passes through): t1's LONE row
# in it, then out when t2's arrives, a row of t1 in or out as its key's last match leaves or arrives.
ANTI = ("mvja", "SELECT t1.id, t1.v1 FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.v1 AND t2.w < 80)")
JOINS = [JOIN, FULL, ANTI]


def _settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(spark_master=CLUSTER, operators_in_tasks=True, tasks_min_records=0, partitions=3)


def _epochs(table: Table, rng: random.Random, epochs: int, rows: int, t2: Table | None = None) -> int:
    """``epochs`` epochs of upserts (new keys and updates), deletes and one empty epoch; the last one.
    With ``t2``: after each, an epoch of ``t2`` (the first one inserts a row of each table with join key
    :data:`LONE`, the third deletes both, each table in its own epoch)."""
    last = 0
    for n in range(epochs):
        if n != 1:  # the second one is empty: its barriers still go to every partition downstream
            table.upsert([{"id": rng.randrange(rows * 2), "v1": rng.randrange(-5, 5),
                           "deleted": rng.random() < 0.3} for _ in range(rows)])
            table.delete([rng.randrange(rows * 2) for _ in range(rows // 10)])
        if t2 is not None and n == 0:
            table.upsert([{"id": 1000, "v1": LONE, "deleted": False}])
        if t2 is not None and n == 2:
            table.delete([1000])
        last = table.flush()
        if t2 is not None:
            t2.upsert([{"id": rng.randrange(20), "k": rng.randrange(-5, 5), "w": rng.randrange(100)}
                       for _ in range(4)])
            t2.delete([rng.randrange(20)])
            if n == 0:
                t2.upsert([{"id": 1000, "k": LONE, "w": 1}])
            if n == 2:
                t2.delete([1000])
            t2.flush()
    return last


def _why(process: subprocess.CompletedProcess[str]) -> str:
    """The runner's Python traceback (its stderr also holds the JVM's log)."""
    start = process.stderr.rfind("Traceback (most recent call last)")
    return process.stderr[start:start + 6000] if start >= 0 else process.stderr[-6000:]


def _done(output: str) -> dict[str, tuple[int, int]]:
    """view -> (MCE, partition epochs written) from the runner's ``done`` lines."""
    return {words[1]: (int(words[2]), int(words[3])) for line in output.splitlines()
            if (words := line.split())[:1] == ["done"]}


def _check_wire(settings: Settings, client: redis.Redis, view: str, mce: int) -> dict[int, PartitionLog]:
    """The barriers and the independent consumer's whole epochs; returns the changelog as it read it."""
    assert_barriers_once(settings, client, view, mce)
    partitions = CatalogStore(settings, client).get(view).partitions
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic(view), partitions, idle=1.5)
    indexed = {e.epoch for e in ViewStore(client, settings.topic_prefix).index.between(view, 0, 0, mce)}
    # The chain rule confirms every epoch but the last; the epoch index confirms the last.
    assert check_whole_epochs(logs) | {mce} == indexed
    return logs


def _changes(logs: dict[int, PartitionLog]) -> list[dict[str, Any]]:
    return [change for log in logs.values() for entries in log.changes.values() for _, change in entries]


def _extended(changes: list[dict[str, Any]], image: str, missing: str) -> int:
    """Null-extended rows (``missing``: the other side's key column, NULL) in ``image`` of ``changes``."""
    return sum(change[image] is not None and change[image][missing] is None for change in changes)


def test_filter_and_project_views_in_tasks_on_a_local_cluster_match_the_oracle(
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    settings = _settings(make_settings)
    table = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"],
                         client=redis_client, auto_commit=False)
    t2 = Table.create(settings, "t2", T2, ["id"], client=redis_client, auto_commit=False)
    for name, sql in [*VIEWS, *JOINS]:
        create_view(settings, name, sql, client=redis_client)
    create_view(settings, *RENAMED, client=redis_client, partitions=2)
    store = ViewStore(redis_client, settings.topic_prefix)
    views = [v for v, _ in VIEWS] + [RENAMED[0]] + [v for v, _ in JOINS]
    rng = random.Random(19)
    try:
        last = _epochs(table, rng, 4, 60, t2)
        first = run_views(settings, views)
        assert first.returncode == 0, _why(first)
        done = _done(first.stdout)
        # Every upstream epoch, every partition, written by this run's tasks. The join's epochs are both
        # tables': it plans up to the least latest epoch of the two (both writers run), t1's last, so t2's
        # epoch after it waits for the next run (4 + 3 now, 1 + 3 + 2 then).
        assert all(done[view] == (last, 4 * 3) for view, _ in VIEWS), done
        assert done["mvr"] == (last, 4 * 2), done
        assert done["mvj"] == done["mvjf"] == done["mvja"] == (last, 7 * 3), done
        for join, _ in JOINS:
            assert store.get_state(join, [b"j0[%d]" % LONE, b"j1[%d]" % LONE]) == {}  # both buckets emptied
            assert len(redis_client.hkeys(f"{settings.topic_prefix}:{{{join}}}:opstate")) > 5
        last = _epochs(table, rng, 3, 40, t2)  # a second run starts after the MCE's barriers (and state)
        second = run_views(settings, views)
        assert second.returncode == 0, _why(second)
        done = _done(second.stdout)
        assert done["mvf"] == done["mvg"] == (last, 3 * 3) and done["mvr"] == (last, 3 * 2)
        assert done["mvj"] == done["mvjf"] == done["mvja"] == (last, 6 * 3)
    finally:
        table.close()
        t2.close()
    assert check_oracle(settings, redis_client, ["t1", "t2", *views]) >= 5 * 7 + 3 * (7 + 6)
    changes = {view: _changes(_check_wire(settings, redis_client, view, last)) for view in views}
    deletes = {view: sum(change["op"] == "d" for change in changes[view]) for view in views}
    assert deletes["mvg"] > 0, "no group emptied: the GROUP BY's deletes went untested"
    assert deletes["mvj"] > 0, "no joined pair deleted"
    assert deletes["mvja"] > 0, "no row left the anti join"
    # Each side's null-extended rows asserted (a join key's last match left, or it never had one) and
    # retracted (its first match arrived, or the row left).
    for missing in ("id2", "id"):
        for image in ("after", "before"):
            assert _extended(changes["mvjf"], image, missing) > 0, (missing, image)


def _committed(settings: Settings, view: str, start: dict[int, int]) -> dict[int, list[PartitionBarrier]]:
    """Each partition's barriers after the offsets ``start`` (those after an MCE's barrier)."""
    return {p: partition_barriers(settings, view, p, start[p]) for p in range(3)}


def _after_mce(store: ViewStore, view: str, mce: int) -> dict[int, int]:
    start = store.index.offsets_after(view, 3, mce)
    assert len(start) == 3, start
    return start


def test_driver_killed_after_some_partitions_committed_loses_and_doubles_nothing(
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    settings = _settings(make_settings)
    table = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"],
                         client=redis_client, auto_commit=False)
    t2 = Table.create(settings, "t2", T2, ["id"], client=redis_client, auto_commit=False)
    views = {name: sql for name, sql in [*VIEWS, JOIN] if name in ("mvf", "mvg", "mvj")}
    for name, sql in views.items():
        create_view(settings, name, sql, client=redis_client)
    store = ViewStore(redis_client, settings.topic_prefix)
    rng = random.Random(4)
    try:
        mce = _epochs(table, rng, 2, 50, t2)
        assert run_views(settings, list(views)).returncode == 0
        assert store.mce("mvg") == mce and store.mce("mvj") == mce
        start = {view: _after_mce(store, view, mce) for view in ("mvg", "mvj")}
        last = _epochs(table, rng, 4, 80, t2)
        # mvf's task of partition 0 kills its Python worker after its first epoch, its task of partition 1
        # the executor JVM it runs in: both are retried. mvg's task of partition 0 kills the driver after its
        # second epoch, while the other partitions' tasks hold after their first until the driver is gone
        # (however fast the tasks run, partition 0 is then ahead of them).
        killed = run_views(settings, ["mvf", "mvg"], kills=["mvf:0:worker", "mvf:1:executor", "mvg:0:driver2",
                                                            "mvg:1:hold", "mvg:2:hold"])
        assert killed.returncode == -9, (killed.returncode, killed.stdout, _why(killed))
        # Spark's scheduler saw the executor die of the SIGKILL (128 + 9), not only a task fail.
        assert re.search(r"Lost executor \d+ .*exited with code 137", killed.stderr), _why(killed)
        # Each retried task found its partition's first epoch committed by the attempt that died.
        assert _done(killed.stdout)["mvf"] == (last, 4 * 3 - 2)
        # Kafka ahead of Redis: partition 0 committed an epoch above the MCE, another partition did not.
        assert store.mce("mvg") == mce
        before = {"mvg": _committed(settings, "mvg", start["mvg"])}
        # mvg resumes; then the join's task of view partition 0 (after the second shuffle) kills the driver,
        # the same way.
        resumed = run_views(settings, ["mvg", "mvj"], kills=["mvj:0:driver2", "mvj:1:hold", "mvj:2:hold"])
        assert resumed.returncode == -9, (resumed.returncode, resumed.stdout, _why(resumed))
        written = {"mvg": _done(resumed.stdout)["mvg"]}
        assert written["mvg"][0] == last and store.mce("mvj") == mce
        before["mvj"] = _committed(settings, "mvj", start["mvj"])
        joined = run_views(settings, ["mvj"])
        assert joined.returncode == 0, _why(joined)
        written["mvj"] = _done(joined.stdout)["mvj"]
        assert written["mvj"][0] == last
    finally:
        table.close()
        t2.close()
    # What committed before the kill stayed, at the same offsets; the rest was written once. The join's
    # epochs: t2's last of the first round (after t1's last), then 4 of t1 and 3 of t2.
    for view, epochs in (("mvg", 4), ("mvj", 1 + 4 + 3)):
        assert before[view][0], f"{view}: partition 0 committed nothing before the kill"
        assert min(len(b) for b in before[view].values()) < len(before[view][0]), before[view]
        after = _committed(settings, view, start[view])
        for p in range(3):
            assert after[p][:len(before[view][p])] == before[view][p]
        assert written[view][1] == sum(len(after[p]) - len(before[view][p]) for p in range(3))
        assert all(len(after[p]) == epochs for p in range(3)), (view, after)
    check_oracle(settings, redis_client, ["t1", "t2", *views])
    for view in views:
        _check_wire(settings, redis_client, view, last)
