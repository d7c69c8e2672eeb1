"""Nexmark: mvlog and the peer engines on the same topics, same broker, same run.

A local stack (Apache Kafka + redis-server, free loopback ports, a temporary folder) is started; the
generator (bench/nexmark_suite/generator.py, a port of the reference Nexmark generator) writes
``--events`` events into ``nexmark-person``, ``nexmark-auction`` and ``nexmark-bid`` before any clock
starts. Then, per query and engine:

* **events/s (catch-up)**: the engine reads the filled topics from the beginning; all ``--events`` events
  (persons + auctions + bids, whichever the query reads) divided by the time from the start of ingestion
  to the last event's effect committed in the output. mvlog: ``mvlog run-source`` processes for the
  query's tables (their start counts) and the view's Spark consumer, until the view's MCE covers the
  tables' last epochs (bench/nexmark_suite/mvlog_runner.py). Peers: as their runner's note says.
* **latency (steady)**: on empty topics of the run's own, ``--steady-events`` events paced at
  ``--steady-rate`` events/s; per event (after ``--warmup-events``), from its produce call to its effect
  committed in the output; nearest-rank p50 / p99.

``mvlog-tasks`` (in ``--engines``) runs mvlog again with its views' operators in Spark's tasks
(``MVLOG_OPERATORS_IN_TASKS``, the other settings the product's defaults), and compares its rates and rows
with mvlog's and the peers'.

Which queries mvlog runs is whatever its planner accepts (the others are listed with the planner's
refusal); each peer says which it runs. Every peer's final output is compared with mvlog's.

Run from the repository root (``make bench-peers`` prepares the peers' venvs and jars)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/nexmark.py [--events 200000] [--queries all]
        [--engines mvlog,mvlog-tasks,spark,quix,pathway,flink] [--steady-rate 2000] [--steady-events 10000]
        [--warmup-events 2000] [--partitions 1] [--barrier-ms 1000] [--master local[2]] [--seed 0]

Output: the machine, the query x engine table (events/s, latency p50/p99 ms), the result checks, mvlog's
events/s over each peer's per query and as a geometric mean, and as the LAST number, mvlog over the better
of Spark Structured Streaming and Quix Streams (per query the faster of the two; geometric mean over the
queries mvlog and both of them ran).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import re
import signal
import sys
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from _common import fmt_rate, machine_info, temporary_stack  # noqa: E402

from bench.nexmark_suite.generator import GeneratorConfig  # noqa: E402
from bench.nexmark_suite.model import NexmarkTopics  # noqa: E402
from bench.nexmark_suite.mvlog_tables import Planned, plan_queries  # noqa: E402
from bench.nexmark_suite.peer import PeerJob, PeerResult, PeerRunner  # noqa: E402
from bench.nexmark_suite.producer import produce, steady_phase  # noqa: E402
from bench.nexmark_suite.queries import query_ids  # noqa: E402

MVLOG = "mvlog"
# mvlog with its views' operators in Spark's tasks (MVLOG_OPERATORS_IN_TASKS; docs/scaling.md), the
# product's other defaults kept: an epoch under MVLOG_TASKS_MIN_RECORDS changes still goes the driver's way.
MVLOG_TASKS = "mvlog-tasks"
MVLOG_ENGINES = (MVLOG, MVLOG_TASKS)
# engine key -> module under bench/nexmark_suite/peers exposing RUNNER
PEER_MODULES = {"spark": "spark", "quix": "quix", "pathway": "pathway", "flink": "flink"}
SHORT = {"mvlog": "mvlog", "mvlog-tasks": "mvlog in tasks", "spark": "Spark SS", "quix": "Quix", "pathway": "Pathway",
         "flink": "Flink SQL"}


@dataclass
class Cell:
    """One query on one engine."""

    events_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    rows: list[dict[str, Any]] | None = None
    note: str = ""  # why it did not run, or what to know
    guarantee: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        if self.events_per_s is None:
            return "-"
        lat = (f" {self.p50_ms:.0f}/{self.p99_ms:.0f}" if self.p50_ms is not None and self.p99_ms is not None
               else " -/-")
        return f"{fmt_rate(self.events_per_s)}{lat}"


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def normalized(rows: list[dict[str, Any]], columns: Sequence[str]) -> Counter[tuple[Any, ...]]:
    """Rows as a multiset of tuples over ``columns``: floats to 6 significant digits, ints as ints."""
    def value(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, int):
            return v
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        if f == int(f) and abs(f) < 2**53:
            return int(f)
        return float(f"{f:.6g}")
    return Counter(tuple(value(row.get(c)) for c in columns) for row in rows)


def compare_rows(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> str:
    """'same (N rows)' or what differs, over the columns both have."""
    columns = sorted(set().union(*(r.keys() for r in mine[:1])) & set().union(*(r.keys() for r in theirs[:1]))) \
        if mine and theirs else []
    if not mine and not theirs:
        return "same (0 rows)"
    if not columns:
        return f"differs: {len(mine)} row(s) in mvlog, {len(theirs)} in the peer, no column in common"
    a, b = normalized(mine, columns), normalized(theirs, columns)
    if a == b:
        return f"same ({sum(a.values()):,} rows)"
    missing, extra = a - b, b - a
    return (f"differs: {sum(missing.values())} of mvlog's {sum(a.values())} row(s) missing in the peer, "
            f"{sum(extra.values())} extra (columns {', '.join(columns)})")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower())


def load_peers(names: Sequence[str]) -> dict[str, PeerRunner | str]:
    """engine key -> its RUNNER, or why it could not be loaded."""
    out: dict[str, PeerRunner | str] = {}
    for name in names:
        try:
            module = importlib.import_module(f"bench.nexmark_suite.peers.{PEER_MODULES[name]}")
            out[name] = module.RUNNER
        except Exception as error:  # a peer that is not there is a row of the table, not a crash
            out[name] = f"runner not loaded: {type(error).__name__}: {error}"
    return out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events in the catch-up topics (default 200000)")
    parser.add_argument("--queries", default="all", help="e.g. q0,q1,q3 or q0-q5 (default all)")
    parser.add_argument("--engines", default="mvlog,spark,quix,pathway,flink",
                        help="engines to run (default mvlog,spark,quix,pathway,flink)")
    parser.add_argument("--steady-rate", type=float, default=2000, help="events/s of the latency phase (default 2000)")
    parser.add_argument("--steady-events", type=int, default=10_000, help="events of the latency phase (default 10000)")
    parser.add_argument("--warmup-events", type=int, default=2000,
                        help="first events of the latency phase not counted (default 2000)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of each catch-up topic (default 1)")
    parser.add_argument("--mvlog-partitions", type=int, default=2, help="partitions of mvlog's changelogs (default 2)")
    parser.add_argument("--barrier-ms", type=int, default=1000, help="mvlog's barrier interval (default 1000)")
    parser.add_argument("--master", default="local[2]", help="Spark master of mvlog's consumers (default local[2])")
    parser.add_argument("--parallelism", type=int, default=2, help="peers' parallelism (default 2, the cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900, help="per run, seconds (default 900)")
    parser.add_argument("--no-steady", action="store_true", help="skip the latency phase")
    args = parser.parse_args(argv)
    try:
        ids = query_ids(args.queries)
    except ValueError as error:
        parser.error(str(error))
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in MVLOG_ENGINES and e not in PEER_MODULES]
    if unknown:
        parser.error(f"unknown engine(s) {unknown}; known: {', '.join(MVLOG_ENGINES)}, {', '.join(PEER_MODULES)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    planned = {p.query.id: p for p in plan_queries(ids)}
    peers = load_peers([e for e in engines if e not in MVLOG_ENGINES])
    cells: dict[str, dict[str, Cell]] = {q: {} for q in ids}
    produced_note = ""
    signal.signal(signal.SIGTERM, _interrupt)
    with temporary_stack("mvlog-nexmark-") as (stack, tmp):
        try:
            bootstrap = stack.bootstrap_servers
            topics = NexmarkTopics(partitions=args.partitions)
            stats = produce(bootstrap, topics, GeneratorConfig(seed=args.seed, events=args.events))
            counts = stats.counts
            produced_note = (f"{stats.events:,} events ({counts['person']:,} persons, {counts['auction']:,} "
                             f"auctions, {counts['bid']:,} bids; {stats.wire_bytes / 1e6:.1f} MB of JSON) written "
                             f"in {stats.seconds:.1f} s before the clocks, {args.partitions} partition(s) per topic")
            print(produced_note, flush=True)

            for engine in (e for e in MVLOG_ENGINES if e in engines):
                run_mvlog(engine, args, stack, tmp, ids, planned, topics, stats, cells)

            for engine, peer in peers.items():
                for qid in ids:
                    if isinstance(peer, str):
                        cells[qid][engine] = Cell(note=peer)
                        continue
                    reason = peer.supports(qid)
                    if reason is not None:
                        cells[qid][engine] = Cell(note=f"not run: {reason}", guarantee=peer.guarantee)
                        continue
                    phase = None if args.no_steady else steady_phase(
                        bootstrap, NexmarkTopics.with_prefix(f"nexmark-steady-{engine}-{qid}-"), args.steady_rate,
                        args.steady_events, args.warmup_events, seed=args.seed + 1)
                    work = tmp / "peers" / engine / qid
                    work.mkdir(parents=True, exist_ok=True)
                    job = PeerJob(qid, planned[qid].query.sql, bootstrap, topics, stats.events, work,
                                  parallelism=args.parallelism, steady=phase, timeout_s=args.timeout)
                    try:
                        res: PeerResult = peer.run(job)
                        cells[qid][engine] = Cell(res.events_per_s, res.latency_p50_ms, res.latency_p99_ms,
                                                  res.final_rows, res.note, res.guarantee, dict(res.details))
                    except Exception as error:
                        cells[qid][engine] = Cell(note=f"failed: {type(error).__name__}: {str(error)[:300]}",
                                                  guarantee=peer.guarantee)
                        traceback.print_exc()
                    print(f"  {engine} {qid}: {cells[qid][engine].text()} {cells[qid][engine].note[:200]}", flush=True)
                    if cells[qid][engine].details:  # e.g. Flink's READY -> first checkpoint (its deployment)
                        print(f"  {engine} {qid} details: {cells[qid][engine].details}", flush=True)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the table of what ran so far is still worth printing
            print("interrupted: the table below holds the runs finished so far", flush=True)

    report(args, engines, peers, planned, cells, produced_note)
    return 0


def run_mvlog(engine: str, args: argparse.Namespace, stack: Any, tmp: Path, ids: Sequence[str],
              planned: dict[str, Planned], topics: NexmarkTopics, stats: Any,
              cells: dict[str, dict[str, Cell]]) -> None:
    """Each query on mvlog (``engine``: :data:`MVLOG`, or :data:`MVLOG_TASKS` with the operators in Spark's
    tasks), in a Spark session of its own: a catch-up of the filled topics, then the steady phase."""
    from bench.nexmark_suite.mvlog_runner import MvlogNexmark
    from mvlog.services.spark.session import spark_session

    in_tasks = engine == MVLOG_TASKS
    bootstrap = stack.bootstrap_servers

    def settings_for(prefix: str) -> Any:
        return stack.settings(topic_prefix=prefix, partitions=args.mvlog_partitions, spark_master=args.master,
                              barrier_interval_ms=args.barrier_ms, operators_in_tasks=in_tasks)

    tag = "t" if in_tasks else ""
    spark = spark_session(settings_for(f"nxsession{tag}"), app_name=f"{engine}-nexmark")
    try:
        runner = MvlogNexmark(settings_for, spark, tmp / engine, timeout_s=args.timeout)
        runnable = [planned[q] for q in ids if planned[q].runnable]
        if runnable:  # warm-up, untimed: the Spark session's first reads, the data source, Python workers
            warm = NexmarkTopics.with_prefix(f"nexmark-warmup{tag}-")
            produce(bootstrap, warm, GeneratorConfig(seed=args.seed, events=1000))
            runner.catch_up(f"nxwarm{tag}", runnable[0], warm)
        for qid in ids:
            p: Planned = planned[qid]
            cell = cells[qid].setdefault(engine, Cell(guarantee="exactly-once"))
            if not p.runnable:
                cell.note = f"not planned: {p.refusal}"
                continue
            try:
                result = runner.catch_up(f"nx{qid}{tag}c", p, topics)
                # Like the peers' runners: the engine's start-up (here the run-source processes' start, until
                # each consumes) is left out of the time; the figure with it is in the note.
                startup = result.startup_seconds or 0.0
                cell.events_per_s = stats.events / (result.seconds - startup)
                cell.note = (f"{stats.events / result.seconds:,.0f} events/s with the ingesters' start-up "
                             f"({startup:.1f} s) counted")
                if in_tasks:
                    cell.note += (f"; {result.task_epochs} partition epochs written by Spark's tasks"
                                  if result.task_epochs else "; its operator ran on the driver (not a shape the tasks "
                                  "run, or every epoch under MVLOG_TASKS_MIN_RECORDS)")
                cell.rows = result.rows
                cell.details.update(seconds=result.seconds, epochs=result.epochs,
                                    ingest_seconds=result.ingest_seconds,
                                    first_epoch_seconds=result.first_epoch_seconds)
                first = (f"{result.first_epoch_seconds:.1f} s" if result.first_epoch_seconds is not None
                         else "never")
                print(f"  {engine} {qid} catch-up: {result.seconds:.1f} s ({result.epochs} view epochs; ingesters "
                      f"consuming after {startup:.1f} s, done after {result.ingest_seconds:.1f} s, the view's "
                      f"first commit after {first})", flush=True)
                if not args.no_steady:
                    mine = steady_phase(bootstrap, NexmarkTopics.with_prefix(f"nexmark-steady-{engine}-{qid}-"),
                                        args.steady_rate, args.steady_events, args.warmup_events,
                                        seed=args.seed + 1)
                    steady = runner.steady(f"nx{qid}{tag}s", p, mine)
                    cell.p50_ms, cell.p99_ms = steady.p50_ms, steady.p99_ms
                    if steady.uncovered:
                        cell.note += f"; {steady.uncovered} steady event(s) never reached the view"
            except Exception as error:
                cell.note = f"failed: {type(error).__name__}: {str(error)[:300]}"
                traceback.print_exc()
            print(f"  {engine} {qid}: {cell.text()} {cell.note}", flush=True)
    finally:
        spark.stop()


def report(args: argparse.Namespace, engines: Sequence[str], peers: dict[str, PeerRunner | str],
           planned: dict[str, Planned], cells: dict[str, dict[str, Cell]], produced_note: str) -> None:
    print()
    print("Nexmark benchmark: mvlog and peers on the same topics, one local Apache Kafka broker on loopback")
    print(machine_info() + f"; mvlog's Spark master {args.master}, peers' parallelism {args.parallelism}")
    print(f"  {produced_note}")
    print(f"  catch-up: events/s = all {args.events:,} events / (start of ingestion -> last event's effect committed), "
          "engine start-up left out (mvlog: from when its last run-source process consumes; the figure with it in "
          "the notes), after an untimed warm-up run of 1,000 events (same Spark session); a join to the last "
          "epoch of all its tables")
    if args.no_steady:
        print("  latency: not measured (--no-steady)")
    else:
        print(f"  latency: {args.steady_events:,} events at {args.steady_rate:,.0f} events/s, the first "
              f"{args.warmup_events:,} not counted; produce call -> effect committed in the output, p50/p99 ms")
    print(f"  mvlog: exactly-once (source offsets and view epochs in Kafka transactions), barrier interval "
          f"{args.barrier_ms} ms, {args.mvlog_partitions} changelog partition(s)")
    for engine, peer in peers.items():
        if not isinstance(peer, str):
            print(f"  {SHORT[engine]}: {peer.guarantee}")
    print()
    width = 22
    header = f"{'query':<6}" + "".join(f"{SHORT[e]:>{width}}" for e in engines)
    print("events/s, latency p50/p99 ms:")
    print(header)
    for qid, row in cells.items():
        print(f"{qid:<6}" + "".join(f"{row.get(e, Cell()).text():>{width}}" for e in engines))
    print()
    print("not run / notes:")
    for qid, row in cells.items():
        for engine in engines:
            cell = row.get(engine)
            if cell is not None and cell.note:
                print(f"  {qid} {SHORT[engine]}: {cell.note}")
    print()
    print("results (final output of each peer against mvlog's):")
    for qid, row in cells.items():
        mine = row.get(MVLOG)
        for engine in engines:
            cell = row.get(engine)
            if engine == MVLOG or cell is None or cell.events_per_s is None:
                continue
            if mine is None or mine.rows is None:
                verdict = "mvlog did not run it"
            elif cell.rows is None:
                verdict = "the peer reported no rows"
            else:
                verdict = compare_rows(mine.rows, cell.rows)
            print(f"  {qid} {SHORT[engine]}: {verdict}")
    for mine_engine in (e for e in MVLOG_ENGINES if e in engines):
        print()
        print(f"{SHORT[mine_engine]} events/s over each other engine's:")
        for engine in (e for e in engines if e != mine_engine and not (mine_engine == MVLOG and e == MVLOG_TASKS)):
            ratios = []
            for qid, row in cells.items():
                mvlog_rate = row[mine_engine].events_per_s if mine_engine in row else None
                peer_rate = row[engine].events_per_s if engine in row else None
                if mvlog_rate and peer_rate:
                    ratios.append((qid, mvlog_rate / peer_rate))
            if not ratios:
                print(f"  {SHORT[engine]}: no query both ran")
                continue
            per = ", ".join(f"{qid} {r:.2f}x" for qid, r in ratios)
            print(f"  {SHORT[engine]}: {per}; geometric mean {geomean([r for _, r in ratios]):.2f}x "
                  f"over {len(ratios)} quer{'y' if len(ratios) == 1 else 'ies'}")
    best = []
    for row in cells.values():
        mine = row.get(MVLOG)
        spark_cell, quix_cell = row.get("spark"), row.get("quix")
        if (mine and mine.events_per_s and spark_cell and spark_cell.events_per_s and quix_cell
                and quix_cell.events_per_s):
            best.append(mine.events_per_s / max(spark_cell.events_per_s, quix_cell.events_per_s))
    if best:
        print(f"mvlog over the better of Spark Structured Streaming and Quix Streams (geometric mean over "
              f"{len(best)} quer{'y' if len(best) == 1 else 'ies'} all three ran): {geomean(best):.2f}x")
    else:
        print("mvlog over the better of Spark Structured Streaming and Quix Streams: n/a "
              "(no query ran on mvlog, Spark and Quix)")


if __name__ == "__main__":
    raise SystemExit(main())
