"""A replacement's cut-over, on the driver's way against Spark's tasks (issue 19, item 5), same data, same run.

    .venv/bin/python bench/cutover.py [--rows 200000] [--partitions 4] [--repeat 2] [--master local[2]]

A table of ``--rows`` rows feeds a filter view. Each round stages a replacement of the view with another
threshold (so about a tenth of the rows change), lets the view's consumer hydrate it, requests the
apply, writes one small upstream epoch and times the consumer's catch-up of that epoch, which is the
cut-over: on the driver's way (``MVLOG_OPERATORS_IN_TASKS`` off: the driver reads both row sets whole and
diffs them) or in Spark's tasks (on: two tasks scan the row sets into a shuffle by view partition, a task
per partition diffs and writes its part). Rounds alternate between the two (the fastest of each counts).
Printed per way: the seconds of the cut-over's catch-up, the changes it wrote, this driver process's CPU
seconds and its peak RSS above its RSS before the round (``VmHWM`` reset first), and after each round the
view's rows checked against the table's. The last line: the task path's driver CPU and speed against the
driver's way, and both ways' driver peak RSS growth.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from pyspark.sql import SparkSession

from mvlog.config import Settings
from mvlog.connectors.redis.redis_client import connect
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.schemas.codec import decode_row
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.replacement.operations import request_apply, stage_replacement, wait_for_apply
from mvlog.services.spark.session import spark_session
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, temporary_stack
from _memory import peak_mib, reset_peaks


@dataclass(frozen=True)
class Round:
    way: str
    seconds: float
    driver_cpu_s: float
    peak_growth_mib: float  # the driver process's peak RSS during the cut-over, above its RSS before it
    changes: int  # what the cut-over's epoch wrote


def driver_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each way, alternately (the fastest counts)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    print(machine_info())
    print(f"a filter view over {args.rows:,} rows, {args.partitions} partitions, Spark {args.master}")
    with temporary_stack("mvlog-bench-cutover-") as (stack, _folder):
        base: Settings = stack.settings(topic_prefix="bench", partitions=args.partitions, spark_master=args.master)
        client = connect(base)
        spark = spark_session(base, app_name="mvlog-bench-cutover")
        table = Table.create(base, "t1", {"id": "int", "v": "int", "pad": "string"}, ["id"], client=client,
                             auto_commit=False)
        rng = random.Random(3)
        values = {key: rng.randrange(1000) for key in range(args.rows)}
        for start in range(0, args.rows, 50_000):
            table.upsert([{"id": key, "v": values[key], "pad": "x" * 40}
                          for key in range(start, min(start + 50_000, args.rows))])
            table.flush()
        create_view(base, "mv1", "SELECT id, v, pad FROM t1 WHERE v >= 0", client=client)
        ViewConsumer(base, "mv1", spark=spark, client=client).catch_up()
        rounds: list[Round] = []
        threshold = 0
        for attempt in range(args.repeat):
            for way in ("driver", "tasks"):
                threshold += 100  # about a tenth of the rows leave the view each round
                settings = base.model_copy(update={"operators_in_tasks": way == "tasks"})
                rounds.append(cut_over(settings, client, spark, table, values, threshold, way, rng))
                print(f"  round {attempt + 1} {way:<6} {rounds[-1].seconds:6.2f} s  {rounds[-1].changes:>7,} changes"
                      f"  driver CPU {rounds[-1].driver_cpu_s:5.2f} s  peak RSS {rounds[-1].peak_growth_mib:+7.1f} MiB")
        table.close()
        client.close()
    best = {way: min((r for r in rounds if r.way == way), key=lambda r: r.seconds) for way in ("driver", "tasks")}
    for way, found in best.items():
        print(f"{way:<6} best: {found.seconds:.2f} s, driver CPU {found.driver_cpu_s:.2f} s, "
              f"driver peak RSS {found.peak_growth_mib:+.1f} MiB ({found.changes:,} changes)")
    driver, tasks = best["driver"], best["tasks"]
    print(f"tasks / driver's way: driver CPU {tasks.driver_cpu_s / max(driver.driver_cpu_s, 1e-9):.2f}x, "
          f"speed {driver.seconds / tasks.seconds:.2f}x; driver peak RSS {tasks.peak_growth_mib:+.1f} MiB "
          f"against {driver.peak_growth_mib:+.1f} MiB")
    return 0


def cut_over(settings: Settings, client: redis.Redis, spark: SparkSession, table: Table, values: dict[int, int],
             threshold: int, way: str, rng: random.Random) -> Round:
    """One round: a replacement with ``threshold`` staged, hydrated, applied at the next epoch (timed)."""
    consumer = ViewConsumer(settings, "mv1", spark=spark, client=client)

    def small_epoch() -> int:
        for key in rng.sample(range(len(values)), 10):
            values[key] = rng.randrange(1000)
            table.upsert([{"id": key, "v": values[key], "pad": "x" * 40}])
        return table.flush()

    try:
        small_epoch()  # a first micro-batch: a consumer cuts over in tasks only once it completed one there
        consumer.catch_up()
        staged = stage_replacement(settings, "mv1", f"SELECT id, v, pad FROM t1 WHERE v >= {threshold}", client=client)
        consumer.catch_up()  # the upkeep hydrates it at the view's MCE
        request_apply(settings, "mv1", client=client)
        epoch = small_epoch()  # the cut-over's
        before_rss, before_cpu = rss_mib(), driver_cpu()
        reset_peaks([os.getpid()])
        began = time.perf_counter()
        consumer.catch_up()
        seconds = time.perf_counter() - began
        cpu, peak = driver_cpu() - before_cpu, peak_mib(os.getpid()) - before_rss
        applied = wait_for_apply(settings, "mv1", staged.id, timeout=5, client=client)
        if applied.epoch != epoch or (way == "tasks") != (consumer.replacement.cut_overs_in_tasks == 1):
            raise SystemExit(f"{way}: cut over at {applied.epoch} (expected {epoch}), "
                             f"{consumer.replacement.cut_overs_in_tasks} in tasks")
    finally:
        consumer.stop()
    store = ViewStore(client, settings.topic_prefix)
    _, raw = store.read_at_consistent_epoch("mv1")
    got = {row["id"]: row["v"] for row in map(decode_row, (value for _, value in raw))}
    expected = {key: v for key, v in values.items() if v >= threshold}
    if got != expected:
        raise SystemExit(f"{way}: the view has {len(got):,} rows, the table {len(expected):,} over {threshold}")
    index = store.index
    changes = sum(found.records for p in range(settings.partitions)
                  if (found := index.at("mv1", p, epoch)) is not None)
    return Round(way, seconds, cpu, peak, changes)


if __name__ == "__main__":
    sys.exit(main())
