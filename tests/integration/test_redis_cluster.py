"""mvlog on a real Redis Cluster (three masters, ``MVLOG_REDIS_CLUSTER``): issue 19, item 3, first part.

A table, a filter view and a GROUP BY view (and a view on the GROUP BY) run with every Redis store on the
``redis_cluster`` fixture: table writer, view consumers (the driver path, and the GROUP BY with its operator
in Spark's tasks, which stage and commit per partition), the oracle at every committed epoch, the catalog
and its rebuild from the topic, lag measured and recorded, the log-cache registry, ``read --views`` and the
status. Any multi-key command, transaction or script whose keys span two slots would fail here with
CROSSSLOT. The placement is checked on the servers themselves: every key of one view is in one slot
(``CLUSTER KEYSLOT``), and the keys of the two views sit on different masters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import MovedError

from mvlog.config import Settings
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.lag_store import LagStore
from mvlog.connectors.redis.pipeline_status import read_statuses
from mvlog.connectors.redis.redis_client import connect, is_cluster, outage_of, server_address
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.infra.redis_cluster import LocalRedisCluster
from mvlog.lag_status import LagStatus, Verdict
from mvlog.schemas.codec import decode_row
from mvlog.services import control_plane
from mvlog.services.commands.read import read_views_at_common_epoch
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

from ..oracle import check_oracle

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COLUMNS = {"id": "int", "v": "int", "deleted": "boolean", "k": "string"}
FILTER_SQL = "SELECT * FROM t1 WHERE deleted = false"
GROUP_SQL = "SELECT k, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM t1 GROUP BY k"
ON_GROUP_SQL = "SELECT k, n * 2 AS n2 FROM {group} WHERE n > 1"

#: Epochs of writes to t1: upserts (same keys again: updates), deletes, an empty epoch, groups emptied.
WORKLOAD: list[list[tuple[str, Any]]] = [
    [("upsert", {"id": i, "v": i % 7 - 3, "deleted": i % 4 == 0, "k": "abcde"[i % 5]}) for i in range(40)],
    [("delete", 3), ("delete", 8), ("upsert", {"id": 1, "v": 9, "deleted": False, "k": "a"}),
     ("upsert", {"id": 2, "v": -9, "deleted": True, "k": "b"})],
    [],
    [("delete", i) for i in range(40) if i % 5 == 4] + [("upsert", {"id": 50, "v": 0, "deleted": False, "k": "z"})],
]


def master_of(client: redis.Redis, key: str) -> str:
    """``host:port`` of the master serving ``key``'s slot, by the cluster client's slot map (CLUSTER SLOTS);
    where the keys really are is asked of each server alone (:func:`keys_by_master`)."""
    node_of: Callable[[str], Any] = cast(RedisCluster, client).get_node_from_key
    return str(node_of(key).name)


def names_on_two_masters(client: redis.Redis, prefix: str) -> tuple[str, str]:
    """A filter view's and a GROUP BY view's names whose hash tags sit on different masters (CLUSTER SLOTS):
    with three masters, two names picked blindly would share one a third of the time."""
    group = "mvg"
    for candidate in (f"mvf{i}" for i in range(50)):
        if master_of(client, view_key(prefix, candidate, "meta")) != master_of(client, view_key(prefix, group, "meta")):
            return candidate, group
    raise AssertionError("no name found on another master than mvg's")


def keys_by_master(cluster: LocalRedisCluster, pattern: str) -> dict[int, list[bytes]]:
    """Keys matching ``pattern`` on each master, asked of each server alone (not through the cluster client)."""
    found: dict[int, list[bytes]] = {}
    for port in cluster.ports:
        server = redis.Redis(host=cluster.host, port=port)
        try:
            found[port] = sorted(server.scan_iter(match=pattern, count=1000))
        finally:
            server.close()
    return found


def _write(table: Table, ops: list[tuple[str, Any]]) -> None:
    for op, arg in ops:
        if op == "upsert":
            table.upsert([arg])
        else:
            table.delete([arg])


def run_views(settings: Settings, client: redis.Redis, spark: Any, views: list[tuple[str, str]],
              in_tasks: Callable[[str], bool], online: tuple[str, str] | None) -> None:
    """t1's epochs through ``views`` (created first) and ``online`` if any (created after t1's first epoch,
    so it backfills in chunks: positions, journal and ordered reads of t1's rows, on t1's master)."""
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=client, auto_commit=False)
    for name, sql in views:
        create_view(settings, name, sql, client=client)

    def consumer(name: str) -> ViewConsumer:
        overrides = {"operators_in_tasks": in_tasks(name), "tasks_min_records": 0}
        return ViewConsumer(settings.model_copy(update=overrides), name, spark=spark, client=client)

    consumers = [consumer(name) for name, _ in views]
    try:
        for i, ops in enumerate(WORKLOAD):
            _write(table, ops)
            table.flush()
            if i == 0 and online is not None:
                create_view(settings, *online, client=client, backfill="chunked")
                consumers.append(consumer(online[0]))
            if i % 2 == 1:  # some epochs are caught up one by one, others several at once
                for each in consumers:
                    each.catch_up()
        for each in consumers:
            each.catch_up()
    finally:
        table.close()
        for each in consumers:
            each.committer.writer.close()


def served_state(store: ViewStore, names: list[str]) -> dict[str, Any]:
    """Each object's MCE, rows and operator state in Redis (what a rebuild must bring back)."""
    return {name: (store.mce(name), dict(store.scan_rows(name)),
                   store.redis.hgetall(store.key(name, "opstate"))) for name in names}


