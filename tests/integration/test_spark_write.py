"""Spark writes into tables (issue 18 item 4): ``df.write`` / ``df.writeStream`` ``format("mvlog")``.

The oracle is the input rows folded by key in plain Python (later writes win; overwrite keeps only its
own rows), computed from what the test generated, never from mvlog. The table is checked in Redis and,
epoch by epoch, in its changelog read with plain confluent-kafka + fastavro
(:mod:`tests.integration.independent_consumer`): following the committed chain of epochs (each barrier
names the epoch before it), every epoch holds exactly one Spark batch (its ``spark_batch`` mutation) and
the changelog folded up to it equals the oracle after that batch.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key
from mvlog.schemas.codec import decode_row
from mvlog.services.tables.writer import Table
from tests.integration.independent_consumer import read_topic

COLUMNS = {"id": "int", "name": "string", "score": "float", "flag": "boolean"}
DDL = "id BIGINT, name STRING, score DOUBLE, flag BOOLEAN"
Rows = dict[Key, dict[str, Any]]
ROOT = Path(__file__).resolve().parents[2]


def generate(rng: random.Random, ids: list[int]) -> list[dict[str, Any]]:
    """One row per id (a DataFrame has no order: two rows of one key in one write have no winner)."""
    return [{"id": i, "name": rng.choice(["a", "bb", "", "ccc", None]), "score": rng.uniform(-1e6, 1e6),
             "flag": rng.choice([True, False, None])} for i in ids]


def table_rows(client: redis.Redis, settings: Settings, table: str) -> Rows:
    rows = (decode_row(raw) for _, raw in ViewStore(client, settings.topic_prefix).scan_rows(table))
    return {(row["id"],): row for row in rows}


def committed_batches(settings: Settings, client: redis.Redis, table: str) -> list[tuple[dict[str, Any], Rows]]:
    """(spark_batch payload, the table folded from the changelog up to that epoch) of every committed
    epoch, in order: the chain of barriers from the table's MCE back to the first epoch."""
    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic(table), settings.partitions, idle=1.5)
    barriers = {epoch: entries for epoch, entries in logs[0].barriers.items()}
    chain: list[int] = []
    epoch = ViewStore(client, settings.topic_prefix).mce(table) or 0
    while epoch:
        chain.append(epoch)
        (_, barrier), = barriers[epoch]
        epoch = barrier["prev_epoch"]
    rows: Rows = {}
    out: list[tuple[dict[str, Any], Rows]] = []
    for epoch in reversed(chain):
        for log in logs.values():
            assert len(log.barriers[epoch]) == 1, f"epoch {epoch} has {len(log.barriers[epoch])} barriers"
            for _, change in log.changes.get(epoch, []):
                key = (change["key"]["id"],)
                if change["after"] is None:
                    rows.pop(key, None)
                else:
                    rows[key] = dict(change["after"])
        mutation = barriers[epoch][0][1]["mutation"]
        assert mutation is not None and mutation["kind"] == "spark_batch", f"epoch {epoch}: {mutation}"
        out.append((json.loads(mutation["payload"]), dict(rows)))
    return out


def same(actual: Rows, expected: Rows) -> bool:
    """Equal rows (the table fills every column; the oracle's rows have them all too)."""
    return actual == {k: dict(v) for k, v in expected.items()}


def write(spark: Any, settings: Settings, rows: list[dict[str, Any]], mode: str, table: str = "t") -> None:
    (spark.createDataFrame(rows, DDL).repartition(3).write.format("mvlog").option("table", table)
     .option("topicPrefix", settings.topic_prefix).mode(mode).save())


