"""Where an ingester's epoch goes: per-stage wall and CPU time of ``SourceIngester.run``, without cProfile.

cProfile charges about 1 us to every C call it sees, and the ingester makes some eight of them per
record, so its profile of this path is mostly its own overhead. Here the stages of one epoch are wrapped
at the level of whole calls (a few per batch of messages, never per record), each timed with
``time.perf_counter`` (wall) and ``time.thread_time`` (the CPU of the calling thread), per thread: the
loop's own (``main``: consume, decode + type, cut, waiting for the commit in flight) and the commit's
(``commit``: before-images read from Redis, encoding the change events, the ``produce`` loop, the
barriers, ``send_offsets_to_transaction``, ``commit_transaction``, the Redis row write + MCE). Nested
stages are also shown as *self* time (the stage minus the stages timed inside it): the ``produce`` loop is
the self time of ``ChangelogWriter._commit``, and the encoding of the change events (compiled) the self
time of the chunk generator, whose nested ``StreamedCommit.send`` packs and sends the Redis side.

Also sampled, before and after each timed run, from ``/proc``: the CPU of each thread of this process by
name (``rdk:*`` are librdkafka's: its consumer's and the transactional producer's fetch, send and main
threads), of the broker and of redis-server.

Run with the venv's Python from the repository root (same records as ``bench/ingest.py``)::

    .venv/bin/python bench/ingest_stages.py [--records 200000] [--partitions 4] [--repeat 2]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Producer

from mvlog.connectors.kafka import changelog_writer
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.epoch_commit import EpochCommits
from mvlog.connectors.redis.streamed_commit import StreamedCommit
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.pipeline.committer import EpochCommitter
from mvlog.services.sources.epoch_reader import EpochReader
from mvlog.services.sources.ingester import SourceIngester
from mvlog.services.tables.epoch import TableEpochEncoder
from mvlog.services.tables.writer import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ingest
from _common import machine_info, temporary_stack
from ingest import encoded, produce, run_baseline, run_mvlog

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Stage:
    wall: float = 0.0
    cpu: float = 0.0
    self_wall: float = 0.0
    self_cpu: float = 0.0
    calls: int = 0


@dataclass
class Frame:
    wall: float
    cpu: float
    child_wall: float = 0.0
    child_cpu: float = 0.0


@dataclass
class Stages:
    """Inclusive and self times per (thread role, stage), kept by a stack per thread."""

    stages: dict[tuple[str, str], Stage] = field(default_factory=lambda: defaultdict(Stage))
    local: threading.local = field(default_factory=threading.local)

    def role(self) -> str:
        name = threading.current_thread().name
        return "main" if name == "MainThread" else "commit" if name.endswith("-commit") else name

    def enter(self) -> None:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        stack.append(Frame(time.perf_counter(), time.thread_time()))

    def leave(self, name: str) -> None:
        wall_end, cpu_end = time.perf_counter(), time.thread_time()
        stack: list[Frame] = self.local.stack
        frame = stack.pop()
        wall, cpu = wall_end - frame.wall, cpu_end - frame.cpu
        stage = self.stages[(self.role(), name)]
        stage.wall += wall
        stage.cpu += cpu
        stage.self_wall += wall - frame.child_wall
        stage.self_cpu += cpu - frame.child_cpu
        stage.calls += 1
        if stack:
            stack[-1].child_wall += wall
            stack[-1].child_cpu += cpu

    def wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave(name)
        return timed

    def iterate(self, items: Iterator[Any], name: str) -> Iterator[Any]:
        """``items``, each ``next`` timed as ``name`` (a generator that encodes as it yields)."""
        while True:
            self.enter()
            try:
                item = next(items)
            except StopIteration:
                self.leave(name)
                return
            self.leave(name)
            yield item

    def reset(self) -> None:
        self.stages.clear()


STAGES = Stages()
#: CPU samples of the timed window of an mvlog run: when ``run`` starts and when the epoch holding the
#: last record has committed (``TARGET`` messages); set by the hooks :func:`install` adds.
WINDOW: dict[str, dict[str, float]] = {}
TARGET = [0]
PIDS: dict[str, int] = {}


def patch(cls: Any, method: str, name: str) -> None:
    setattr(cls, method, STAGES.wrap(getattr(cls, method), name))


class TimedProducer(Producer):
    """The changelog writer's producer, its transactional calls timed (``produce`` is left as it is)."""

    def begin_transaction(self, *args: Any) -> Any:
        return STAGES.wrap(super().begin_transaction, "txn: begin_transaction")(*args)

    def send_offsets_to_transaction(self, *args: Any) -> Any:
        return STAGES.wrap(super().send_offsets_to_transaction, "txn: send_offsets (helper thread)")(*args)

    def commit_transaction(self, *args: Any) -> Any:
        return STAGES.wrap(super().commit_transaction, "txn: commit_transaction")(*args)


