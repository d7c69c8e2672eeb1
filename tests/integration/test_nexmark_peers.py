"""The Nexmark peer engines (Spark Structured Streaming, Quix Streams, Pathway, Flink SQL) on a few hundred
events: each engine's final result equals DuckDB's over the same events.

Opt-in: it needs the peers' venvs (``make bench-peers``, several GB and minutes on first use) and takes
minutes per engine, so it runs only with ``NEXMARK_TEST_PEERS`` set: ``NEXMARK_TEST_PEERS=1`` for every
engine, or a comma-separated subset (``NEXMARK_TEST_PEERS=quix,spark``). ``NEXMARK_TEST_QUERIES`` picks
queries (default q0,q1,q2,q3,q17,q20,q21,q22: all the peers run). (Not ``MVLOG_*`` variables:
tests/conftest.py clears those.)

The events come from a small seeded producer of this module (the shapes and key relations of Nexmark's:
persons, their auctions, bids on them; a few auctions name a seller that comes after them; two days of
event time), on the session's real Apache Kafka broker. Each engine runs each query twice, as
``bench/nexmark.py`` runs it: a catch-up over the filled topics, then a steady phase on fresh topics at a
paced rate with latencies taken from the Kafka timestamps; both outputs are checked against DuckDB by the
runner (:mod:`bench.nexmark_suite.peers.engine`), and the catch-up's final rows once more here.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.conftest import StackEndpoints

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.nexmark_suite.model import NexmarkTopics  # noqa: E402
from bench.nexmark_suite.peers.base import PeerJob, SteadyPhase, SteadyProduced  # noqa: E402
from bench.nexmark_suite.peers.measure import ensure_topic  # noqa: E402
from bench.nexmark_suite.peers.queries import QUERIES, multiset, normalize_row, oracle_rows  # noqa: E402

ALL_ENGINES = ("quix", "spark", "pathway", "flink")
_WANTED = os.environ.get("NEXMARK_TEST_PEERS", "")
ENGINES = ALL_ENGINES if _WANTED in ("1", "all") else tuple(e for e in _WANTED.split(",") if e)
QUERY_NAMES = tuple(os.environ.get("NEXMARK_TEST_QUERIES", "q0,q1,q2,q3,q17,q20,q21,q22").split(","))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3600),  # 8 queries x 2 runs per engine; a JVM engine's start takes 20-70 s when loaded
    pytest.mark.skipif(not ENGINES, reason="opt-in: set NEXMARK_TEST_PEERS=1 (or e.g. quix,spark); needs the peers' "
                                           "venvs (make bench-peers) and minutes per engine"),
]

DAY_MS = 86_400_000
BASE_MS = 1_700_000_000_000 - 3_600_000  # an hour before a day boundary: q17 sees two days


def nexmark_events(count: int, seed: int, base_ms: int, step_ms: float) -> list[tuple[str, dict[str, Any]]]:
    """``count`` events in Nexmark's mix (per 50: 1 person, 3 auctions, 46 bids; here denser in persons and
    auctions so a few hundred events join and group), ids from 1000, event time ``base_ms + n * step_ms``."""
    rng = random.Random(seed)
    states = ("AZ", "CA", "ID", "OR", "WA", "WY")
    events: list[tuple[str, dict[str, Any]]] = []
    persons = auctions = 0
    for n in range(count):
        now = int(base_ms + n * step_ms)
        kind = n % 10
        if kind == 0 or persons == 0:
            events.append(("person", {"id": 1000 + persons, "name": f"p{persons} {rng.choice('ABCDEF')}",
                                      "email_address": f"p{persons}@x.com", "credit_card": f"{rng.randrange(10**4)}",
                                      "city": rng.choice(("Boise", "Bend", "Kent")), "state": rng.choice(states),
                                      "date_time": now, "extra": "x" * rng.randrange(5)}))
            persons += 1
        elif kind in (1, 2) or auctions == 0:
            seller = 1000 + rng.randrange(persons + 2)  # now and then a person who comes later
            events.append(("auction", {"id": 1000 + auctions, "item_name": f"item{auctions}", "description": "d",
                                       "initial_bid": rng.randrange(1, 1000), "reserve": rng.randrange(1000, 5000),
                                       "date_time": now, "expires": now + 10_000, "seller": seller,
                                       "category": 10 + rng.randrange(3), "extra": ""}))
            auctions += 1
        else:
            auction = 1000 + rng.randrange(max(1, auctions))
            if rng.random() < 0.2:
                auction = 1107  # q2's filter: auction % 123 == 0 (it needs no such auction)
            channel = rng.choice(("Google", "Apple", "baidu", "channel-7", "channel-12"))
            url = rng.choice(("https://www.nexmark.com/abc/de/item.htm?query=1",
                              f"https://www.nexmark.com/x/{n % 7}/y/item.htm?query=1&channel_id={n % 13}",
                              f"http://n.com?channel_id={n % 5}&a=b", "https://x/y"))
            events.append(("bid", {"auction": auction, "bidder": 1000 + rng.randrange(persons),
                                   "price": round(10 ** (rng.random() * 7)), "channel": channel, "url": url,
                                   "date_time": now, "extra": f"e{n}"}))
    return events


def produce(bootstrap: str, topics: NexmarkTopics, events: list[tuple[str, dict[str, Any]]],
            rate: float = 0.0) -> list[float]:
    """Write ``events`` (paced at ``rate`` events/s when > 0); the wall-clock time of each produce call."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    times: list[float] = []
    start = time.time()
    for n, (table, row) in enumerate(events):
        if rate > 0:
            delay = start + n / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        key = row["id"] if table != "bid" else row["auction"]
        now = time.time()
        producer.produce(topics.topic_of(table), key=str(key).encode(), value=json.dumps(row).encode(),
                         timestamp=int(now * 1000))
        producer.poll(0)
        times.append(now)
    if producer.flush(30) != 0:
        raise RuntimeError("the test producer could not deliver every event")
    return times