@pytest.mark.parametrize("group_in_tasks", [False, True], ids=["driver", "group-in-tasks"])
def test_table_and_views_on_a_redis_cluster(cluster_settings: Settings, cluster_client: redis.Redis,
                                            redis_cluster: LocalRedisCluster, spark: Any,
                                            group_in_tasks: bool) -> None:
    settings, client, prefix = cluster_settings, cluster_client, cluster_settings.topic_prefix
    assert is_cluster(client)
    filtered, group = names_on_two_masters(client, prefix)
    views = [(filtered, FILTER_SQL), (group, GROUP_SQL), ("mvo", ON_GROUP_SQL.format(group=group))]
    # The paths that do not depend on where the GROUP BY runs (a chunked backfill, the control plane, a
    # rebuild) run once, beside the driver path: the in-tasks run stays short.
    online = None if group_in_tasks else ("mvb", "SELECT id, v FROM t1 WHERE v > 0")
    run_views(settings, client, spark, views, lambda name: group_in_tasks and name == group, online)
    views += [online] if online else []

    names = ["t1", *(name for name, _ in views)]
    # I1 at every committed epoch of every view, Redis' rows against the changelog at the MCE.
    assert check_oracle(settings, client, names) >= len(views) * len(WORKLOAD) - 1  # mvb: from epoch 2
    store = ViewStore(client, prefix)
    assert store.row_count(group) == 5  # a..d and z: group e emptied by the last epoch's deletes

    # Each object's keys share one slot (the server's CLUSTER KEYSLOT), and the two views' sit on two masters.
    by_master = {name: keys_by_master(redis_cluster, f"{prefix}:{{{name}}}:*") for name in names}
    for name in names:
        holding = {port: keys for port, keys in by_master[name].items() if keys}
        assert len(holding) == 1, f"{name}'s keys are spread over masters {sorted(holding)}"
        keys = next(iter(holding.values()))
        assert {"meta", "rows", "keyorder", "index:0"} <= {k.decode().split("}:", 1)[1] for k in keys}
        slots = {int(client.execute_command("CLUSTER KEYSLOT", k)) for k in keys}  # type: ignore[no-untyped-call]
        assert slots == {key_slot(f"{{{name}}}".encode())}, f"{name}: its keys are in slots {sorted(slots)}"
    masters = {name: next(p for p, keys in by_master[name].items() if keys) for name in (filtered, group)}
    assert masters[filtered] != masters[group]
    if online is None:
        return
    assert store.backfill_state("mvb")  # its chunked backfill ran (positions kept with its epochs)

    # The catalog and its marker (one transaction, one slot); reloaded from its topic after losing it.
    catalog = CatalogStore(settings, client)
    assert not catalog.wiped()
    assert catalog.names() == sorted(names)
    client.delete(catalog.key)
    assert catalog.rebuild_from_topic() == len(names)
    assert catalog.get(group).sql == GROUP_SQL
    catalog.close()

    # Lag: measured from MCEs and the index of every view (pipelined over masters), recorded, read back.
    lag = LagStore(client, prefix)
    entries = catalog.all()
    samples = lag.measure(entries, now_ms=1)
    assert {s.view for s in samples} == {name for name, _ in views}
    assert all(s.epochs == 0 for s in samples), samples  # every view caught up
    lag.record([(s, Verdict(LagStatus.OK, "")) for s in samples])
    assert set(lag.current_views()) == {name for name, _ in views}
    assert [len(h) for h in lag.histories([filtered, group], 10).values()] == [1, 1]
    assert lag.hold_lease("me", 10_000) and not lag.hold_lease("other", 10_000)
    lag.forget([filtered])
    assert lag.history(filtered, 10) == []

    # The log-cache registry: worker keys on any master, found by a scan of every master.
    registry = CacheRegistry(client, prefix)
    for i in range(4):
        registry.heartbeat(f"w{i}", f"http://w{i}", 100 + i, {"t1": [i % 3]}, ttl_ms=60_000)
    assert sorted(w.worker_id for w in registry.workers()) == ["w0", "w1", "w2", "w3"]
    assert registry.worker_for("t1", 2) == "http://w2"
    cache_reads, kafka_reads = registry.reads("t1")  # the consumers' reads so far (no worker ran: Kafka)
    assert kafka_reads > 0
    registry.count_reads("t1", 3, 1)
    assert registry.reads("t1") == (cache_reads + 3, kafka_reads + 1)

    # Status of everything (one pipeline over masters), and read --views (each view's rows with its MCE).
    statuses = {s.name: s for s in read_statuses(client, prefix, entries, {})}
    assert statuses[group].rows == 5 and statuses[group].mce == store.mce(group)
    epoch, rows = read_views_at_common_epoch(settings, store, [catalog.get(filtered), catalog.get(group)])
    assert epoch == store.mce(filtered) == store.mce(group)  # both caught up with t1's last epoch
    served = [decode_row(value) for _, value in store.scan_rows(group)]
    assert sorted(rows[group], key=lambda r: r["k"]) == sorted(served, key=lambda r: r["k"])
    assert sorted(r["id"] for r in rows[filtered]) == sorted(
        r["id"] for _, value in store.scan_rows("t1") if not (r := decode_row(value))["deleted"])

    # Redis loses everything of this prefix (the cluster is the session's: a FLUSHALL would take the other
    # tests' keys too): the control plane is rebuilt from Kafka, on the cluster, as after a wipe.
    # Each object's last epoch is proven committed by its index entries, as its live writer would pass them
    # (without a proof, an object's last epoch waits for a view built on it or for its writer).
    before = served_state(store, names)
    proofs = {e.name: store.index.entries_at(e.name, e.partitions, before[e.name][0]) for e in entries}
    assert all(proofs.values())
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    client.delete(*keys)  # the cluster client deletes slot by slot
    assert catalog.wiped()
    assert control_plane.ensure_control_plane(settings, client, proofs)
    assert not catalog.wiped()
    assert served_state(store, names) == before
    check_oracle(settings, client, names)