def test_batch_append_overwrite_and_refusals(spark: Any, settings: Settings, redis_client: redis.Redis) -> None:
    Table.create(settings, "t", COLUMNS, ["id"]).close()
    rng = random.Random(18)
    oracle: Rows = {}
    expected: list[Rows] = []
    modes = []

    first = generate(rng, rng.sample(range(600), 300))
    write(spark, settings, first, "append")
    oracle.update({(r["id"],): r for r in first})
    expected.append(dict(oracle))
    modes.append("append")
    assert same(table_rows(redis_client, settings, "t"), oracle)

    second = generate(rng, rng.sample(range(600), 250))  # keys of the first write again, and new ones
    assert {r["id"] for r in second} & {r["id"] for r in first}
    write(spark, settings, second, "append")
    oracle.update({(r["id"],): r for r in second})
    expected.append(dict(oracle))
    modes.append("append")
    assert same(table_rows(redis_client, settings, "t"), oracle)

    third = generate(rng, rng.sample(range(900), 200))  # replaces: the other keys are deleted
    assert set(oracle) - {(r["id"],) for r in third}
    write(spark, settings, third, "overwrite")
    oracle = {(r["id"],): r for r in third}
    expected.append(dict(oracle))
    modes.append("overwrite")
    assert same(table_rows(redis_client, settings, "t"), oracle)

    # Refused writes commit nothing and say what is wrong, and where.
    with pytest.raises(Exception, match=r"no column.*'colour'"):
        spark.createDataFrame([(1, "red")], "id BIGINT, colour STRING").write.format("mvlog") \
            .option("table", "t").option("topicPrefix", settings.topic_prefix).mode("append").save()
    with pytest.raises(Exception, match="column 'score' is float, the DataFrame's is timestamp"):
        spark.sql("SELECT 1L AS id, current_timestamp() AS score").write.format("mvlog") \
            .option("table", "t").option("topicPrefix", settings.topic_prefix).mode("append").save()
    bad = generate(rng, [1000, 1001, 1002])
    bad[1]["id"] = None  # a null primary key, on an executor
    with pytest.raises(Exception, match="row 1: field 'id'"):
        spark.createDataFrame(bad, DDL).coalesce(1).write.format("mvlog").option("table", "t") \
            .option("topicPrefix", settings.topic_prefix).mode("append").save()
    assert same(table_rows(redis_client, settings, "t"), oracle)

    write(spark, settings, [], "overwrite")  # an empty DataFrame: every row deleted, in one epoch
    oracle = {}
    expected.append({})
    modes.append("overwrite")
    assert table_rows(redis_client, settings, "t") == {}

    batches = committed_batches(settings, redis_client, "t")
    assert [payload["mode"] for payload, _ in batches] == modes, "one epoch per write, refused ones none"
    assert len({payload["writer"] for payload, _ in batches}) == 4
    for (_, folded), want in zip(batches, expected, strict=True):
        assert same(folded, want)
    leftovers = list(redis_client.scan_iter(match=f"{settings.topic_prefix}:*spark-stage*"))
    assert leftovers == [], "staged rows are deleted after commit and abort"


def write_file(folder: Path, index: int, rows: list[dict[str, Any]]) -> None:
    """One JSON-lines file per micro-batch (maxFilesPerTrigger=1), in modification-time order."""
    path = folder / f"part-{index:04d}.json"
    tmp = folder.parent / f"{path.name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stamp = 1_700_000_000 + index
    os.utime(tmp, (stamp, stamp))
    tmp.rename(path)


def last_batch(hint: Any) -> int:
    """The batch the Spark write's hint in Redis names (-1 before any): ``{writer: b"batch:epoch"}``."""
    return max((int(value.split(b":")[0]) for value in cast(dict[bytes, bytes], hint).values()), default=-1)