class TimedConsumer:
    """The ingester's consumer, its ``consume`` timed (the rest passed through)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.consume = STAGES.wrap(consumer.consume, "consume")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def gc_timer(phase: str, info: dict[str, Any]) -> None:
    """A ``gc.callbacks`` hook: each collection timed as the stage ``gc: generation N`` of its thread."""
    if phase == "start":
        STAGES.enter()
    else:
        STAGES.leave(f"gc: generation {info['generation']}")


def install() -> None:
    """Wrap the stages (class attributes: every ingester made after this is timed)."""
    gc.callbacks.append(gc_timer)
    setattr(changelog_writer, "Producer", TimedProducer)  # noqa: B010 (the module's name for the class)
    patch(SourceIngester, "run", "run (whole loop)")
    patch(EpochReader, "apply", "decode + type (EpochReader.apply)")
    patch(SourceIngester, "_settle", "wait for the commit in flight (_settle)")
    patch(SourceIngester, "_cut", "cut (offsets, barrier mutation)")
    patch(SourceIngester, "_commit_behind", "start the commit thread")
    patch(SourceIngester, "caught_up", "caught_up (watermarks)")
    patch(SourceIngester, "_commit_cut", "commit an epoch (_commit_cut)")
    patch(Table, "queue_normalized", "hand held rows to the table")
    patch(EpochCommitter, "ensure_serving_state", "MCE check (Redis)")
    patch(TableEpochEncoder, "changes", "changes: encode key+row, compare")
    patch(ViewStore, "row_count", "before-images: HLEN (Redis)")
    patch(ViewStore, "row_list", "before-images: HMGET (Redis)")
    patch(EpochCommits, "stream_commit", "open the Redis transaction (WATCH)")
    patch(ChangelogWriter, "_commit", "Kafka txn: produce loop (self)")
    patch(ChangelogWriter, "_produce", "barriers (produce)")
    patch(ChangelogWriter, "_run_bounded", "txn: send_offsets (wait)")
    patch(StreamedCommit, "send", "Redis side: pack + send chunks")
    patch(StreamedCommit, "finish", "Redis row write + MCE (finish)")
    chunks = TableEpochEncoder.chunks

    def timed_chunks(self: TableEpochEncoder, *args: Any) -> Any:
        make = chunks(self, *args)

        def generate(ts_ms: int, txn: str) -> Iterator[Any]:
            return STAGES.iterate(iter(make(ts_ms, txn)), "encode change events (chunks)")
        return generate

    TableEpochEncoder.chunks = timed_chunks  # type: ignore[method-assign,assignment]
    init = SourceIngester.__init__

    def timed_init(self: SourceIngester, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._consumer = TimedConsumer(self._consumer)  # type: ignore[assignment]

    SourceIngester.__init__ = timed_init  # type: ignore[method-assign]
    run = SourceIngester.run

    def sampled_run(self: SourceIngester, *args: Any, **kwargs: Any) -> Any:
        WINDOW.clear()
        WINDOW["start"] = cpu_sample(PIDS["kafka"], PIDS["redis"])
        return run(self, *args, **kwargs)

    SourceIngester.run = sampled_run  # type: ignore[method-assign]
    committed = ingest.TimedIngester.epoch_committed

    def sampled_commit(self: Any, epoch: int, positions: Any, messages: int) -> None:
        committed(self, epoch, positions, messages)
        if messages >= TARGET[0] and "end" not in WINDOW:
            WINDOW["end"] = cpu_sample(PIDS["kafka"], PIDS["redis"])

    ingest.TimedIngester.epoch_committed = sampled_commit  # type: ignore[method-assign]


def proc_ticks(pid: int | str, tid: int | None = None) -> tuple[str, int]:
    """(name, utime + stime ticks) of a process or one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    text = Path(path).read_text()
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, int(fields[11]) + int(fields[12])


