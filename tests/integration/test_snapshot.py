"""Snapshots (issue 5): compaction on Spark, the retention warning, and a view backfilled from a snapshot.

Real Apache Kafka, redis-server and Spark local. The expected rows come from the changelogs summed up to a
barrier and from the DuckDB oracle (tests/oracle.py), never from the code under test.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner, Result

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.checkpoints import latest_checkpoint
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.partition_staging import PartitionStaging
from mvlog.connectors.redis.snapshot_store import SnapshotStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import decode_row, encode_key, encode_row
from mvlog.services.backfill.snapshot import LOADS_FOLDER, SnapshotBackfill
from mvlog.services.backfill.snapshot_tasks import RouteSeed, SeedJob
from mvlog.services.cli import main
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.snapshot_compaction import build_snapshot, snapshot_frame
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view, drop_view, plan_for
from mvlog.vnode import vnode_of

from ..oracle import assert_same_rows, check_oracle, duckdb_view_rows, rows_at, rows_by_epoch
from .busy_table import busy
from .processes.view_runner import spawn as spawn_view_runner

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean"}
KEYS = 1200
VIEWS = ("mv1", "mv2", "mv3")


def _row(rng: random.Random, key: int) -> dict[str, Any]:
    return {"id": key, "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.2}


def _loaded_table(settings: Settings, client: redis.Redis, seed: int) -> Table:
    """t1 (auto-committing) with KEYS random rows committed in one epoch."""
    rng = random.Random(seed)
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=client)
    table.upsert([_row(rng, k) for k in range(KEYS)])
    table.flush()
    return table


def _history(settings: Settings, store: ViewStore, entry: CatalogEntry, upto: int) -> dict[int, dict[Key, Row]]:
    with ChangelogReader(settings, entry.name, entry.key_columns, entry.partitions, store.index,
                         upto_epoch=upto) as reader:
        return rows_by_epoch(list(reader.epochs(idle_timeout=10.0)))


def _parquet_rows(entry: CatalogEntry, path: str) -> dict[Key, Row]:
    """A snapshot folder read without Spark; checks its layout on the way: one ``_vnode=N`` folder per
    vnode holding only that vnode's keys, each file sorted by primary key."""
    rows: dict[Key, Row] = {}
    folders = sorted(p for p in Path(path).iterdir() if p.is_dir())
    assert folders and all(p.name.startswith("_vnode=") for p in folders), folders
    for folder in folders:
        vnode = int(folder.name.split("=")[1])
        for file in sorted(folder.glob("*.parquet")):
            table = pq.read_table(file).to_pylist()
            keys = [entry.schema.key_of({c: r[c] for c in entry.schema.names}) for r in table]
            assert keys == sorted(keys), f"{file} is not sorted by key"
            for record, key in zip(table, keys, strict=True):
                assert record["_key"] == encode_key(entry.key_columns, key)
                assert vnode_of(record["_key"]) == vnode, f"key {key} in the folder of vnode {vnode}"
                assert key not in rows, f"key {key} twice in the snapshot"
                rows[key] = {c: record[c] for c in entry.schema.names}
    return rows


