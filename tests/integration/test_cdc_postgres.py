"""A real CDC pipeline (issue 18): PostgreSQL -> Debezium (Kafka Connect) -> Kafka -> mvlog -> views.

PostgreSQL runs a seeded random workload (inserts, updates, primary key updates, deletes, multi-row
transactions, rolled-back ones, from two connections at once so transactions interleave in the WAL)
while Debezium's PostgreSQL connector streams the table into the test broker (JSON converter with
schemas), ``mvlog run-source`` ingests that topic into a ``debezium-json`` source table and ``mvlog
run-view`` maintains two views on it. Midway the Kafka Connect worker is SIGKILLed a while after its
last offset flush and restarted: Debezium sends again what came after that flush.

Once the writes stop and mvlog has caught up:

* the table equals PostgreSQL's table, and each view equals the same SQL run by PostgreSQL;
* at every committed epoch of the table, its changelog folded up to that epoch equals the fold of the
  topic's messages below the offsets that epoch committed, each change once (a change is identified by
  its key and LSN, so Debezium's redelivered copies count once): nothing lost, nothing doubled;
* the views pass the existing oracle (I1 at every committed epoch, DuckDB);
* the redelivery really happened (the topic holds changes twice) and mvlog skipped them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from mvlog.config import Settings
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key
from mvlog.schemas.codec import decode_row
from tests.cdc_fixtures import CdcPipeline
from tests.integration.test_source_tables import check_every_epoch, env_of, mvlog
from tests.oracle import check_oracle

pytestmark = pytest.mark.integration

_SCRIPT = Path(sys.executable).with_name("mvlog")
MVLOG = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "mvlog.services.cli"]

KEYS = 60
# The same SQL defines each view in mvlog and is run by PostgreSQL as the oracle: view -> (SQL, key).
VIEWS = {
    "by_grp": ("SELECT grp, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM items GROUP BY grp",
               ("grp",)),
    "positive": ("SELECT id, v, label FROM items WHERE v > 0", ("id",)),
}


# ---------------------------------------------------------------------------------------------- workload


def write_transactions(dsn: str, seed: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """Random transactions of 1-4 statements until ``stop``; one in ten rolled back. Lock waits and
    deadlocks with the other writer are part of the game: such a transaction is rolled back."""
    rng = random.Random(seed)
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            try:
                with conn.transaction() as tx:
                    for _ in range(rng.randint(1, 4)):
                        statement(conn, rng)
                    if rng.random() < 0.1:
                        raise psycopg.Rollback(tx)
                counts["committed"] = counts.get("committed", 0) + 1
            except psycopg.errors.Error:
                counts["failed"] = counts.get("failed", 0) + 1
            time.sleep(rng.uniform(0, 0.02))


def statement(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    k = rng.randrange(KEYS)
    roll = rng.random()
    v = None if rng.random() < 0.05 else rng.randrange(-50, 200)
    if roll < 0.45:
        conn.execute("INSERT INTO items (id, grp, v, label, ok) VALUES (%s, %s, %s, %s, %s) "
                     "ON CONFLICT (id) DO UPDATE SET v = excluded.v, label = excluded.label",
                     (k, rng.randrange(5), v, rng.choice(["a", "b", None]), rng.random() < 0.5))
    elif roll < 0.75:
        conn.execute("UPDATE items SET v = %s, ok = NOT ok WHERE id = %s", (v, k))
    elif roll < 0.8:
        conn.execute("UPDATE items SET grp = %s WHERE id BETWEEN %s AND %s", (rng.randrange(5), k, k + 5))
    elif roll < 0.85:  # a primary key update: Debezium sends a delete of the old key and a create of the new
        conn.execute("UPDATE items SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM items WHERE id = %s)",
                     (k + KEYS, k, k + KEYS))
    else:
        conn.execute("DELETE FROM items WHERE id = %s OR id = %s", (k, k + KEYS))


# ----------------------------------------------------------------------------------------------- oracles


def pg_rows(dsn: str, sql: str, key: tuple[str, ...]) -> dict[Key, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cursor = conn.execute(sql)
        names = [c.name for c in cursor.description or []]
        # sum(bigint) is numeric in PostgreSQL: an int here, as in mvlog.
        rows = [dict(zip(names, (int(x) if isinstance(x, Decimal) else x for x in row), strict=True))
                for row in cursor.fetchall()]
    return {tuple(row[k] for k in key): row for row in rows}


def mvlog_rows(client: redis.Redis, settings: Settings, name: str, key: tuple[str, ...],
               columns: list[str]) -> dict[Key, dict[str, Any]]:
    rows = (decode_row(raw) for _, raw in ViewStore(client, settings.topic_prefix).scan_rows(name))
    return {tuple(row[k] for k in key): {c: row[c] for c in columns} for row in rows}


class DebeziumTopic:
    """The topic as Debezium wrote it, read once by plain confluent-kafka and decoded here, independently
    of mvlog's decoder: per message, the (key, effect) it carries and its LSN."""

    def __init__(self, settings: Settings, name: str, partitions: int) -> None:
        self.name = name
        self.messages: dict[tuple[int, int], list[tuple[Key, int | None, dict[str, Any] | None]]] = {}
        consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"{name}.oracle",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        ends = {p: consumer.get_watermark_offsets(TopicPartition(name, p), 10)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(name, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while sum(1 for (p, o) in self.messages if o < ends[p]) < sum(ends.values()):
            assert time.monotonic() < deadline, "reading the Debezium topic took over 60 s"
            for message in consumer.consume(1000, 0.5):
                partition, offset = message.partition(), message.offset()
                if message.error() is None and partition is not None and offset is not None:
                    self.messages[(partition, offset)] = self.decode(message.value())
        consumer.close()

    @staticmethod
    def decode(value: bytes | None) -> list[tuple[Key, int | None, dict[str, Any] | None]]:
        if value is None:
            return []  # the tombstone after a delete
        event = json.loads(value)["payload"]  # the JSON converter's schema/payload wrapper
        lsn = event["source"]["lsn"] if event["op"] != "r" else None
        before, after = event["before"], event["after"]
        if event["op"] == "d":
            return [((before["id"],), lsn, None)]
        effects: list[tuple[Key, int | None, dict[str, Any] | None]] = []
        if before is not None and before["id"] != after["id"]:
            effects.append(((before["id"],), lsn, None))
        effects.append(((after["id"],), lsn, dict(after)))
        return effects

    def duplicates(self) -> int:
        seen: set[tuple[Key, int]] = set()
        doubled = 0
        for _, effects in sorted(self.messages.items()):
            for key, lsn, _ in effects:
                if lsn is not None:
                    doubled += (key, lsn) in seen
                    seen.add((key, lsn))
        return doubled

    def fold(self, below: dict[int, int] | None = None) -> dict[Key, dict[str, Any]]:
        """The table after the messages below ``below``, each change (key, LSN) once."""
        rows: dict[Key, dict[str, Any]] = {}
        applied: set[tuple[Key, int]] = set()
        for (partition, offset), effects in sorted(self.messages.items()):
            if below is not None and offset >= below.get(partition, 0):
                continue
            for key, lsn, row in effects:
                if lsn is not None:
                    if (key, lsn) in applied:
                        continue  # Debezium's redelivery of a change already folded
                    applied.add((key, lsn))
                if row is None:
                    rows.pop(key, None)
                else:
                    rows[key] = row
        return rows


def wait_until(condition: Callable[[], bool], what: str, timeout: float,
               processes: dict[str, subprocess.Popen[str]], describe: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for name, process in processes.items():
            assert process.poll() is None, f"{name} exited ({process.returncode}): {describe()}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}: {describe()}"
        time.sleep(0.5)


def wait_flushed_a_while_ago(pipeline: CdcPipeline, after: float, age: float = 1.5) -> float:
    """Wait until the worker's offsets file was last written at least ``age`` s ago, but was written after
    ``after`` (so the killed worker leaves ``age`` s or more of sent but unflushed changes to redeliver)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            written = pipeline.worker.offsets_file.stat().st_mtime
        except FileNotFoundError:
            written = 0.0
        if written > after and age <= time.time() - written < age + 1.0:
            return time.time() - written
        time.sleep(0.05)
    raise AssertionError("the Kafka Connect worker did not flush its offsets")


# ------------------------------------------------------------------------------------------------- test


def test_debezium_postgres_into_a_source_table_and_views(
        settings: Settings, redis_client: redis.Redis, postgres: Any, debezium: Callable[..., CdcPipeline],
        report: Callable[[str], None], tmp_path: Path) -> None:
    started = time.monotonic()
    seed = int(os.environ.get("MVLOG_TEST_SEED", "1818"))
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, v bigint, label text, ok boolean)")
        conn.execute("INSERT INTO items SELECT i, i % 5, i * 3, 'seed', true FROM generate_series(0, 19) i")
    topic = f"{settings.topic_prefix}.cdc.public.items"
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    created = mvlog(settings, "create-table", "items", "-c", "id:int", "-c", "grp:int", "-c", "v:int",
                    "-c", "label:string", "-c", "ok:boolean", "-k", "id", "--from-topic", topic,
                    "--format", "debezium-json")
    assert created.exit_code == 0, created.output
    for name, (sql, _) in VIEWS.items():
        view = mvlog(settings, "create-view", name, "AS", sql)
        assert view.exit_code == 0, view.output

    env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | env_of(settings)
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("run-source", "run-view")}
    processes = {
        "run-source": subprocess.Popen([*MVLOG, "run-source", "items"], env=env, stdout=subprocess.DEVNULL,
                                       stderr=logs["run-source"], text=True),
        "run-view": subprocess.Popen([*MVLOG, "run-view", *VIEWS], env=env, stdout=subprocess.DEVNULL,
                                     stderr=logs["run-view"], text=True),
    }
    # Offsets flushed every 2 s: the kill below falls between two flushes, with changes sent since.
    pipeline = debezium(["items"], schemas=True, flush_ms=2000)
    stop = threading.Event()
    counts: list[dict[str, int]] = [{}, {}]
    writers = [threading.Thread(target=write_transactions, args=(postgres.dsn, seed + i, stop, counts[i]),
                                daemon=True) for i in range(2)]
    try:
        writes_began = time.time()
        for writer in writers:
            writer.start()
        time.sleep(4)
        unflushed_s = wait_flushed_a_while_ago(pipeline, writes_began)
        pipeline.kill_worker()
        time.sleep(1)  # writes go on while no worker runs: the restarted one reads them from the slot
        pipeline.start_worker()
        time.sleep(5)
    finally:
        stop.set()
        for writer in writers:
            writer.join(30)
    wrote_s = time.time() - writes_began

    table_sql, key = "SELECT id, grp, v, label, ok FROM items", ("id",)
    columns = ["id", "grp", "v", "label", "ok"]

    store = ViewStore(redis_client, settings.topic_prefix)

    def caught_up() -> bool:
        """The table equals PostgreSQL's (it goes on cutting empty epochs: a source table never idles)."""
        return mvlog_rows(redis_client, settings, "items", key, columns) == pg_rows(postgres.dsn, table_sql, key)

    def differences() -> str:
        mine, theirs = (mvlog_rows(redis_client, settings, "items", key, columns),
                        pg_rows(postgres.dsn, table_sql, key))
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        logs_text = {name: (tmp_path / f"{name}.log").read_text()[-1500:] for name in processes}
        return (f"{len(differ)} keys differ, e.g. {[(k, mine.get(k), theirs.get(k)) for k in differ[:3]]}; "
                f"MCEs {({n: store.mce(n) for n in ['items', *VIEWS]})}; logs: {logs_text}")

    # Returns as soon as the rows agree; 180 s, not 60: on a loaded CI machine Debezium's last deletes once
    # reached the topic after the 60 s (session 21: three keys PostgreSQL had deleted, still in the table).
    wait_until(caught_up, "mvlog to catch up with PostgreSQL", 180, processes, differences)
    # The ingester stops first, then the views follow the table to its last epoch: the oracle then sees
    # one view epoch per table epoch.
    processes["run-source"].terminate()
    assert processes["run-source"].wait(30) == 0
    last = store.mce("items") or 0
    running = {"run-view": processes["run-view"]}
    wait_until(lambda: all((store.mce(name) or 0) >= last for name in VIEWS), "the views to reach the table's last "
               "epoch", 180, running, differences)
    for name, (sql, view_key) in VIEWS.items():
        expected = pg_rows(postgres.dsn, sql, view_key)
        view_columns = list(next(iter(expected.values())).keys())
        assert mvlog_rows(redis_client, settings, name, view_key, view_columns) == expected, \
            f"view {name} differs from PostgreSQL's {sql}"
    for name, process in processes.items():
        if process.poll() is None:
            process.terminate()
        process.wait(30)
        logs[name].close()

    source = DebeziumTopic(settings, topic, 3)
    doubled = source.duplicates()
    assert source.fold() == pg_rows(postgres.dsn, table_sql, key)
    epochs = check_every_epoch(settings, "items", key, source)  # type: ignore[arg-type]
    checked = check_oracle(settings, redis_client, ["items", *VIEWS])
    assert doubled > 0, (f"Debezium redelivered nothing after the kill ({unflushed_s:.1f} s after its last "
                         "offset flush): the test did not test what it should")
    committed = sum(c.get("committed", 0) for c in counts)
    report(f"{committed} PostgreSQL transactions in {wrote_s:.0f} s, {len(source.messages)} Debezium messages, "
           f"{doubled} changes redelivered after the Connect worker's SIGKILL (applied once), {epochs} table "
           f"epochs and {checked} (view, epoch) pairs checked, {time.monotonic() - started:.0f} s in all")