def cpu_sample(broker: int, redis_pid: int) -> dict[str, float]:
    """CPU seconds so far: this process in all, each of its threads by name, the broker, redis-server."""
    sample: dict[str, float] = defaultdict(float)
    for task in Path("/proc/self/task").iterdir():
        try:
            name, ticks = proc_ticks("self", int(task.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        sample[f"  thread {name.split('#')[0] if name.startswith('rdk') else name}"] += ticks / CLOCK_TICKS
    sample["process (all threads)"] = proc_ticks("self")[1] / CLOCK_TICKS
    sample["broker"] = proc_ticks(broker)[1] / CLOCK_TICKS
    sample["redis-server"] = proc_ticks(redis_pid)[1] / CLOCK_TICKS
    return sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    install()
    with temporary_stack("mvlog-bench-") as (stack, _):
        pids = {s.name: s.pid for s in stack.status(check_health=False)}
        assert pids["kafka"] is not None and pids["redis"] is not None
        PIDS.update({"kafka": pids["kafka"], "redis": pids["redis"]})
        TARGET[0] = args.records
        settings = stack.settings(topic_prefix="bench", partitions=args.partitions)
        client = redis.Redis.from_url(settings.redis_url)
        warm = encoded(20_000)
        for topic in ("bench.warmup-plain", "bench.warmup-source"):
            ensure_topic(settings, topic, args.partitions)
            produce(stack.bootstrap_servers, topic, warm)
        run_baseline(stack.bootstrap_servers, "bench.warmup-plain", args.partitions, len(warm), 0)
        run_mvlog(settings, client, "warmup", "bench.warmup-source", len(warm), 0, None)
        records = encoded(args.records)
        totals: dict[tuple[str, str], Stage] = defaultdict(Stage)
        cpu: dict[str, float] = defaultdict(float)
        base_cpu: dict[str, float] = defaultdict(float)
        seconds, base_seconds = [], []
        for run in range(1, args.repeat + 1):
            for topic in (f"bench.plain-{run}", f"bench.source-{run}"):
                ensure_topic(settings, topic, args.partitions)
            wire = produce(stack.bootstrap_servers, f"bench.plain-{run}", records)
            produce(stack.bootstrap_servers, f"bench.source-{run}", records)
            before = cpu_sample(pids["kafka"], pids["redis"])
            base = run_baseline(stack.bootstrap_servers, f"bench.plain-{run}", args.partitions, len(records), wire)
            after = cpu_sample(pids["kafka"], pids["redis"])
            for name in ("process (all threads)", "broker", "redis-server"):
                base_cpu[name] += after[name] - before[name]
            base_seconds.append(base.seconds)
            STAGES.reset()
            ours = run_mvlog(settings, client, f"orders-{run}", f"bench.source-{run}", len(records), wire, None)
            before, after = WINDOW["start"], WINDOW["end"]
            seconds.append(ours.seconds)
            for name in set(before) | set(after):
                cpu[name] += after.get(name, 0.0) - before.get(name, 0.0)
            for key, stage in STAGES.stages.items():
                total = totals[key]
                total.wall += stage.wall
                total.cpu += stage.cpu
                total.self_wall += stage.self_wall
                total.self_cpu += stage.self_cpu
                total.calls += stage.calls
        load = os.getloadavg()
        client.close()
    n = args.repeat
    print(f"ingest stages: {args.records:,} upsert-json records, {args.partitions} partitions, mean of {n} runs")
    print(machine_info())
    print(f"  load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"  baseline runs (s): {' '.join(f'{s:.2f}' for s in base_seconds)}; "
          f"mvlog runs (s, to the last record's epoch committed): {' '.join(f'{s:.2f}' for s in seconds)}")
    print(f"\n  {'thread':7} {'stage':42} {'wall s':>7} {'cpu s':>7} {'self wall':>9} {'self cpu':>8} {'calls':>6}")
    for (role, name), stage in sorted(totals.items(), key=lambda kv: (kv[0][0] != "main", -kv[1].wall)):
        print(f"  {role:7} {name:42} {stage.wall / n:7.3f} {stage.cpu / n:7.3f} {stage.self_wall / n:9.3f} "
              f"{stage.self_cpu / n:8.3f} {stage.calls / n:6.0f}")
    print("\n  CPU seconds per run (from /proc), mvlog (run() start to the last record's epoch committed) / baseline:")
    for name in sorted(cpu, key=lambda k: (not k.startswith("process"), k.startswith("  "), k)):
        if abs(cpu[name]) >= 0.005 * n or name in base_cpu:
            extra = f"  / {base_cpu[name] / n:6.2f}" if name in base_cpu else ""
            print(f"    {name:40} {cpu[name] / n:6.2f}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
