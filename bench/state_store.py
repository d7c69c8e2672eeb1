"""Operator state in Redis (mvlog's tasks) against Spark's own state store (issue 19, item 3).

Issue 19 asks whether Spark's state store (``transformWithStateInPandas`` over RocksDB, partitioned and
checkpointed by Spark) would keep a view's operator state better than Redis does. This runs one GROUP BY
(``SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k``) over the same micro-batches of signed change
rows (inserts, updates as a retraction and an assertion, deletes) three ways, each a Structured Streaming
query over the same Parquet files (one per epoch, ``maxFilesPerTrigger=1``, ``availableNow``):

* **redis**: what a GROUP BY's task does in mvlog (``MVLOG_OPERATORS_IN_TASKS``), without the Kafka side:
  the micro-batch shuffled by group (``repartition(n, k)``), each task runs mvlog's operator
  (``ViewOperator``) over its rows, reading its groups' state from the view's ``opstate`` hash in one
  ``HMGET`` (``ViewRows.get_state``) and writing the new state in one pipeline: a task's two round trips.
  (A real task writes the state into its partition's staging hash, which the epoch's commit script moves
  server-side; that move is left out.)
* **tws**: ``groupBy(k).transformWithStateInPandas`` with a ``ValueState`` of (count, sum) per group,
  in Spark's RocksDB state store, checkpointed per micro-batch.
* **native**: Spark's own streaming aggregation (``groupBy(k).agg(sum)``, update mode) in the same
  RocksDB state store: the JVM's operator, no Python.

Each side's output (the changed groups' rows) is collected per micro-batch by ``foreachBatch`` and folded
into the final rows, checked against the generator's: every side must end with the same view. Printed:
changes/s of each (best of ``--repeat``), the ratios redis/tws and redis/native, and the machine.

Run from the repository root (``make setup`` installs protobuf, which PySpark's state API v2 needs)::

    .venv/bin/python bench/state_store.py [--epochs 20] [--changes 10000] [--keys 50000] [--groups 1000] \\
        [--partitions 4] [--master local[2]] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import machine_info
from mvlog.connectors.redis.view_rows import ViewRows
from mvlog.connectors.spark import worker_daemon
from mvlog.row_schema import RowSchema
from mvlog.views import ChangeBatch, ViewOperator, plan_view
from mvlog.views.state import StoredState
from mvlog.views.state_codec import GROUP_TAG, loads

T = RowSchema.of({"id": "int", "k": "int", "v": "int"}, ["id"])
SQL = "SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k"
VIEW = "g"
OUTPUT = "k long, n long, s long"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

Totals = dict[int, tuple[int, int]]  # group -> (count, sum) of its rows


def write_epochs(folder: Path, epochs: int, changes: int, keys: int, groups: int, seed: int) -> Totals:
    """``epochs`` Parquet files of signed rows (``id``, ``k``, ``v``, ``weight``, ``cid``: a change's id,
    shared by its retraction and assertion); returns each group's count and sum at the end."""
    rng = random.Random(seed)
    rows: dict[int, tuple[int, int, int]] = {}
    for epoch in range(epochs):
        out: list[tuple[int, int, int, int, int]] = []  # id, k, v, weight, change
        for i, key in enumerate(rng.sample(range(keys), changes)):
            change, old = epoch * changes + i, rows.get(key)
            if old is not None:
                out.append((*old, -1, change))
            if old is None or rng.random() < 0.85:  # an insert or an update; else a delete
                rows[key] = (key, rng.randrange(groups), rng.randrange(1000))
                out.append((*rows[key], 1, change))
            else:
                del rows[key]
        columns = dict(zip(("id", "k", "v", "weight", "cid"), map(list, zip(*out, strict=True)), strict=True))
        pq.write_table(pa.table(columns), folder / f"epoch-{epoch:05d}.parquet")
    totals: Totals = {}
    for _, k, v in rows.values():
        n, s = totals.get(k, (0, 0))
        totals[k] = (n + 1, s + v)
    return totals


@dataclass(frozen=True)
class RedisGroupTask:
    """``mapInArrow``'s function: one task's rows of a micro-batch through mvlog's operator, its groups'
    state read from and written to Redis (a real task's two round trips)."""

    redis_url: str
    prefix: str

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = list(batches)
        if not collected:
            return
        rows = pa.Table.from_batches(collected)
        client = redis.Redis.from_url(self.redis_url)
        store = ViewRows(client, self.prefix)
        changes = ChangeBatch.from_signed(T, rows.select(["id", "k", "v"]), rows.column("weight"),
                                          rows.column("cid"))
        output = ViewOperator(plan_view(VIEW, SQL, {"t": T})).apply_epoch({"t": changes},
                                                                          StoredState(partial(store.get_state, VIEW)))
        puts, deletes = output.state_puts_and_deletes()
        pipe = client.pipeline(transaction=False)
        opstate = f"{self.prefix}:{{{VIEW}}}:opstate"
        if puts:
            pipe.hset(opstate, mapping=puts)  # type: ignore[arg-type]
        if deletes:
            pipe.hdel(opstate, *deletes)
        pipe.execute()
        after = [c.after for c in output.changes.to_changes() if c.after is not None]
        gone = [c.before for c in output.changes.to_changes() if c.after is None and c.before is not None]
        yield pa.RecordBatch.from_pylist([{"k": r["k"], "n": r["n"], "s": r["s"]} for r in after]
                                         + [{"k": r["k"], "n": 0, "s": 0} for r in gone],
                                         schema=pa.schema([("k", pa.int64()), ("n", pa.int64()), ("s", pa.int64())]))


