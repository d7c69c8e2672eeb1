"""The dashboard and ``mvlog status`` while Redis or the broker is down (issue 21): the page's API answers
503 saying it waits for Redis (the page shows "disconnected: waiting for Redis ..."), never a stack
trace, and serves again once redis-server is back; with the broker unreachable both say so."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from mvlog.config import Settings
from mvlog.infra.local_stack import find_redis_server, free_port, redis_answers
from mvlog.services.cli import main
from mvlog.services.dashboard.server import DashboardServer
from mvlog.services.table_writer import Table

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