def fresh_topics(bootstrap: str) -> NexmarkTopics:
    prefix = f"nx-{uuid.uuid4().hex[:8]}-"
    topics = NexmarkTopics.with_prefix(prefix)
    for topic in topics.all():
        ensure_topic(bootstrap, topic, topics.partitions)
    return topics


@pytest.fixture(scope="module")
def catch_up_events(stack: StackEndpoints) -> Iterator[tuple[NexmarkTopics, list[tuple[str, dict[str, Any]]]]]:
    events = nexmark_events(600, seed=20, base_ms=BASE_MS, step_ms=12_000)  # 600 events over two days
    topics = fresh_topics(stack.bootstrap_servers)
    produce(stack.bootstrap_servers, topics, events)
    yield topics, events


def steady_phase(bootstrap: str, rate: float, count: int, warmup: int) -> SteadyPhase:
    topics = fresh_topics(bootstrap)
    base_ms = int(time.time() * 1000)

    def run() -> SteadyProduced:
        events = nexmark_events(count, seed=21, base_ms=base_ms, step_ms=1000 / rate)
        return SteadyProduced(produce(bootstrap, topics, events, rate), base_ms, rate, warmup)

    return SteadyPhase(topics, rate, count, warmup, run)


def runner_of(name: str) -> Any:
    import importlib

    return importlib.import_module(f"bench.nexmark_suite.peers.{name}").RUNNER


@pytest.mark.parametrize("engine", ENGINES)
def test_peer_matches_duckdb(engine: str, stack: StackEndpoints, tmp_path: Path,
                             catch_up_events: tuple[NexmarkTopics, list[tuple[str, dict[str, Any]]]],
                             report: Callable[[str], None]) -> None:
    topics, events = catch_up_events
    runner = runner_of(engine)
    records: dict[str, list[dict[str, Any]]] = {"person": [], "auction": [], "bid": []}
    for table, row in events:
        records[table].append(row)
    failures = []
    for name in QUERY_NAMES:
        if runner.supports(name) is not None:
            report(f"{runner.name} {name}: not run ({runner.supports(name)})")
            continue
        query = QUERIES[name]
        expected = multiset(oracle_rows(query, records))
        assert expected, f"{name}: the workload gives DuckDB no rows; the check would prove nothing"
        job = PeerJob(query=name, sql="", bootstrap=stack.bootstrap_servers, topics=topics,
                      expected_events=len(events), work_dir=tmp_path / name, parallelism=2,
                      steady=steady_phase(stack.bootstrap_servers, rate=100.0, count=300, warmup=50),
                      timeout_s=240.0)
        result = runner.run(job)
        rows = multiset(normalize_row(query, row) for row in result.final_rows or [])
        report(f"{runner.name} {name} ({result.guarantee}): "
               f"{'-' if result.events_per_s is None else f'{result.events_per_s:,.0f}'} events/s catch-up of "
               f"{len(events)} events; latency p50/p99 {result.latency_p50_ms} / {result.latency_p99_ms} ms; "
               f"{result.details}; {result.note}")
        if rows != expected or result.events_per_s is None or "differs" in result.note:
            failures.append(f"{name}: {sum(rows.values())} rows, DuckDB {sum(expected.values())}; {result.note}")
        elif result.latency_p50_ms is None:
            failures.append(f"{name}: no latency sample in the steady phase ({result.details})")
    assert not failures, f"{runner.name}: " + " | ".join(failures)

