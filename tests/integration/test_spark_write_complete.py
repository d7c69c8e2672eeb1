"""Spark writes in ``outputMode("complete")`` (Spark's overwrite flag for streams): each micro-batch's
result replaces the table in one epoch. Its own file: a stateful streaming aggregation takes Spark a
while to start, and test_spark_write.py is at its time budget. Oracle: the aggregate computed in plain
Python over the input files, after each file (one file per micro-batch)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import redis
from pyspark.sql import functions

from mvlog.config import Settings
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.schemas.codec import decode_row
from mvlog.services.tables.writer import Table
from tests.integration.independent_consumer import read_topic
from tests.integration.test_spark_write import Rows, write_file


def test_complete_mode_replaces_the_table_every_micro_batch(
        spark: Any, settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    """``outputMode("complete")`` is Spark's overwrite flag: each micro-batch's result replaces the table,
    so a group the HAVING-like filter drops is deleted in that batch's epoch."""
    Table.create(settings, "agg", {"k": "int", "n": "int", "total": "int"}, ["k"]).close()
    rng = random.Random(7)
    inputs = tmp_path / "in"
    inputs.mkdir()
    files = [[{"k": rng.randrange(8), "v": rng.randrange(100)} for _ in range(12)] for _ in range(2)]
    seen: list[dict[str, Any]] = []
    expected: list[Rows] = []
    for index, rows in enumerate(files):
        write_file(inputs, index, rows)
        seen.extend(rows)
        groups: dict[int, tuple[int, int]] = {}
        for row in seen:
            n, total = groups.get(row["k"], (0, 0))
            groups[row["k"]] = (n + 1, total + row["v"])
        expected.append({(k,): {"k": k, "n": n, "total": t} for k, (n, t) in groups.items() if n < 3})
    assert set(expected[0]) - set(expected[1]), "the workload drops a group in the second batch"
    stream = spark.readStream.schema("k BIGINT, v BIGINT").option("maxFilesPerTrigger", 1).json(str(inputs))
    query = (stream.groupBy("k").agg(functions.count("*").alias("n"), functions.sum("v").alias("total"))
             .where("n < 3").writeStream.outputMode("complete").format("mvlog").option("table", "agg")
             .option("topicPrefix", settings.topic_prefix)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    query.processAllAvailable()
    query.stop()
    stored = ViewStore(redis_client, settings.topic_prefix).scan_rows("agg")
    assert {(row["k"],): row for row in (decode_row(raw) for _, raw in stored)} == expected[-1]
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic("agg"), settings.partitions, idle=1.5)
    folded: Rows = {}
    epochs = sorted(logs[0].barriers)
    assert len(epochs) == len(files), "one epoch per micro-batch"
    for epoch, want in zip(epochs, expected, strict=True):
        for log in logs.values():
            for _, change in log.changes.get(epoch, []):
                key = (change["key"]["k"],)
                if change["after"] is None:
                    folded.pop(key, None)
                else:
                    folded[key] = dict(change["after"])
        assert folded == want, f"epoch {epoch}"
        assert json.loads(logs[0].barriers[epoch][0][1]["mutation"]["payload"])["mode"] == "overwrite"
