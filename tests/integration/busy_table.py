"""A table that keeps changing in the background while a test creates or backfills views on it."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mvlog.services.tables.writer import Table


@contextmanager
def busy(table: Table, seed: int, keys: int, per_tick: int = 30) -> Iterator[None]:
    """Inserts, updates and deletes of ``{id, v1, deleted}`` rows across ``keys`` keys, every 20 ms,
    until the block ends."""
    stop = threading.Event()
    rng = random.Random(seed)

    def write() -> None:
        while not stop.is_set():
            table.upsert([{"id": rng.randrange(keys), "v1": rng.randrange(-50, 50), "deleted": rng.random() < 0.2}
                          for _ in range(per_tick)])
            table.delete([rng.randrange(keys) for _ in range(per_tick // 3)])
            stop.wait(0.02)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
