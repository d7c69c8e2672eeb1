"""A Faust log-cache worker (``mvlog cache-worker``) as a child process, so tests can SIGKILL it and
measure its memory; stats come from its own web server (``/stats/``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from mvlog.config import Settings
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.redis_client import connect
from mvlog.infra.local_stack import free_port

ROOT = Path(__file__).resolve().parents[3]


class CacheWorkerProcess:
    def __init__(self, settings: Settings, *upstreams: str, port: int | None = None) -> None:
        self.settings = settings
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MVLOG_")}
        env.update(settings.to_env())
        args = [sys.executable, "-m", "mvlog.services.cli", "cache-worker", "--port", str(self.port)]
        for upstream in upstreams:
            args += ["--upstream", upstream]
        self.log_path = Path(str(settings.stack_dir)) / f"cache-worker-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/stats/", timeout=5) as reply:
            result: dict[str, Any] = json.loads(reply.read())
            return result

    def upstream(self, name: str) -> dict[str, Any]:
        upstream: dict[str, Any] = self.stats()["upstreams"][name]
        return upstream

    def wait_ready(self, upstream: str, partitions: int, timeout: float = 60.0) -> None:
        """Until the worker holds every partition of ``upstream``, has aligned an epoch of it and has
        claimed the partitions in Redis."""
        registry = CacheRegistry(connect(self.settings, outage_timeout_s=10), self.settings.topic_prefix)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the worker exited: {self.log_path.read_text()[-3000:]}"
            try:
                found = self.upstream(upstream)
                if (len(found["partitions"]) == partitions and found["tail"] is not None
                        and all(registry.worker_for(upstream, p) == self.url for p in range(partitions))):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"worker not ready within {timeout}s: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