def test_incremental_snapshot_equals_one_from_scratch_and_the_view(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(snapshot_dir=tmp_path / "snapshots")
    rng = random.Random(11)
    store = ViewStore(redis_client, settings.topic_prefix)
    catalog = CatalogStore(settings, redis_client)
    with Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client) as table:
        table.upsert([_row(rng, k) for k in range(400)])
        table.flush()
        create_view(settings, "mv1", "SELECT id, v1 * 2 AS v2, deleted FROM t1 WHERE v1 > -30",
                    client=redis_client)
        consumer = ViewConsumer(settings, "mv1", spark=spark, client=redis_client)
        try:
            e1 = consumer.catch_up(table.flush())
            first = build_snapshot(settings, "mv1", spark, client=redis_client)
            assert first.built and first.record.epoch == e1 and first.record.base_epoch == 0
            # Updates, deletes (of keys in the first snapshot too) and new keys, over several epochs.
            for _ in range(4):
                table.upsert([_row(rng, rng.randrange(600)) for _ in range(80)])
                table.delete([rng.randrange(600) for _ in range(40)])
                table.flush()
            e2 = consumer.catch_up(table.flush())
        finally:
            consumer.stop()
    assert e2 > e1
    second = build_snapshot(settings, "mv1", spark, client=redis_client)
    assert second.built and second.record.epoch == e2 and second.record.base_epoch == e1, second.record
    entry = catalog.get("mv1")
    incremental = _parquet_rows(entry, second.record.path)
    assert len(incremental) == second.record.rows

    # From scratch: the whole changelog netted, no base snapshot.
    scratch_rows = snapshot_frame(spark, settings, entry, None, e2).collect()
    scratch = {entry.schema.key_of(r.asDict()): {c: r[c] for c in entry.schema.names} for r in scratch_rows}
    assert_same_rows("mv1", incremental, scratch, entry.schema, "incremental vs from scratch")
    # The view's rows at E2: its changelog summed up to E2, Redis' serving rows, and the DuckDB oracle.
    history = _history(settings, store, entry, e2)
    assert_same_rows("mv1", incremental, history[e2], entry.schema, "snapshot vs changelog at E2")
    served = {entry.schema.key_of(decode_row(v)): decode_row(v) for _, v in store.scan_rows("mv1")}
    assert_same_rows("mv1", incremental, served, entry.schema, "snapshot vs Redis at E2")
    upstream = catalog.get("t1")
    oracle = duckdb_view_rows(plan_for(catalog, "mv1", entry.sql or ""),
                              {"t1": (upstream.schema, list(rows_at(_history(settings, store, upstream, e2),
                                                                     e2).values()))})
    assert_same_rows("mv1", incremental, oracle, entry.schema, "snapshot vs oracle at E2")
    # The first snapshot still holds the view at E1 (deleted keys included).
    assert_same_rows("mv1", _parquet_rows(entry, first.record.path), history[e1], entry.schema, "at E1")

    # Retention of snapshots: keep 2 -> the oldest is forgotten, then its folder deleted.
    with Table.open(settings, "t1", client=redis_client) as table:
        table.upsert([_row(rng, 5000)])
        table.flush()
    third = build_snapshot(settings, "t1", spark, client=redis_client, keep=1)
    assert third.built and third.record.rows == len(rows_at(_history(settings, store, upstream, third.record.epoch),
                                                            third.record.epoch))
    fourth = build_snapshot(settings, "mv1", spark, client=redis_client, keep=1, epoch=e2, from_scratch=True)
    assert fourth.record.epoch == e2 and fourth.record.base_epoch == 0
    assert [r.epoch for r in fourth.dropped] == [e1]
    assert [r.epoch for r in SnapshotStore(redis_client, settings.topic_prefix).all("mv1")] == [e2]
    assert not Path(first.record.path).exists() and Path(fourth.record.path).exists()
    assert_same_rows("mv1", _parquet_rows(entry, fourth.record.path), incremental, entry.schema, "rebuilt")
    drop_view(settings, "mv1", client=redis_client)  # a dropped view's snapshots go with it
    assert not Path(fourth.record.path).exists() and not SnapshotStore(redis_client, settings.topic_prefix).all("mv1")


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    return {"MVLOG_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "MVLOG_REDIS_URL": settings.redis_url,
            "MVLOG_REDIS_CLUSTER": str(settings.redis_cluster).lower(),
            "MVLOG_TOPIC_PREFIX": settings.topic_prefix, "MVLOG_PARTITIONS": str(settings.partitions),
            "MVLOG_BARRIER_INTERVAL_MS": str(settings.barrier_interval_ms),
            "MVLOG_STACK_DIR": str(settings.stack_dir), "MVLOG_SNAPSHOT_DIR": str(settings.snapshot_root), **extra}


