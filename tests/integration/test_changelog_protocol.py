"""The changelog protocol against the real broker (Apache Kafka) and a real redis-server."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from mvlog.changes import apply_changes
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.topics import ensure_topic
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key, Row
from mvlog.services.tables.writer import RowValidationError, Table

from .independent_consumer import check_whole_epochs, read_topic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean"}


def _fold(logs, epochs: set[int]) -> dict[Key, Row]:  # type: ignore[no-untyped-def]
    """The table's rows from an independent read: the last after-image of each key."""
    events = sorted(((e, p, o, c) for p, log in logs.items() for e, cs in log.changes.items() for o, c in cs
                     if e in epochs),
                    key=lambda t: (t[0], t[1], t[2]))
    rows: dict[Key, Row] = {}
    for _, _, _, change in events:
        key = tuple(change["key"].values())
        if change["after"] is None:
            rows.pop(key, None)
        else:
            rows[key] = change["after"]
    return rows


def test_independent_consumer_sees_whole_epochs_and_one_barrier_per_partition(settings: Settings,
                                                                             redis_client: redis.Redis) -> None:
    stop = threading.Event()
    expected: dict[Key, Row] = {}

    with Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client) as table:
        def workload() -> None:
            rng = random.Random(7)
            while not stop.is_set():
                for _ in range(200):
                    key = rng.randrange(500)
                    if rng.random() < 0.2:
                        table.delete([key])
                        expected.pop((key,), None)
                    else:
                        row = {"id": key, "v1": rng.randrange(100), "deleted": rng.random() < 0.5}
                        table.upsert([row])
                        expected[(key,)] = row
                stop.wait(0.01)

        writer = threading.Thread(target=workload)
        writer.start()
        # Read while the writer is writing, once it has committed three epochs (and goes on):
        # read_committed must never expose part of an epoch.
        index = ViewStore(redis_client, settings.topic_prefix).index
        deadline = time.monotonic() + 60
        while len(index.between("t1", 0, 0, 1 << 62)) < 3:
            assert time.monotonic() < deadline and writer.is_alive(), "the writer committed no three epochs"
            time.sleep(0.05)
        during = read_topic(settings.bootstrap_servers, settings.changelog_topic("t1"), settings.partitions,
                            idle=0.5, max_seconds=10.0)
        assert len(check_whole_epochs(during)) >= 2  # the chain rule confirms all but the last one read
        stop.set()
        writer.join()
    # The background loop may commit one more (empty) epoch before close(): the MCE is the last one.
    store = ViewStore(redis_client, settings.topic_prefix)
    last_epoch = store.mce("t1")
    assert last_epoch is not None

    logs = read_topic(settings.bootstrap_servers, settings.changelog_topic("t1"), settings.partitions)
    epochs = check_whole_epochs(logs)
    # The last epoch is confirmed by the index until its successor's barrier names it.
    assert last_epoch not in epochs and last_epoch > max(epochs)
    assert len(epochs) >= 3
    assert _fold(logs, epochs | {last_epoch}) == expected
    assert store.row_count("t1") == len(expected)


def test_writer_killed_mid_epoch_leaves_no_partial_epoch(settings: Settings, redis_client: redis.Redis) -> None:
    topic = settings.changelog_topic("k")
    ensure_topic(settings, topic, settings.partitions)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random()
    killed: list[int] = []
    committed: set[int] = set()
    last = 0
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-m", "tests.integration.processes.epoch_writer",
                                  settings.model_dump_json(), "k", "20000", str(last),
                                  str(max(committed, default=0))],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        assert child.stdout is not None
        begun = 0
        for line in child.stdout:
            word, epoch = line.split()
            if word == "done":
                committed.add(int(epoch))
            elif (begun := begun + 1) == 2:  # kill somewhere inside the second epoch
                threading.Event().wait(rng.uniform(0.0, 0.08))
                child.send_signal(signal.SIGKILL)
                killed.append(int(epoch))
                break
        for line in child.stdout:  # lines printed before the kill landed
            word, epoch = line.split()
            if word == "done":
                committed.add(int(epoch))
        child.wait()
        last = max(committed | set(killed))

    logs = read_topic(settings.bootstrap_servers, topic, settings.partitions)
    visible = check_whole_epochs(logs)
    # Every epoch the writer reported committed is there (the very last only once a successor names it);
    # a killed epoch counts only if it had committed.
    assert committed - {max(committed)} <= visible
    assert visible <= committed | set(killed)
    assert any(e not in visible for e in killed), "no kill landed inside an epoch"
    epochs_in_order = sorted(visible)
    assert epochs_in_order == sorted(set(epochs_in_order))


