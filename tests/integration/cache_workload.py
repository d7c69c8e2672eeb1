"""What the log-cache tests share (``test_log_cache.py``, ``test_log_cache_isolation.py``): a condition
waited for, a background workload on a table, a cache worker process for the block's length."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mvlog.config import Settings
from mvlog.services.tables.writer import Table

from .processes.cache_worker import CacheWorkerProcess

COLUMNS = {"id": "int", "v1": "int", "deleted": "boolean"}


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


@contextmanager
def writing(table: Table, seed: int = 0, rows: int = 20, pause: float = 0.03) -> Iterator[threading.Event]:
    """A background workload of upserts and deletes on ``table`` until the block ends."""
    stop = threading.Event()
    rng = random.Random(seed)

    def run() -> None:
        while not stop.is_set():
            table.upsert([{"id": rng.randrange(300), "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.3}
                          for _ in range(rows)])
            table.delete([rng.randrange(300)])
            stop.wait(pause)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join()


@contextmanager
def cache_worker(settings: Settings, *upstreams: str, partitions: int) -> Iterator[CacheWorkerProcess]:
    worker = CacheWorkerProcess(settings, *upstreams)
    try:
        worker.wait_ready(upstreams[0], partitions)
        yield worker
    finally:
        worker.stop()
