"""An operator's day on a stack of its own (issue 21), every step through the CLI as a user types it:
``up``, create a table and two views, ``run-view`` both in one process, redis-server killed and ``up``
again (it starts the missing Redis and keeps the broker), a view dropped under the running consumer,
``down``, ``up``, ``read``. Nothing is lost, and nothing stops that was not asked to: the run-view
process lives through the Redis restart and the drop, and its other view goes on.

The expected rows are the test's own model of the table (every insert and delete it sent), and the
filter view is that model filtered: an oracle independent of mvlog's code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from mvlog.connectors.redis.view_store import ViewStore
from mvlog.infra.local_stack import LocalStack

from ..conftest import spark_conf_for_tests
from .test_durable_stack import MVLOG, cli, own_stack, stack_settings

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(400)]


def typed(stack: LocalStack, *args: str, stdin: str = "") -> str:
    """``mvlog ARGS`` with ``stdin``; its standard output (the command must succeed)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MVLOG_")}
    env.update({**stack.env(), "MVLOG_BARRIER_INTERVAL_MS": "200"})
    done = subprocess.run([*MVLOG, *args], env=env, input=stdin, capture_output=True, text=True, timeout=180,
                          cwd=stack.data_dir.parent)
    assert done.returncode == 0, f"mvlog {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_for(condition: Callable[[], bool], what: str, alive: subprocess.Popen[bytes], log: Path,
             timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except redis.ConnectionError:  # Redis is restarting: ask again
            pass
        assert alive.poll() is None, f"run-view exited ({alive.returncode}) waiting for {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n{log.read_text()}"
        time.sleep(0.2)


def test_an_operators_day_loses_nothing_and_stops_nothing_unasked(tmp_path: Path) -> None:
    with own_stack(tmp_path) as stack:
        up = cli(stack, "up")
        assert up.returncode == 0, up.stderr
        settings = stack_settings(stack, "mvlog")  # the CLI's default prefix
        client = redis.Redis.from_url(settings.redis_url)
        store = ViewStore(client, settings.topic_prefix)
        model: dict[int, dict[str, Any]] = {}

        def insert(rows: list[dict[str, Any]]) -> int:
            model.update({row["id"]: row for row in rows})
            return int(typed(stack, "insert", "t1", stdin="".join(json.dumps(r) + "\n" for r in rows)))

        typed(stack, "create-table", "t1", "-c", "id:int", "-c", "v1:int", "-c", "k:string", "--primary-key", "id")
        epoch = insert([{"id": i, "v1": i % 7 - 3, "k": f"k{i % 4}"} for i in range(50)])
        typed(stack, "create-view", "mv1", "AS", "SELECT * FROM t1 WHERE v1 > 0")
        typed(stack, "create-view", "mv2", "AS", "SELECT k, count(*) AS n FROM t1 GROUP BY k")
        env = {key: value for key, value in os.environ.items() if not key.startswith("MVLOG_")}
        env.update({**stack.env(), "MVLOG_SPARK_CONF": json.dumps(spark_conf_for_tests())})  # the tests' JIT, CDS
        log = tmp_path / "run-view.log"
        with log.open("wb") as sink:
            consumer = subprocess.Popen([*MVLOG, "run-view", "mv1", "mv2", "--progress-interval", "2"], env=env,
                                        stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            wait_for(lambda: store.mce_many(["mv1", "mv2"]) == {"mv1": epoch, "mv2": epoch}, "both views",
                     consumer, log)

            # redis-server dies; `mvlog up` starts it again from its AOF and keeps the broker.
            stack.kill("redis")
            time.sleep(2)
            again = cli(stack, "up")
            assert again.returncode == 0, again.stderr
            epoch = insert([{"id": i, "v1": 5, "k": "k9"} for i in range(40, 60)])
            wait_for(lambda: (store.mce("mv1"), store.mce("mv2")) == (epoch, epoch), "both views after Redis",
                     consumer, log)

            # mv2 dropped under the running consumer: it stops mv2 alone, mv1 goes on.
            dropped = typed(stack, "drop-view", "mv2")
            assert "Stopped its consumer" in dropped, dropped
            typed(stack, "insert", "t1", "--delete", stdin="3\n4\n")
            model.pop(3)
            model.pop(4)
            epoch = insert([{"id": 70, "v1": 2, "k": "k1"}])
            wait_for(lambda: store.mce("mv1") == epoch, "mv1 after the drop", consumer, log)
            consumer.send_signal(signal.SIGTERM)
            assert consumer.wait(timeout=60) == 0, log.read_text()
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
        client.close()

        down = cli(stack, "down")
        assert down.returncode == 0, down.stderr
        up = cli(stack, "up")
        assert up.returncode == 0, up.stderr
        table = json.loads(typed(stack, "read", "t1", "-o", "json"))
        view = json.loads(typed(stack, "read", "mv1", "-o", "json"))
    assert {row["id"]: row for row in table["rows"]} == model
    assert {row["id"]: row for row in view["rows"]} == {i: r for i, r in model.items() if r["v1"] > 0}
    assert table["epoch"] == view["epoch"] == epoch
    output = log.read_text()
    assert "mv2: stopping it alone" in output and "SIGTERM: stopping mv1" in output, output
