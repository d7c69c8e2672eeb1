"""The dashboard and ``mvlog status`` while Redis or the broker is down (issue 21): the page's API answers
503 saying it waits for Redis (the page shows "disconnected: waiting for Redis ..."), never a stack
trace, and serves again once redis-server is back; with the broker unreachable both say so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mvlog.config import Settings
from mvlog.infra.local_stack import find_redis_server, free_port, redis_answers
from mvlog.services.cli import main
from mvlog.services.dashboard.server import DashboardServer
from mvlog.services.tables.writer import Table

from .test_durable_stack import MVLOG

pytestmark = pytest.mark.integration


def status_of(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{url}api/status", timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_the_dashboard_says_it_waits_for_redis_and_recovers(
        make_settings: Callable[..., Settings], own_redis: str, tmp_path: Path) -> None:
    settings = make_settings(redis_url=own_redis)
    port = int(own_redis.rsplit(":", 1)[1].split("/")[0])
    with DashboardServer(settings, port=0, sample=False) as server:
        assert status_of(server.url)[0] == 200
        subprocess.run([str(find_redis_server().with_name("redis-cli")), "-p", str(port), "shutdown", "nosave"],
                       check=False, capture_output=True)
        deadline = time.monotonic() + 20
        while redis_answers("127.0.0.1", port, 0.5):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        code, document = status_of(server.url)
        assert code == 503, document
        assert f"waiting for Redis at redis://127.0.0.1:{port}/0" in str(document["error"]), document
        restarted = subprocess.Popen([str(find_redis_server()), "--port", str(port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                                     stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while status_of(server.url)[0] != 200:
                assert time.monotonic() < deadline, "the dashboard did not serve again once Redis was back"
                time.sleep(0.2)
        finally:
            restarted.terminate()
            restarted.wait(10)


def test_the_dashboard_and_status_say_the_broker_is_unreachable(
        make_settings: Callable[..., Settings], redis_client: object) -> None:  # redis_client: keys dropped after
    """The page's API carries the broker's state (the page shows it in place of "live"), and ``mvlog
    status`` warns, naming the address, while still showing the last figures from Redis."""
    Table.create(make_settings(), "t1", {"id": "int"}, ["id"], auto_commit=False).close()  # a catalog to show
    with DashboardServer(make_settings(), port=0, sample=False) as server:
        code, document = status_of(server.url)
    assert code == 200 and document["broker"] == "ok", document
    closed = f"127.0.0.1:{free_port()}"
    settings = make_settings(bootstrap_servers=closed)
    with DashboardServer(settings, port=0, sample=False) as server:
        code, document = status_of(server.url)
    assert code == 200 and str(document["broker"]).startswith(f"unreachable at {closed}: "), document
    env = {"MVLOG_BOOTSTRAP_SERVERS": closed, "MVLOG_REDIS_URL": settings.redis_url,
           "MVLOG_TOPIC_PREFIX": settings.topic_prefix}
    result = CliRunner().invoke(main, ["status"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"Warning: the Kafka broker at {closed} is unreachable" in result.stderr, result.stderr


class _Lines:
    """The JSON documents ``mvlog status --watch -o json`` prints, one per line, read on a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.documents: list[dict[str, Any]] = []
        self.other: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                self.documents.append(json.loads(line))
            except ValueError:
                self.other.append(line)

    def wait(self, condition: Callable[[dict[str, Any]], bool], what: str, process: subprocess.Popen[str],
             after: int = 0, timeout: float = 60.0) -> int:
        """The index of the first document from ``after`` on that meets ``condition``."""
        deadline = time.monotonic() + timeout
        while True:
            for index in range(after, len(self.documents)):
                if condition(self.documents[index]):
                    return index
            assert process.poll() is None, f"status --watch exited ({process.returncode}) before {what}"
            assert time.monotonic() < deadline, f"no refresh showed {what}: {self.documents[after:][-3:]}"
            time.sleep(0.1)


def test_status_watch_says_it_waits_for_redis_and_the_broker_then_goes_on(
        make_settings: Callable[..., Settings], own_redis: str, tmp_path: Path) -> None:
    """``mvlog status --watch`` keeps refreshing through a redis-server that stops and comes back and a
    broker it cannot reach: each refresh says what it waits for (the last figures kept), and the figures
    come back with Redis; it never exits or freezes on its own."""
    settings = make_settings(redis_url=own_redis)
    Table.create(settings, "t1", {"id": "int"}, ["id"], auto_commit=False).close()
    port = int(own_redis.rsplit(":", 1)[1].split("/")[0])
    env = {key: value for key, value in os.environ.items() if not key.startswith("MVLOG_")}
    env.update({"MVLOG_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "MVLOG_REDIS_URL": own_redis,
                "MVLOG_TOPIC_PREFIX": settings.topic_prefix})
    watcher = subprocess.Popen([*MVLOG, "status", "--watch", "0.3", "-o", "json"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = _Lines(watcher)
    try:
        def shows_t1(document: dict[str, Any]) -> bool:
            return any(v["name"] == "t1" for v in document.get("views", ())) \
                and document["redis"] is None and document["broker"] is None

        seen = lines.wait(shows_t1, "t1 with Redis and the broker up", watcher)
        subprocess.run([str(find_redis_server().with_name("redis-cli")), "-p", str(port), "shutdown", "nosave"],
                       check=False, capture_output=True)
        waiting = lines.wait(lambda d: d["redis"] is not None, "waiting for Redis", watcher, after=seen)
        document = lines.documents[waiting]
        assert document["redis"]["waiting_for"] == f"redis://127.0.0.1:{port}/0", document
        assert any(v["name"] == "t1" for v in document["views"]), "the last figures are kept while Redis is away"
        restarted = subprocess.Popen([str(find_redis_server()), "--port", str(port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                                     stdout=subprocess.DEVNULL)
        try:
            # The new server is empty (no AOF): the watch finds the catalog wiped and rebuilds it from Kafka.
            lines.wait(shows_t1, "t1 again once Redis was back (rebuilt from Kafka)", watcher, after=waiting,
                       timeout=90)
        finally:
            restarted.terminate()
            restarted.wait(10)
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(20)
    assert not lines.other, lines.other


def test_status_watch_says_the_broker_is_unreachable(
        make_settings: Callable[..., Settings], redis_client: object) -> None:  # redis_client: keys dropped after
    settings = make_settings()
    Table.create(settings, "t1", {"id": "int"}, ["id"], auto_commit=False).close()
    closed = f"127.0.0.1:{free_port()}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MVLOG_")}
    env.update({"MVLOG_BOOTSTRAP_SERVERS": closed, "MVLOG_REDIS_URL": settings.redis_url,
                "MVLOG_TOPIC_PREFIX": settings.topic_prefix})
    watcher = subprocess.Popen([*MVLOG, "status", "--watch", "0.3", "-o", "json"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = _Lines(watcher)
    try:
        first = lines.wait(lambda d: d["broker"] is not None, "the broker unreachable", watcher)
        assert lines.documents[first]["broker"]["unreachable"] == closed
        assert any(v["name"] == "t1" for v in lines.documents[first]["views"])
        lines.wait(lambda d: d["broker"] is not None, "a later refresh", watcher, after=first + 1)
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(20)
