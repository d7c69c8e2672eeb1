"""A small read's partitions: one Kafka consumer assigned to them all against a consumer per partition.

A view that keeps up reads one small epoch per micro-batch, planned as one Spark task over every
partition of its upstream (``Settings.small_read_records``). That task used to read the partitions one
after the other with a new consumer each; it now reads them with one consumer assigned to them all
(``read_partitions_from_kafka``). This compares the two on the same ranges, without Spark (the task's
function itself, in this process): per read, the wall time, the client's CPU (this process, librdkafka's
threads included) and the broker's CPU.

Starts its own local stack (Apache Kafka + redis-server on free loopback ports), writes ``--epochs``
epochs of ``--changes`` changes into a table of ``--partitions`` partitions, then reads each epoch both
ways, alternating, ``--rounds`` times over. The last line holds the ratios (one consumer / one per
partition; lower is better).

    python bench/small_reads.py [--epochs 60] [--changes 30] [--partitions 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil
import redis
from _common import machine_info, temporary_stack

from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.spark.spark_source import (
    PartitionRange,
    _Planner,
    read_partition_from_kafka,
    read_partitions_from_kafka,
)
from mvlog.services.tables.writer import Table


def one_per_partition(parts: Sequence[PartitionRange]) -> int:
    return sum(batch.num_rows for part in parts for batch in read_partition_from_kafka(part))


def one_for_all(parts: Sequence[PartitionRange]) -> int:
    return sum(batch.num_rows for batch in read_partitions_from_kafka(parts))


@dataclass
class Tally:
    """What one way of reading cost over its reads."""

    name: str
    reads: int = 0
    rows: int = 0
    wall: float = 0.0
    client_cpu: float = 0.0
    broker_cpu: float = 0.0
    walls: list[float] = field(default_factory=list)

    def line(self) -> str:
        per = 1000 / self.reads
        median = sorted(self.walls)[len(self.walls) // 2] * 1000
        return (f"  {self.name:<18} {self.wall * per:6.1f} ms wall per read (median {median:5.1f}), "
                f"client CPU {self.client_cpu * per:5.1f} ms, broker CPU {self.broker_cpu * per:5.1f} ms "
                f"({self.reads} reads, {self.rows:,} rows)")


def measure(tally: Tally, read: Callable[[Sequence[PartitionRange]], int], parts: Sequence[PartitionRange],
            broker: psutil.Process) -> None:
    me = psutil.Process()
    client, server, started = me.cpu_times(), broker.cpu_times(), time.perf_counter()
    tally.rows += read(parts)
    wall = time.perf_counter() - started
    client_after, server_after = me.cpu_times(), broker.cpu_times()
    tally.reads += 1
    tally.wall += wall
    tally.walls.append(wall)
    tally.client_cpu += (client_after.user + client_after.system) - (client.user + client.system)
    tally.broker_cpu += (server_after.user + server_after.system) - (server.user + server.system)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--changes", type=int, default=30, help="changes per epoch")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(machine_info())
    with temporary_stack("mvlog-bench-small-reads-") as (stack, _):
        settings = stack.settings(topic_prefix="bench", partitions=args.partitions)
        broker = psutil.Process(int((stack.data_dir / "kafka.pid").read_text().split()[0]))
        client = redis.Redis.from_url(settings.redis_url)
        with Table.create(settings, "t1", {"id": "int", "v": "int"}, ["id"], client=client,
                          auto_commit=False) as table:
            epochs = []
            for e in range(args.epochs):
                table.upsert([{"id": (e * args.changes + i) % 500, "v": e} for i in range(args.changes)])
                epochs.append(table.flush())
        planner = _Planner(settings, CatalogStore(settings, client).get("t1"))
        ranges = [planner.plan(before, epoch) for before, epoch in zip([0, *epochs], epochs, strict=False)]
        per_partition, shared = Tally("one per partition"), Tally("one for all")
        one_for_all(ranges[0])  # warm up: imports, the compiled codec, the broker's first fetches
        one_per_partition(ranges[0])
        for _ in range(args.rounds):
            for i, parts in enumerate(ranges):
                first, second = ((per_partition, one_per_partition), (shared, one_for_all))[::1 if i % 2 else -1]
                measure(*first, parts, broker)
                measure(*second, parts, broker)
        assert per_partition.rows == shared.rows, (per_partition.rows, shared.rows)
    print(f"{args.epochs} epochs of {args.changes} changes over {args.partitions} partitions, read {args.rounds} "
          "times each way, alternating:")
    print(per_partition.line())
    print(shared.line())
    print(f"ratio one for all / one per partition: wall {shared.wall / per_partition.wall:.2f}x, client CPU "
          f"{shared.client_cpu / per_partition.client_cpu:.2f}x, broker CPU "
          f"{shared.broker_cpu / per_partition.broker_cpu:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