class GroupSums(StatefulProcessor):
    """A group's count and sum in a ``ValueState`` (Spark's state store): the changed group's row out."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.sums = handle.getValueState("sums", "n long, s long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],  # noqa: N802 (PySpark's interface)
                        timerValues: Any) -> Iterator[pd.DataFrame]:  # noqa: N803
        stored = self.sums.get() if self.sums.exists() else None
        n, s = (int(stored[0]), int(stored[1])) if stored is not None else (0, 0)
        for frame in rows:
            n += int(frame["weight"].sum())
            s += int((frame["v"] * frame["weight"]).sum())
        if n:
            self.sums.update((n, s))
        else:
            self.sums.clear()
        yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})

    def close(self) -> None:
        pass


def fold_into(view: Totals, frame: DataFrame, _batch: int) -> None:
    """``foreachBatch``: the micro-batch's changed groups, collected and folded into ``view``."""
    for row in frame.collect():
        if row["n"]:
            view[row["k"]] = (row["n"], row["s"])
        else:
            view.pop(row["k"], None)


def redis_side(spark: SparkSession, source: DataFrame, view: Totals, checkpoint: str, redis_url: str,
               partitions: int) -> None:
    task = RedisGroupTask(redis_url, "bench")

    def batch(frame: DataFrame, batch_id: int) -> None:
        fold_into(view, frame.repartition(partitions, "k").mapInArrow(task.run, OUTPUT), batch_id)

    run_query(source.writeStream.foreachBatch(batch), checkpoint)


def tws_side(spark: SparkSession, source: DataFrame, view: Totals, checkpoint: str, redis_url: str,
             partitions: int) -> None:
    out = source.groupBy("k").transformWithStateInPandas(GroupSums(), OUTPUT, "Update", "None")
    run_query(out.writeStream.outputMode("update").foreachBatch(partial(fold_into, view)), checkpoint)


def native_side(spark: SparkSession, source: DataFrame, view: Totals, checkpoint: str, redis_url: str,
                partitions: int) -> None:
    out = source.groupBy("k").agg(sf.sum("weight").alias("n"), sf.sum(sf.col("v") * sf.col("weight")).alias("s"))
    run_query(out.writeStream.outputMode("update").foreachBatch(partial(fold_into, view)), checkpoint)


def run_query(writer: Any, checkpoint: str) -> None:
    writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination()


Side = Callable[[SparkSession, DataFrame, Totals, str, str, int], None]
SIDES: dict[str, Side] = {"redis": redis_side, "tws": tws_side, "native": native_side}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--changes", type=int, default=10_000, help="changes per epoch (default 10000)")
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4, help="shuffle partitions (default 4)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers: this venv's Python
    folder = Path(tempfile.mkdtemp(prefix="mvlog-bench-state-"))
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    redis_url = f"redis://127.0.0.1:{port}/0"
    try:
        (folder / "epochs").mkdir()
        truth = write_epochs(folder / "epochs", args.epochs, args.changes, args.keys, args.groups, args.seed)
        total = args.epochs * args.changes
        spark = (SparkSession.builder.master(args.master).appName("mvlog-bench-state-store")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", str(args.partitions))
                 .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
                 .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                 .config("spark.python.worker.reuse", "true")
                 .config("spark.python.daemon.module", worker_daemon.__name__)  # as mvlog's sessions, all sides
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        schema = "id long, k long, v long, weight long, cid long"
        print(f"state store benchmark: {total:,} changes in {args.epochs} epochs of {args.changes:,} "
              f"({len(truth)} groups at the end), {args.partitions} shuffle partitions, Spark {args.master}, "
              f"RocksDB state store, redis-server on loopback")
        print(machine_info())
        best: dict[str, float] = {}
        for attempt in range(args.repeat):
            for name, side in SIDES.items():
                redis.Redis.from_url(redis_url).flushall()
                source = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
                          .parquet(str(folder / "epochs")))
                view: Totals = {}
                began = time.perf_counter()
                side(spark, source, view, str(folder / f"checkpoint-{name}-{attempt}"), redis_url, args.partitions)
                seconds = time.perf_counter() - began
                if view != truth:
                    wrong = sorted(k for k in set(view) | set(truth) if view.get(k) != truth.get(k))
                    raise SystemExit(f"{name}: {len(wrong)} group(s) differ from the generator's, e.g. {wrong[:5]}")
                if name == "redis":
                    check_redis_state(redis_url, truth)
                best[name] = min(best.get(name, seconds), seconds)
                print(f"  {name:6} run {attempt + 1}: {seconds:.2f} s ({total / seconds:,.0f} changes/s); view ok")
        for name, seconds in best.items():
            print(f"{name:6} best: {total / seconds:>10,.0f} changes/s ({seconds:.2f} s)")
        print(f"ratio redis/tws {best['tws'] / best['redis']:.2f}x, redis/native {best['native'] / best['redis']:.2f}x "
              "(changes/s; above 1: Redis's side faster)")
        spark.stop()
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def check_redis_state(redis_url: str, truth: Totals) -> None:
    """The groups' state in Redis holds each group's count (``n``) and sum: the operator's, not a copy."""
    raw: dict[bytes, bytes] = redis.Redis.from_url(redis_url).hgetall(f"bench:{{{VIEW}}}:opstate")  # type: ignore[assignment]
    state = {loads(key[len(GROUP_TAG):])[0]: loads(value) for key, value in raw.items()}
    got = {k: (s["n"], s["s"][1]) for k, s in state.items() if s["n"]}
    if got != truth:
        raise SystemExit(f"redis: the operator state holds {len(got)} group(s), the generator {len(truth)}")


if __name__ == "__main__":
    main()
