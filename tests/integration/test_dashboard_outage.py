"""The dashboard while its Redis is down (issue 21): the page's API answers 503 saying it waits for Redis
(the page shows "disconnected: waiting for Redis ..."), never a stack trace, and serves again once
redis-server is back."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from mvlog.config import Settings
from mvlog.infra.local_stack import find_redis_server, redis_answers
from mvlog.services.dashboard.server import DashboardServer

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