def test_connect_without_the_setting_refuses_a_cluster_keyspace(cluster_settings: Settings,
                                                                redis_cluster: LocalRedisCluster) -> None:
    """The setting is what makes a cluster work: a standalone client on a master is sent MOVED for the
    keys of the other masters' slots (redis-py raises it), so a deployment that forgot it fails at once."""
    client = connect(cluster_settings.model_copy(update={"redis_cluster": False}), outage_timeout_s=0)
    try:
        assert not is_cluster(client)
        with pytest.raises(MovedError):
            for i in range(20):  # some of these slots are another master's
                client.get(f"{cluster_settings.topic_prefix}:{{probe{i}}}:meta")
    finally:
        client.close()


def test_a_command_waits_through_a_masters_restart(cluster_settings: Settings,
                                                   redis_cluster: LocalRedisCluster) -> None:
    """The cluster client keeps the standalone client's outage policy: a command on the slots of a master
    that is down waits (backoff, bounded by ``redis_outage_timeout_s``) and succeeds once it is back; with a
    bound of 0 it fails at once."""
    client = connect(cluster_settings, outage_timeout_s=60)
    probe = connect(cluster_settings, outage_timeout_s=0)
    down = redis_cluster.ports[1]  # not the URL's master, from which the clients learn the slot map
    key = next(k for i in range(100) if master_of(client, k := f"{cluster_settings.topic_prefix}:{{o{i}}}:x")
               .endswith(f":{down}"))
    outage = outage_of(server_address(cluster_settings.redis_url))
    done: list[object] = []
    writer = threading.Thread(target=lambda: done.append(client.set(key, "after")), daemon=True)
    try:
        redis_cluster.stop_master(1)
        with pytest.raises(redis.ConnectionError):
            probe.set(key, "now")
        writer.start()
        deadline = time.monotonic() + 30
        while outage.since is None:  # the command failed once and waits
            assert time.monotonic() < deadline and writer.is_alive(), "the command did not wait for the master"
            time.sleep(0.05)
        assert not done
        redis_cluster.restart_master(1)
        writer.join(60)
        assert done == [True]
        assert client.get(key) == b"after"
    finally:
        if not redis_cluster.ready():
            redis_cluster.restart_master(1)
        client.delete(key)
        client.close()
        probe.close()


def test_a_standalone_redis_of_the_layout_before_the_tag_keeps_its_catalog(make_settings: Callable[..., Settings],
                                                                        own_redis: str) -> None:
    """The catalog and marker an older mvlog left under ``<prefix>:catalog`` / ``<prefix>:control-plane``
    move to their tagged keys when first looked for: not wiped, the same entries, the old keys gone.
    (A standalone redis-server of the test's own, also under ``--redis-cluster``.)"""
    settings = make_settings(redis_url=own_redis, redis_cluster=False)
    redis_client = redis.Redis.from_url(own_redis)
    prefix = settings.topic_prefix
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    table.close()
    catalog = CatalogStore(settings, redis_client)
    entry = redis_client.hgetall(catalog.key)
    assert entry and redis_client.exists(catalog.marker_key)
    redis_client.rename(catalog.key, f"{prefix}:catalog")  # as an older mvlog wrote them
    redis_client.rename(catalog.marker_key, f"{prefix}:control-plane")
    assert not catalog.wiped()
    assert redis_client.hgetall(catalog.key) == entry and catalog.names() == ["t1"]
    assert not redis_client.exists(f"{prefix}:catalog", f"{prefix}:control-plane")
    redis_client.delete(catalog.marker_key)  # a wipe (the legacy marker gone too) still reads as one
    assert catalog.wiped()
    catalog.close()
    redis_client.close()
