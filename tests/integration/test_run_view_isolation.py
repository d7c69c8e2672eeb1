"""One view's trouble stays with that view (issue 21): in one ``mvlog run-view`` process maintaining
three views, a view whose apply fails is started again alone, and once its restarts are spent
(``MVLOG_VIEW_RESTARTS``, 1 here) stops alone (state ``failed`` with the reason), a view dropped with
``drop-view`` is stopped by the process first (the drop waits for it) and is gone, and the third view
goes on to the table's last epoch; the process then exits on SIGTERM with code 1 (a view failed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.consumer_lease import ConsumerLeases
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from tests.integration.test_cli_views import MVLOG, T1, env_of, lines, mvlog, ok, read_json, topic_exists

pytestmark = pytest.mark.integration


def wait_until(check: Callable[[], bool], what: str, process: subprocess.Popen[bytes], log: Path,
               timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert process.poll() is None, f"run-view exited with {process.returncode} while waiting for {what}:\n" \
                                       f"{log.read_text()}"
        assert time.monotonic() < deadline, f"{what} not within {timeout} s:\n{log.read_text()}"
        time.sleep(0.2)


def insert(settings: Settings, *rows: Any) -> int:
    """Insert rows into t1; returns the epoch they committed in."""
    return int(ok(mvlog(settings, "insert", "t1", input=lines(*rows))).stdout)


def test_a_failed_and_a_dropped_view_stop_alone_and_the_other_goes_on(
        settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    ok(mvlog(settings, *T1))
    insert(settings, *({"id": i, "v1": i, "deleted": False} for i in range(1, 21)))
    for name, sql in (("keep", "SELECT * FROM t1 WHERE deleted = false"),
                      ("broken", "SELECT deleted, count(*) AS n FROM t1 GROUP BY deleted"),
                      ("dropme", "SELECT id, v1 FROM t1 WHERE v1 > 5")):
        ok(mvlog(settings, "create-view", name, "AS", sql))
    store = ViewStore(redis_client, settings.topic_prefix)
    env = {**os.environ, **env_of(settings), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "MVLOG_VIEW_RESTARTS": "1"}
    log = tmp_path / "run-view.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([*MVLOG, "run-view", "keep", "broken", "dropme", "--progress-interval", "1"],
                                   env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        first = insert(settings, {"id": 21, "v1": 21, "deleted": False})
        wait_until(lambda: all((store.mce(v) or 0) >= first for v in ("keep", "broken", "dropme")),
                   "every view at the first epoch", process, log)
        leases = ConsumerLeases(redis_client, settings.topic_prefix)
        holders = {leases.holder(v) for v in ("keep", "broken", "dropme")}
        assert len(holders) == 1 and None not in holders, holders  # the process holds its views' leases

        # 1. broken's operator state is corrupted: its next apply fails, and only broken stops.
        state = store.key("broken", "opstate")
        fields = redis_client.hkeys(state)
        assert fields, "a GROUP BY view keeps operator state"
        redis_client.hset(state, mapping={field: b"\x00 not an encoded state" for field in fields})
        second = insert(settings, {"id": 22, "v1": 22, "deleted": False})
        wait_until(lambda: store.lifecycle("broken") is Lifecycle.FAILED, "broken marked failed", process, log)
        wait_until(lambda: (store.mce("keep") or 0) >= second, "keep past the failure", process, log)
        assert (store.mce("broken") or 0) < second
        assert store.meta("broken").get("reason"), store.meta("broken")

        # 2. drop-view under the running consumer: the process stops dropme first, the drop waits for it.
        dropped = ok(mvlog(settings, "drop-view", "dropme"))
        assert "Stopped its consumer in run-view process" in dropped.stdout, dropped.stdout
        assert CatalogStore(settings, redis_client).find("dropme") is None
        assert not topic_exists(settings, settings.changelog_topic("dropme"))
        assert leases.holder("dropme") is None

        # 3. keep goes on.
        last = insert(settings, {"id": 23, "v1": 23, "deleted": False}, {"id": 1, "v1": 100, "deleted": True})
        wait_until(lambda: (store.mce("keep") or 0) >= last, "keep at the last epoch", process, log)
        assert process.poll() is None, log.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 1, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert "starting it again in 1 s (restart 1 of 1 within 10 min)" in output.split("broken: failed:")[0], output
    assert "broken: failed:" in output and "keep, dropme go on" in output, output
    assert "dropme: stopping it alone: drop-view dropme asked for it" in output, output
    assert "SIGTERM: stopping keep" in output and "Traceback" not in output.split("SIGTERM")[-1], output
    view = read_json(settings, "keep")
    assert view["epoch"] == last
    assert [row["id"] for row in view["rows"]] == list(range(2, 24))
    assert read_json(settings, "broken")["state"] == "failed"
