"""What a Spark task of a view in tasks pays to get its partition's transactional writer: a new one
(``ChangelogWriter``: a producer, the topic's record limit, ``init_transactions``), made some time after
the partition's last commit or right after it, against one its Python worker kept
(``KeptWriters``: a claim read from Redis). Each then commits one small epoch, as a live task does.

    .venv/bin/python bench/task_writers.py [--rounds 20]

Prints the median and the worst of each, and the ratio of a new writer's median to a kept one's. A new
writer used to wait 500 ms in about half the cases: its transaction coordinator look-up found no broker
connected yet, and librdkafka asks again only after a fixed 500 ms. Writers now connect eagerly
(``enable.sparse.connections=false``; docs/scaling.md, sessions 20 and 42).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.redis_client import connect
from mvlog.connectors.redis.writer_claims import WriterClaims
from mvlog.services.pipeline.kept_writers import KeptWriters
from mvlog.services.pipeline.partition_tasks import partition_transactional_id
from mvlog.services.tables.writer import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, temporary_stack

GAP_S = 0.3  # "some time after the last commit": a live view's micro-batches are this far apart and more


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="epochs committed each way (default 20)")
    args = parser.parse_args()
    with temporary_stack("mvlog-bench-writers-") as (stack, _folder):
        settings = stack.settings(topic_prefix="bench")
        client = connect(settings)
        Table.create(settings, "t1", {"id": "int"}, ["id"], client=client).close()
        view = CatalogStore(settings, client).get("t1")
        claims = WriterClaims(client, settings.topic_prefix)
        epoch = 0

        def commit_with(writer: ChangelogWriter, _kept: bool = False) -> None:
            nonlocal epoch
            epoch += 1
            writer.commit_batches(epoch, epoch - 1, [])

        def new_writer(partition: int, gap_s: float) -> float:
            time.sleep(gap_s)
            began = time.perf_counter()
            writer = ChangelogWriter(settings, view.name, view.key_columns, view.partitions,
                                     transactional_id=partition_transactional_id(settings, view.name, partition),
                                     partition=partition)
            seconds = time.perf_counter() - began
            commit_with(writer)
            writer.close()
            return seconds

        kept = KeptWriters(outside_tasks=True)
        tid = partition_transactional_id(settings, view.name, 2)
        kept.run(settings, view, 2, tid, claims, commit_with)  # made once: every round below keeps it

        def kept_writer() -> float:
            time.sleep(GAP_S)
            got: list[float] = []
            began = time.perf_counter()

            def timed(writer: ChangelogWriter, was_kept: bool) -> None:
                got.append(time.perf_counter() - began)
                assert was_kept, "the kept writer was not used"
                commit_with(writer)

            kept.run(settings, view, 2, tid, claims, timed)
            return got[0]

        new_writer(0, 0.0)  # warm-up: the broker's coordinator, the client's first connections
        after_gap = [new_writer(0, GAP_S) for _ in range(args.rounds)]
        right_after = [new_writer(1, 0.0) for _ in range(args.rounds)]
        from_kept = [kept_writer() for _ in range(args.rounds)]
        kept.close()
        client.close()

    def line(name: str, seconds: list[float]) -> str:
        return (f"  {name:<44} median {statistics.median(seconds) * 1000:7.1f} ms, worst "
                f"{max(seconds) * 1000:7.1f} ms, {sum(s > 0.4 for s in seconds)} of {len(seconds)} over 400 ms")

    print(f"task writers benchmark: {args.rounds} rounds each, one empty epoch committed per round, "
          "Apache Kafka + redis-server on loopback")
    print(machine_info())
    print(line(f"new writer, {GAP_S:.1f} s after the last commit", after_gap))
    print(line("new writer, right after the last commit", right_after))
    print(line("kept writer (claim read from Redis)", from_kept))
    ratio = statistics.median(after_gap) / statistics.median(from_kept)
    print(f"ratio new/kept (median time to a usable writer): {ratio:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
