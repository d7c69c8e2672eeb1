"""Snapshots (issue 5): compaction on Spark, the retention warning, and a view backfilled from a snapshot.

Real Tansu, redis-server and Spark local. The expected rows come from the changelogs summed up to a
barrier and from the DuckDB oracle (tests/oracle.py), never from the code under test.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.catalog_store import CatalogStore
from mvlog.connectors.changelog_reader import ChangelogReader
from mvlog.connectors.snapshot_store import SnapshotStore
from mvlog.connectors.view_store import ViewStore
from mvlog.row_schema import Key, Row
from mvlog.schemas.codec import decode_row, encode_key
from mvlog.services.snapshot_compaction import build_snapshot, snapshot_frame
from mvlog.services.table_writer import Table
from mvlog.services.view_consumer import ViewConsumer
from mvlog.services.view_ddl import create_view, plan_for
from mvlog.vnode import vnode_of

from ..oracle import assert_same_rows, duckdb_view_rows, rows_at, rows_by_epoch

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean"}
KEYS = 1200


def _row(rng: random.Random, key: int) -> dict[str, Any]:
    return {"id": key, "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.2}


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