def test_streaming_write_replayed_killed_and_restarted_commits_each_batch_once(
        spark: Any, make_settings: Callable[..., Settings], redis_client: redis.Redis, tmp_path: Path) -> None:
    settings = make_settings()
    Table.create(settings, "s", COLUMNS, ["id"]).close()
    rng = random.Random(4)
    inputs = tmp_path / "in"
    inputs.mkdir()
    checkpoint = tmp_path / "checkpoint"
    files: list[list[dict[str, Any]]] = []

    def add_files(count: int) -> None:
        for _ in range(count):
            rows = generate(rng, rng.sample(range(120), rng.randint(1, 60)))
            write_file(inputs, len(files), rows)
            files.append(rows)

    def start() -> Any:
        stream = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(inputs))
        return (stream.writeStream.format("mvlog").option("table", "s")
                .option("topicPrefix", settings.topic_prefix)
                .option("checkpointLocation", str(checkpoint)).start())

    add_files(3)
    query = start()
    query.processAllAvailable()
    query.stop()
    # A crash after the sink committed batch 2 and before Spark's commit log said so: Spark replays it.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    query = start()
    query.processAllAvailable()
    query.stop()
    replayed = [p["batchId"] for p in query.recentProgress]
    assert 2 in replayed, f"Spark did not replay batch 2: {replayed}"

    # The driver (JVM, Python workers and all) SIGKILLed mid-run, at a random moment after batch 4.
    add_files(4)
    hint = view_key(settings.topic_prefix, "s", "spark-batches")
    assert last_batch(redis_client.hgetall(hint)) == 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")}
    env.update(settings.to_env())
    with (tmp_path / "driver.log").open("wb") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.processes.spark_stream_writer", "s", str(inputs),
             str(checkpoint), DDL], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while last_batch(redis_client.hgetall(hint)) < 4:
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the driver committed no batch 4 in 90 s"
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 2))
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)

    query = start()
    query.processAllAvailable()
    query.stop()
    killed_run = len(files)

    # A new checkpoint at the same path numbers its batches from 0 again: a new writer, nothing skipped.
    shutil.rmtree(checkpoint)
    inputs = tmp_path / "in2"
    inputs.mkdir()
    add_files(2)
    query = start()
    query.processAllAvailable()
    query.stop()

    oracle: Rows = {}
    expected: list[Rows] = []
    for rows in files:
        oracle.update({(r["id"],): {**r, "score": float(r["score"])} for r in rows})
        expected.append(dict(oracle))
    assert same(table_rows(redis_client, settings, "s"), oracle)
    batches = committed_batches(settings, redis_client, "s")
    assert [payload["batch"] for payload, _ in batches] == [*range(killed_run), 0, 1], \
        "each micro-batch is one epoch, none twice, none lost"
    writers = [payload["writer"] for payload, _ in batches]
    assert len(set(writers[:killed_run])) == 1, "the writer keeps its name across restarts"
    assert writers[killed_run] == writers[-1] != writers[0], "a new checkpoint is a new writer"
    assert writers[0].startswith(f"{checkpoint}#")
    for index, ((_, folded), want) in enumerate(zip(batches, expected, strict=True)):
        assert same(folded, want), f"batch {index}"



def test_a_session_made_again_for_other_settings_writes_with_them(
        spark: Any, make_settings: Callable[..., Settings], topic_prefix: str, redis_client: redis.Redis) -> None:
    """``spark_session(settings)`` in a process whose Spark already runs (``getOrCreate`` returns the same
    session) binds ``format("mvlog")`` to the new settings, with no option naming them: the data source
    runs in Spark's Python workers, whose environment is the JVM's from its start, not the caller's."""
    from mvlog.services.spark.session import spark_session

    other = make_settings(topic_prefix=f"{topic_prefix}other")
    Table.create(other, "t", COLUMNS, ["id"]).close()
    rows = generate(random.Random(7), list(range(20)))
    session = spark_session(other)
    assert session is spark
    session.createDataFrame(rows, DDL).write.format("mvlog").option("table", "t").mode("append").save()
    assert same(table_rows(redis_client, other, "t"), {(r["id"],): r for r in rows})
    # And the rows are readable back through the same binding.
    read = {r["id"] for r in session.read.format("mvlog").option("table", "t").load()
            .where("_change_type = 'insert'").select("id").collect()}
    assert read == set(range(20))
