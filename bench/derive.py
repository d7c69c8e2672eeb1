"""``mvlog replay derive --engine spark`` of a view whose operator runs in Spark's tasks: the driver
engine (executors read and fold the upstream, the driver runs the operator over every epoch and writes
the new changelog) against the task path (a task per view partition hydrates, derives and writes its
partition; the driver indexes), on the same data in the same run.

    .venv/bin/python bench/derive.py [--changes 400000] [--epochs 40] [--keys 100000] [--master local[2]]

A table of ``--keys`` keys gets ``--changes`` upserts over ``--epochs`` epochs; a filter view and a
GROUP BY view follow it. Each view's second half of epochs is then re-derived both ways into new
changelogs, each engine ``--repeat`` times, alternately (the fastest run counts). Printed per view and
engine: seconds, the upstream change events read per second (the prefix folded and the range), the
driver process's CPU seconds (this Python process: the operator on the driver engine, the planning and
indexing on the task path), and the task path's speed-up over the driver engine. The machine is printed
first.
"""

from __future__ import annotations

import argparse
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
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.rederive.derive import Derivation, DerivationPlan, TopicSink, plan_derivation
from mvlog.services.rederive.tasks import TaskDerivation
from mvlog.services.spark.session import spark_session
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_rate, machine_info, temporary_stack

VIEWS = {"filtered": "SELECT * FROM t1 WHERE v >= 10",
         "grouped": "SELECT g, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi FROM t1 GROUP BY g"}


@dataclass(frozen=True)
class Run:
    seconds: float
    driver_cpu_s: float
    changes: int  # the view changes derived


def driver_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=400_000)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each engine, alternately (the fastest counts)")
    args = parser.parse_args()
    print(machine_info())
    print(f"{args.changes:,} upserts of {args.keys:,} keys in {args.epochs} epochs, {args.partitions} partitions, "
          f"Spark {args.master}")
    with temporary_stack("mvlog-bench-derive-") as (stack, _folder):
        settings: Settings = stack.settings(topic_prefix="bench", partitions=args.partitions,
                                            spark_master=args.master, operators_in_tasks=True)
        client = connect(settings)
        spark = spark_session(settings, app_name="mvlog-bench-derive")
        table = Table.create(settings, "t1", {"id": "int", "g": "int", "v": "int"}, ["id"], client=client,
                             auto_commit=False)
        for name, sql in VIEWS.items():
            create_view(settings, name, sql, client=client)
        rng = random.Random(7)
        per_epoch = args.changes // args.epochs
        began = time.perf_counter()
        for _ in range(args.epochs):
            table.upsert([{"id": rng.randrange(args.keys), "g": rng.randrange(args.groups), "v": rng.randrange(100)}
                          for _ in range(per_epoch)])
            table.flush()
        table.close()
        print(f"table written in {time.perf_counter() - began:.1f} s")
        for name in VIEWS:
            consumer = ViewConsumer(settings, name, spark=spark, client=client)
            consumer.catch_up()
            consumer.stop()
        store = ViewStore(client, settings.topic_prefix)
        for name in VIEWS:
            epochs = [e.epoch for e in store.index.between(name, 0, 0, store.mce(name) or 0)]
            plan = plan_derivation(settings, client, name, epochs[len(epochs) // 2], epochs[-1])
            read = sum(u.records for u in plan.upstreams)
            # Each engine runs --repeat times, alternately (the first runs pay Spark's warm-up); the fastest counts.
            tried: dict[str, list[Run]] = {"driver": [], "tasks": []}
            for attempt in range(args.repeat):
                tried["driver"].append(derive_on_driver(settings, client, plan, spark, f"{name}.driver{attempt}"))
                tried["tasks"].append(derive_in_tasks(settings, client, plan, spark, f"{name}.tasks{attempt}"))
            runs = {engine: min(found, key=lambda run: run.seconds) for engine, found in tried.items()}
            if runs["driver"].changes != runs["tasks"].changes:
                raise SystemExit(f"{name}: the engines derived {runs['driver'].changes} and {runs['tasks'].changes} "
                                 "changes")
            print(f"{name}: {len(plan.epochs)} epochs re-derived, {read:,} upstream change events read, "
                  f"{runs['tasks'].changes:,} view changes")
            for engine, run in runs.items():
                print(f"  {engine:<7} {run.seconds:6.2f} s  {fmt_rate(read / run.seconds):>9} events/s  "
                      f"driver CPU {run.driver_cpu_s:5.2f} s")
            print(f"  ratio tasks/driver: {runs['driver'].seconds / runs['tasks'].seconds:.2f}x the speed, "
                  f"{runs['tasks'].driver_cpu_s / max(runs['driver'].driver_cpu_s, 1e-9):.2f}x the driver CPU")
        client.close()
    return 0


def derive_on_driver(settings: Settings, client: redis.Redis, plan: DerivationPlan, spark: SparkSession,
                     target: str) -> Run:
    cpu, began = driver_cpu(), time.perf_counter()
    derivation = Derivation(settings, client, plan, "spark", spark=spark)
    sink = TopicSink(settings, client, derivation.entry, target)
    changes = 0
    try:
        for derived in derivation.epochs():
            sink.write(derived)
            changes += len(derived.changes)
    finally:
        sink.close()
    return Run(time.perf_counter() - began, driver_cpu() - cpu, changes)


def derive_in_tasks(settings: Settings, client: redis.Redis, plan: DerivationPlan, spark: SparkSession,
                    target: str) -> Run:
    cpu, began = driver_cpu(), time.perf_counter()
    tasks = TaskDerivation.for_plan(settings, client, plan, spark)
    assert tasks is not None, "the view's operator runs in tasks"
    derived = tasks.run(target)
    return Run(time.perf_counter() - began, driver_cpu() - cpu, derived.changes)


if __name__ == "__main__":
    sys.exit(main())
