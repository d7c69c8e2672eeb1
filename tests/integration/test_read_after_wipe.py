"""Reads after a Redis wipe with no writer or consumer running (issue 21): ``mvlog read``, ``views`` and
``status`` rebuild the control plane from Kafka themselves (whichever process comes first) instead of
showing empty views with "no committed epoch yet".

What comes back is the rebuild's (README, Reliability): every epoch proven committed. A changelog's last
epoch is proven by a later barrier, the index, its live writer or a view built on it; with nobody
running, a view's last epoch has no such proof, so the view reads as of the epoch before it until its
consumer runs again (the consumer redoes that epoch). The table's last epoch is proven by the view."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.control_plane import rebuild_lock_name
from mvlog.services.pipeline.view_consumer import ViewConsumer
from tests.integration.test_cli_views import T1, env_of, lines, mvlog, ok, read_json
from tests.integration.test_durable_stack import MVLOG

pytestmark = pytest.mark.integration


def test_read_views_and_status_rebuild_a_wiped_redis_from_kafka(
        make_settings: Callable[..., Settings], own_redis: str, spark: Any) -> None:
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    ok(mvlog(settings, *T1))
    consumer = ViewConsumer
    epochs = [int(ok(mvlog(settings, "insert", "t1", input=lines(*({"id": i, "v1": i, "deleted": i % 4 == 0}
                                                                  for i in range(1, 31))))).stdout)]
    ok(mvlog(settings, "create-view", "mv1", "AS", "SELECT * FROM t1 WHERE deleted = false"))
    seen: dict[int | None, Any] = {}  # mv1 as read at each of its epochs

    def catch_up() -> None:
        view = consumer(settings, "mv1", spark=spark, client=client)
        try:
            assert view.catch_up() == epochs[-1]
        finally:
            view.committer.writer.close()
        found = read_json(settings, "mv1")
        seen[found["epoch"]] = found

    catch_up()
    epochs.append(int(ok(mvlog(settings, "insert", "t1", "--delete", input=lines(5, 6))).stdout))
    catch_up()
    epochs.append(int(ok(mvlog(settings, "insert", "t1", input=lines({"id": 40, "v1": 4, "deleted": False}))).stdout))
    catch_up()
    table = read_json(settings, "t1")
    assert sorted(e for e in seen if e is not None) == epochs

    client.flushall()  # nobody is running: no writer or consumer will notice
    result = ok(mvlog(settings, "read", "mv1", "--output", "json"))
    assert "rebuilt 2 table(s) and view(s) from Kafka" in result.stderr, result.stderr
    rebuilt = json.loads(result.stdout)
    assert rebuilt["epoch"] in epochs[-2:], (rebuilt["epoch"], epochs)  # at most its unproven last epoch back
    assert rebuilt["rows"] and rebuilt == {**seen[rebuilt["epoch"]], "state": rebuilt["state"]}
    assert read_json(settings, "t1") == table  # its last epoch is proven by mv1, built on it
    listing = {v["name"]: v for v in json.loads(ok(mvlog(settings, "views", "-o", "json")).stdout)}
    assert listing["t1"]["mce"] == epochs[-1] and listing["mv1"]["mce"] == rebuilt["epoch"]

    client.flushall()  # status is the first to look this time
    status = ok(mvlog(settings, "status", "-o", "json"))
    assert "rebuilt 2 table(s) and view(s)" in status.stderr, status.stderr
    assert read_json(settings, "t1") == table
    catch_up()  # the consumer redoes what the rebuild could not prove: mv1 is whole again
    assert read_json(settings, "mv1")["epoch"] == epochs[-1]
    assert ViewStore(client, settings.topic_prefix).mce("mv1") == epochs[-1]


def test_a_read_during_a_rebuild_says_so_and_waits_for_it(
        make_settings: Callable[..., Settings], own_redis: str) -> None:
    """Another process holds the rebuild's lock (it is rebuilding a wiped Redis): ``mvlog read`` says that a
    rebuild is running and waits for it instead of showing an empty table, then shows the table's rows."""
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    ok(mvlog(settings, *T1))
    ok(mvlog(settings, "insert", "t1", input=lines(*({"id": i, "v1": i, "deleted": False} for i in range(1, 11)))))
    ok(mvlog(settings, "insert", "t1", input=lines({"id": 11, "v1": 11, "deleted": False})))  # proves the first
    client.flushall()
    other = client.lock(rebuild_lock_name(settings.topic_prefix), timeout=60, thread_local=False)
    assert other.acquire(blocking=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")} | env_of(settings)
    reader = subprocess.Popen([*MVLOG, "read", "t1", "--output", "json"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stderr is not None
        said = reader.stderr.readline()
        assert "A rebuild of Redis from Kafka is running (another process): waiting for it" in said, said
        time.sleep(2.0)
        assert reader.poll() is None, "the read went on while the rebuild's lock was held"
        other.release()  # the "other process" gave up without rebuilding: the reader rebuilds itself
        out, err = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, err
    assert "rebuilt 1 table(s) and view(s) from Kafka" in err, err
    rows = json.loads(out)["rows"]
    assert {row["id"] for row in rows} >= set(range(1, 11)), rows  # at most its unproven last epoch is back