def _mvlog(settings: Settings, *args: str, **env: str) -> Result:
    result = CliRunner().invoke(main, list(args), env=_env(settings, **env), catch_exceptions=False)
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def _poll(condition: Callable[[], bool], timeout: float, what: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_view_backfilled_from_a_snapshot_of_a_busy_table_is_exact_at_every_epoch(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    # Batches of 97 rows: the views' first epochs are written in many batches (the driver holds one).
    settings = make_settings(snapshot_dir=tmp_path / "snapshots", barrier_interval_ms=500,
                             snapshot_load_batch_rows=97)
    store = ViewStore(redis_client, settings.topic_prefix)
    catalog = CatalogStore(settings, redis_client)
    table = _loaded_table(settings, redis_client, seed=5)
    # --backfill auto (d): no snapshot yet -> chunked.
    assert "Backfill: chunked (t1 has no snapshot)" in _mvlog(
        settings, "create-view", "auto1", "--backfill", "auto", "AS", "SELECT * FROM t1").stdout
    consumers: list[ViewConsumer] = []
    try:
        with busy(table, seed=7, keys=KEYS, per_tick=20):
            snapshot = build_snapshot(settings, "t1", spark, client=redis_client)
            epoch = snapshot.record.epoch
            assert snapshot.built and snapshot.record.rows > 500
            # The table moves on: the views have epochs after the snapshot to replay.
            _poll(lambda: store.index.count_after("t1", epoch) >= 3, 30, lambda: store.mce("t1"))
            # auto (d): a snapshot and more rows than the threshold -> snapshot; a higher threshold -> chunked.
            chosen = _mvlog(settings, "create-view", "auto2", "--backfill", "auto", "AS", "SELECT * FROM t1",
                            MVLOG_SNAPSHOT_BACKFILL_MIN_ROWS="500").stdout
            assert f"Backfill: snapshot (t1 has a snapshot at epoch {epoch} and " in chosen, chosen
            assert "Backfill: chunked (t1 has " in _mvlog(
                settings, "create-view", "auto3", "--backfill", "auto", "AS", "SELECT * FROM t1",
                MVLOG_SNAPSHOT_BACKFILL_MIN_ROWS=str(10**6)).stdout
            assert [catalog.get(v).options["backfill"] for v in ("auto1", "auto2", "auto3")] == \
                ["chunked", "snapshot", "chunked"]
            # (b) views from the snapshot while the table keeps writing: a filter/project view, a GROUP BY
            # with every aggregate (its state is seeded by Spark SQL: later updates and deletes of a group's
            # minimum or maximum need the multisets), and a global min/max over keys the writer deletes.
            create_view(settings, "mv1", "SELECT id, v1 * 2 AS w, deleted FROM t1 WHERE deleted = false",
                        client=redis_client, backfill="snapshot")
            create_view(settings, "mv2", "SELECT v1 > 0 AS pos, deleted, count(*) AS c, count(v1) AS n, "
                        "sum(v1) AS s, min(v1) AS lo, max(v1) AS hi, avg(v1) AS mean FROM t1 WHERE v1 > -45 "
                        "GROUP BY v1 > 0, deleted", client=redis_client, backfill="snapshot")
            create_view(settings, "mv3", "SELECT count(*) AS n, min(id) AS lo, max(id) AS hi FROM t1 "
                        "WHERE deleted = false", client=redis_client, backfill="snapshot")
            # What a load interrupted before its Kafka commit leaves (staged rows, the computed view's
            # folder) is cleared by the next one: the oracle below would see a leftover row.
            leftover = {"id": 10**6, "w": 2, "deleted": False}
            store.stage_load("mv1", {encode_key(("id",), (10**6,)): encode_row(leftover)}, {}, [b"\x00leftover"])
            stale = settings.snapshot_root / settings.topic_prefix / LOADS_FOLDER / "mv1-0123456789ab"
            (stale / "part").mkdir(parents=True)
            consumers = [ViewConsumer(settings, v, spark=spark, client=redis_client, max_epochs_per_trigger=20,
                                      trigger_interval="100 milliseconds") for v in VIEWS]
            for consumer in consumers:
                consumer.start()
            for consumer in consumers:  # loaded at E, then live on the upstream's later epochs
                consumer.wait_for_epoch(epoch + 1, timeout=60)
            live_at = store.mce("t1") or 0
            for consumer in consumers:
                consumer.wait_for_epoch(live_at, timeout=60)
        last = table.flush()
        table.close()  # no epoch after ``last``: the views can reach the table's MCE
        for consumer in consumers:
            consumer.wait_for_epoch(last, timeout=60)
    finally:
        for consumer in consumers:
            consumer.stop()
        table.close()
    for view in VIEWS:
        assert store.lifecycle(view) == Lifecycle.LIVE
        progress = store.backfill_progress(view)
        assert progress["method"] == "snapshot" and progress["snapshot_epoch"] == str(epoch)
        assert progress["rows_done"] == progress["rows_total"] == str(snapshot.record.rows)
        with ChangelogReader(settings, view, catalog.get(view).key_columns, catalog.get(view).partitions,
                             store.index, upto_epoch=store.mce(view)) as reader:
            epochs = [e.epoch for e in reader.epochs(idle_timeout=10.0)]
        assert epochs[0] == epoch and epochs[-1] >= last, (view, epochs[:3], epoch)
        at_e = _history(settings, store, catalog.get(view), epoch)[epoch]
        assert int(progress["view_rows"]) == len(at_e) > 0, (view, progress)
        assert not any(redis_client.exists(store.key(view, w)) for w in ("rows.load", "opstate.load",
                                                                            "keyorder.load"))
    assert not list((settings.snapshot_root / settings.topic_prefix / LOADS_FOLDER).iterdir())
    # I1 at every committed epoch of every view, from E on (the oracle recomputes each in DuckDB).
    checked = check_oracle(settings, redis_client, ["t1", *VIEWS])
    assert checked >= len(VIEWS) * 5, checked


def test_retention_shorter_than_the_snapshot_interval_is_warned_about(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(snapshot_dir=tmp_path / "snapshots")
    for name, retention_ms in (("t2", 60_000), ("t3", 2 * 3_600_000)):
        ensure_topic(settings, settings.changelog_topic(name), settings.partitions, {"retention.ms": str(retention_ms)})
        with Table.create(settings, name, COLUMNS, ["id"], client=redis_client) as table:
            table.upsert([{"id": i, "v1": i, "deleted": False} for i in range(50)])
            table.flush()
    short = _mvlog(settings, "snapshot", "t2")  # the default interval is 1 h
    topic = settings.changelog_topic("t2")
    assert f"Warning: Kafka retention of {topic} (1 min) is shorter than the snapshot interval (1 h)" in short.stderr
    assert "Wrote snapshot of t2 at epoch" in short.stdout and "50 rows" in short.stdout
    long = _mvlog(settings, "snapshot", "t3")
    assert "Warning" not in long.stderr and "Wrote snapshot of t3" in long.stdout
    # The same topic with snapshots every 30 s: retention covers it.
    again = _mvlog(settings, "snapshot", "t2", "--from-scratch", MVLOG_SNAPSHOT_INTERVAL_MS="30000")
    assert "Warning" not in again.stderr and "Wrote snapshot of t2" in again.stdout
    listed = json.loads(_mvlog(settings, "snapshot", "t2", "--list", "--output", "json").stdout)
    assert [r["rows"] for r in listed] == [50]
    # Redis loses the records (a wipe): the next look-up registers them again from the snapshot folder.
    snapshots = SnapshotStore.of(settings, redis_client)
    redis_client.delete(snapshots.key("t2"))
    assert not redis_client.exists(snapshots.key("t2"))
    assert json.loads(_mvlog(settings, "snapshot", "t2", "--list", "--output", "json").stdout) == listed
    assert redis_client.hlen(snapshots.key("t2")) == 1


def test_snapshot_is_taken_at_the_newest_checkpoint_epoch(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(snapshot_dir=tmp_path / "snapshots", checkpoint_frequency=3)
    store = ViewStore(redis_client, settings.topic_prefix)
    with Table.create(settings, "t4", COLUMNS, ["id"], client=redis_client) as table:
        for i in range(5):
            table.upsert([{"id": i, "v1": i, "deleted": False}])
            table.flush()
    entry = CatalogStore(settings, redis_client).get("t4")
    mce = store.mce("t4")
    with ChangelogReader(settings, "t4", entry.key_columns, entry.partitions, store.index, upto_epoch=mce) as reader:
        epochs = list(reader.epochs(idle_timeout=10.0))
    checkpoints = [e.epoch for e in epochs if e.checkpoint]
    assert checkpoints and len(checkpoints) < len(epochs), "some epochs are not checkpoints"
    for epoch in (e.epoch for e in epochs):  # from every epoch, checkpoint or not, back to the newest checkpoint
        expected_checkpoint = max((c for c in checkpoints if c <= epoch), default=None)
        assert latest_checkpoint(settings, store.index, "t4", epoch) == expected_checkpoint, epoch
    result = build_snapshot(settings, "t4", spark, client=redis_client)
    assert result.record.epoch == checkpoints[-1]
    expected = rows_by_epoch(epochs)[checkpoints[-1]]
    assert_same_rows("t4", _parquet_rows(entry, result.record.path), expected, entry.schema, "at the checkpoint")


def test_a_join_is_refused_a_snapshot_backfill_with_the_reason(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, tmp_path: Path) -> None:
    """A join's state holds both sides at one epoch, which one upstream's snapshot cannot seed: refused
    at create time (nothing created), and ``auto`` picks chunked, saying why."""
    settings = make_settings(snapshot_dir=tmp_path / "snapshots")
    for name in ("t5", "t6"):
        with Table.create(settings, name, COLUMNS, ["id"], client=redis_client) as table:
            table.upsert([{"id": i, "v1": i % 7, "deleted": False} for i in range(20)])
            table.flush()
    catalog = CatalogStore(settings, redis_client)
    joins = ("SELECT a.id, b.v1 FROM t5 a JOIN t6 b ON a.v1 = b.id",
             "SELECT a.id, b.deleted FROM t5 a JOIN t5 b ON a.v1 = b.id")  # a self-join reads one upstream
    for sql in joins:
        refused = CliRunner().invoke(main, ["create-view", "j1", "--backfill", "snapshot", "AS", sql],
                                     env=_env(settings))
        assert refused.exit_code != 0, refused.output
        assert "cannot backfill a join" in refused.output and "use chunked" in refused.output, refused.output
        assert catalog.find("j1") is None
    for number, sql in enumerate(joins):
        chosen = _mvlog(settings, "create-view", f"j{number + 2}", "--backfill", "auto", "AS", sql).stdout
        assert "Backfill: chunked (a join: snapshot backfill seeds a view from one upstream's snapshot)" in chosen


@pytest.mark.slow
def test_a_snapshot_backfill_killed_while_it_writes_the_view_is_redone_exactly(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    """SIGKILL of the consumer process while it streams the view at E (its Kafka transaction open, rows
    staged in Redis): the next consumer redoes the load (the killed transaction is fenced and aborted,
    the staged keys cleared) and the view is exact at every epoch, its history starting at E once.
    With ``--operators-in-tasks`` the load is the tasks' (a transaction and staged rows per partition):
    the kill comes once a partition staged rows of E."""
    settings = make_settings(snapshot_dir=tmp_path / "snapshots", barrier_interval_ms=500,
                             snapshot_load_batch_rows=5)  # ~200 batches: a window to kill in
    store = ViewStore(redis_client, settings.topic_prefix)
    catalog = CatalogStore(settings, redis_client)
    table = _loaded_table(settings, redis_client, seed=9)
    consumers: list[ViewConsumer] = []
    try:
        with busy(table, seed=3, keys=KEYS, per_tick=10):
            epoch = build_snapshot(settings, "t1", spark, client=redis_client).record.epoch
            create_view(settings, "mv1", "SELECT deleted, count(*) AS c, sum(v1) AS s, min(v1) AS lo, "
                        "max(v1) AS hi FROM t1 GROUP BY deleted", client=redis_client, backfill="snapshot")
            create_view(settings, "mv2", "SELECT id, v1 FROM t1 WHERE deleted = false", client=redis_client,
                        backfill="snapshot")
            staged = [store.key("mv2", "rows.load")]  # the driver's load stages here, the tasks' per partition
            if settings.operators_in_tasks:
                staged = [key for p in range(settings.partitions)
                          for key in PartitionStaging(redis_client, settings.topic_prefix).staged_keys("mv2", epoch, p)
                          if key.endswith(":rows")]
            child = spawn_view_runner(settings, ["mv2"])
            try:
                _poll(lambda: any(redis_client.exists(key) for key in staged), 120,
                      lambda: store.backfill_progress("mv2"))
                child.send_signal(signal.SIGKILL)
                child.wait(30)
            finally:
                if child.poll() is None:
                    child.kill()
            assert store.mce("mv2") is None, "killed after the load committed: the window was missed"
            consumers = [ViewConsumer(settings, v, spark=spark, client=redis_client, max_epochs_per_trigger=20,
                                      trigger_interval="100 milliseconds") for v in ("mv2", "mv1")]
            for consumer in consumers:
                consumer.start()
            live_at = store.mce("t1") or 0
            for consumer in consumers:
                consumer.wait_for_epoch(live_at, timeout=120)
        last = table.flush()
        table.close()
        for consumer in consumers:
            consumer.wait_for_epoch(last, timeout=60)
    finally:
        for consumer in consumers:
            consumer.stop()
        table.close()
    entry = catalog.get("mv2")
    with ChangelogReader(settings, "mv2", entry.key_columns, entry.partitions, store.index,
                         upto_epoch=store.mce("mv2")) as reader:
        epochs = [e.epoch for e in reader.epochs(idle_timeout=10.0)]
    assert epochs[0] == epoch and epochs.count(epoch) == 1, epochs[:3]
    assert not any(redis_client.exists(key) for key in staged), "staged rows left behind"
    checked = check_oracle(settings, redis_client, ["t1", "mv1", "mv2"])
    assert checked >= 2 * 3, checked


def test_a_snapshot_load_in_tasks_is_exact_and_resumes_partitions_an_earlier_attempt_committed(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, spark: Any, tmp_path: Path) -> None:
    """With the views' operators in Spark's tasks, a snapshot's epoch E is loaded by a task per partition
    (its own transaction, its rows and state staged batch by batch), the driver committing E in Redis.
    An earlier attempt whose task of partition 0 committed E to Kafka before the others and the driver
    died is resumed by the next load: partition 0 is staged again, not rewritten, so no partition holds
    E twice. The views are exact at every epoch from E on (oracle)."""
    settings = make_settings(snapshot_dir=tmp_path / "snapshots", barrier_interval_ms=500,
                             snapshot_load_batch_rows=97, operators_in_tasks=True)
    store = ViewStore(redis_client, settings.topic_prefix)
    catalog = CatalogStore(settings, redis_client)
    rng = random.Random(13)
    table = _loaded_table(settings, redis_client, seed=11)
    table.upsert([_row(rng, rng.randrange(KEYS)) for _ in range(300)])
    table.delete([rng.randrange(KEYS) for _ in range(100)])
    table.flush()
    epoch = build_snapshot(settings, "t1", spark, client=redis_client).record.epoch
    table.upsert([_row(rng, rng.randrange(KEYS)) for _ in range(200)])
    table.flush()
    create_view(settings, "mv1", "SELECT id, v1 * 2 AS w, deleted FROM t1 WHERE deleted = false",
                client=redis_client, backfill="snapshot")
    create_view(settings, "mv2", "SELECT deleted, count(*) AS c, sum(v1) AS s, min(v1) AS lo, max(v1) AS hi "
                "FROM t1 GROUP BY deleted", client=redis_client, backfill="snapshot")
    # mv2's earlier attempt: the task of partition 0 committed E; the others and the driver died.
    entry, upstream = catalog.get("mv2"), catalog.get("t1")
    earlier = SnapshotBackfill(settings, store, SnapshotStore.of(settings, redis_client), entry, upstream,
                               plan_for(catalog, "mv2", entry.sql or ""))
    with earlier.seed_frame(spark) as seed:
        rows = seed.toArrow()
    mine = rows.filter(pc.equal(RouteSeed(earlier.plan, entry.partitions).partitions_of(rows), 0))
    assert mine.num_rows > 0
    done = SeedJob(settings.to_executor_json(), entry, earlier.plan, epoch, {}).load(0, mine)
    assert done["written"] and done["records"] == mine.num_rows
    assert store.mce("mv2") is None
    consumers = [ViewConsumer(settings, v, spark=spark, client=redis_client) for v in ("mv1", "mv2")]
    try:
        assert all(consumer.tasks is not None for consumer in consumers), "both views run in tasks"
        assert all(consumer.backfills.snapshot is not None for consumer in consumers), "E is loaded, not rolled"
        for consumer in consumers:
            consumer.catch_up()
        table.upsert([_row(rng, rng.randrange(KEYS)) for _ in range(200)])
        table.delete([rng.randrange(KEYS) for _ in range(50)])
        last = table.flush()
        for consumer in consumers:
            assert consumer.catch_up() >= last  # t1 commits an epoch every interval
    finally:
        for consumer in consumers:
            consumer.stop()
        table.close()
    for view in ("mv1", "mv2"):
        assert store.lifecycle(view) == Lifecycle.LIVE
        for partition in range(catalog.get(view).partitions):
            barriers = partition_barriers(settings, view, partition, 0)
            assert [b.epoch for b in barriers][:1] == [epoch] and [b.epoch for b in barriers].count(epoch) == 1, \
                (view, partition, barriers[:3])
        assert int(store.backfill_progress(view)["view_rows"]) == len(
            _history(settings, store, catalog.get(view), epoch)[epoch]) > 0
    checked = check_oracle(settings, redis_client, ["t1", "mv1", "mv2"])
    assert checked >= 2 * 3, checked