def test_restarted_table_writer_continues_above_the_last_epoch(settings: Settings,
                                                                redis_client: redis.Redis) -> None:
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    table.upsert([{"id": i, "v1": i, "deleted": False} for i in range(10)])
    first = table.flush()
    # A second writer fences the first (same transactional id) and starts above its epochs.
    reopened = Table.open(settings, "t1", client=redis_client, auto_commit=False)
    with pytest.raises(Exception, match="fenced"):
        table.upsert([{"id": 99, "v1": 1, "deleted": False}])
        table.flush()
    reopened.delete([0])
    second = reopened.flush()
    assert second > first
    reopened.close()
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.row_count("t1") == 9


def test_redis_is_rolled_forward_from_the_changelog(settings: Settings, redis_client: redis.Redis) -> None:
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    table.upsert([{"id": i, "v1": i, "deleted": False} for i in range(20)])
    table.flush()
    table.delete([1, 2])
    last = table.flush()
    table.close()
    store = ViewStore(redis_client, settings.topic_prefix)
    # Lose Redis' copy of the table (as if the writer died between the Kafka and the Redis commit).
    redis_client.delete(f"{settings.topic_prefix}:{{t1}}:rows", f"{settings.topic_prefix}:{{t1}}:meta")
    reopened = Table.open(settings, "t1", client=redis_client, auto_commit=False)
    assert store.mce("t1") == last
    assert store.row_count("t1") == 18
    assert reopened.flush() > last
    reopened.close()


def test_seeking_by_epoch_lands_on_the_first_change_of_that_epoch(settings: Settings,
                                                                  redis_client: redis.Redis) -> None:
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    epochs = []
    for round_ in range(5):
        table.upsert([{"id": i, "v1": round_, "deleted": False} for i in range(round_ * 10, round_ * 10 + 30)])
        epochs.append(table.flush())
    table.close()
    store = ViewStore(redis_client, settings.topic_prefix)
    full: dict[int, list] = {}
    with ChangelogReader(settings, "t1", ["id"], settings.partitions, store.index) as reader:
        for epoch in reader.epochs(idle_timeout=2):
            full[epoch.epoch] = epoch.changes
    target = epochs[2]
    with ChangelogReader(settings, "t1", ["id"], settings.partitions, store.index,
                         after_epoch=epochs[1], upto_epoch=epochs[3]) as reader:
        got = list(reader.epochs(idle_timeout=5))
    assert [e.epoch for e in got] == [target, epochs[3]]
    assert got[0].changes == full[target]
    # The reader started right after the previous epoch's barrier: its first record is target's first change.
    for partition in range(settings.partitions):
        previous = store.index.at("t1", partition, epochs[1])
        assert previous is not None
        assert store.index.before("t1", partition, target) == previous
    folded = apply_changes({}, [c for e in sorted(full) for c in full[e]])
    assert len(folded) == store.row_count("t1")


def test_bad_rows_are_refused_with_row_field_and_problem_and_the_rest_is_kept(
        settings: Settings, redis_client: redis.Redis) -> None:
    table = Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    with pytest.raises(RowValidationError) as info:
        table.upsert([{"id": 1, "v1": 1, "deleted": False},
                      {"id": 2, "v1": "two", "deleted": False},
                      {"id": None, "v1": 3},
                      {"id": 4, "v1": 4, "deleted": False, "color": "red"},
                      {"id": 5, "v1": 5.5, "deleted": False}])
    message = str(info.value)
    assert "row 1: field 'v1': expected int, got str 'two'" in message
    assert "row 2: field 'id': primary key column is missing or null" in message
    assert "row 3: field 'color': unknown column" in message
    assert "row 4: field 'v1': expected int, got float 5.5" in message
    assert info.value.accepted == 1
    with pytest.raises(RowValidationError, match="row 0: field 'id': expected int, got str 'x'"):
        table.delete(["x"])
    table.flush()
    table.close()
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.row_count("t1") == 1
