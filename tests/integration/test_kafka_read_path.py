"""The data source's Kafka read path on the real broker: the compiled fast path gives the rows of the
Python path, cut into batches of the size asked for."""

from __future__ import annotations

import pyarrow as pa
import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.spark import change_rows, spark_source
from mvlog.connectors.spark.log_cache_client import sub_range
from mvlog.connectors.spark.spark_source import (
    PartitionGroup,
    PartitionRange,
    _Planner,
    read_partition_from_kafka,
    read_partition_group,
    read_partitions_from_kafka,
)
from mvlog.services.tables.writer import Table

pytestmark = pytest.mark.integration

COLUMNS = {"id": "int", "v1": "int", "name": "string", "deleted": "boolean"}


def load(settings: Settings, client: redis.Redis) -> list[PartitionRange]:
    """Four epochs of t1 (inserts, updates, deletes), planned as the data source plans them."""
    with Table.create(settings, "t1", COLUMNS, ["id"], client=client, auto_commit=False) as table:
        for epoch in range(4):
            table.upsert([{"id": i, "v1": i * epoch, "name": f"n{i}", "deleted": i % 3 == 0} for i in range(300)])
            if epoch:
                table.delete(range(epoch * 50, epoch * 50 + 20))
            table.flush()
    planner = _Planner(settings, CatalogStore(settings, client).get("t1"))
    return planner.plan(0, planner.latest_epoch())


def read_all(parts: list[PartitionRange]) -> pa.Table:
    return pa.Table.from_batches([b for part in parts for b in read_partition_from_kafka(part, batch_rows=100)])


def test_the_compiled_path_reads_what_the_python_path_reads(settings: Settings, redis_client: redis.Redis,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    parts = load(settings, redis_client)
    fast = read_all(parts)
    assert fast.num_rows > 1200 and max(b.num_rows for b in fast.to_batches()) <= 100

    # Without the compiled codec: every record goes through decode_record, rows through the Python loop.
    monkeypatch.setattr(spark_source, "decode_change_run",
                        lambda view, key_columns, messages, start, max_bytes: (None, None, [], start))
    monkeypatch.setattr(change_rows, "_native", None)
    slow = read_all(parts)
    assert fast.equals(slow)


def test_one_consumer_reads_a_group_of_partitions_as_a_consumer_per_partition_does(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A small read's group: its partitions' ranges read by one consumer assigned to them all give the rows
    of a consumer per partition, each row once; a partition with two ranges (the log cache served the
    epochs between them) has its second read on its own."""
    parts = load(settings, redis_client)
    assert len(parts) == settings.partitions > 1

    def rows(batches: list[pa.RecordBatch]) -> list[dict[str, object]]:
        table = pa.Table.from_batches(batches)
        return sorted(table.to_pylist(), key=lambda r: (r["_partition"], r["_offset"], r["_weight"]))

    expected = rows([b for part in parts for b in read_partition_from_kafka(part, batch_rows=100)])
    grouped = list(read_partitions_from_kafka(parts, batch_rows=100))
    assert rows(grouped) == expected and max(b.num_rows for b in grouped) <= 100
    assert len({r["_partition"] for r in expected}) == settings.partitions
    # Partition 0 in two ranges, the first two epochs and the last (the third left to "the cache").
    epochs = [epoch for epoch, _ in parts[0].barriers]
    head = sub_range(parts[0], parts[0].after_epoch, epochs[1])
    tail = sub_range(parts[0], epochs[2], epochs[3])
    split = rows(list(read_partitions_from_kafka([head, *parts[1:], tail], batch_rows=100)))
    assert split == [r for r in expected if r["_partition"] != 0 or r["_epoch"] != epochs[2]]
    assert len(split) < len(expected)
    # The data source's group: the same rows through the log cache's lookup (no worker: all from Kafka).
    assert rows(list(read_partition_group(PartitionGroup(tuple(parts))))) == expected
