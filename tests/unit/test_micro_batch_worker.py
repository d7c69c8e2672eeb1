"""The view consumer's apply thread: micro-batches applied one at a time, in order; a failure surfaces."""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest

from mvlog.services.pipeline.micro_batch_worker import MicroBatchWorker


def test_applies_run_in_order_one_at_a_time_off_the_calling_thread() -> None:
    worker = MicroBatchWorker("v")
    seen: list[tuple[int, str]] = []
    running = threading.Lock()

    def apply(n: int) -> None:
        assert running.acquire(blocking=False), "two applies at once"
        time.sleep(0.01)
        seen.append((n, threading.current_thread().name))
        running.release()

    for n in range(5):
        worker.submit(partial(apply, n))
    worker.drain()
    worker.close()
    assert [n for n, _ in seen] == list(range(5))
    assert all(name.startswith("apply-v") for _, name in seen)


def test_a_failed_apply_is_told_then_raised_by_the_next_submit() -> None:
    worker = MicroBatchWorker("v")

    def fail() -> None:
        raise ValueError("boom")

    worker.submit(fail)
    deadline = time.monotonic() + 5
    while worker.failure() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(worker.failure(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        worker.check()
    worker.submit(fail)
    with pytest.raises(ValueError, match="boom"):
        worker.submit(lambda: None)  # the micro-batch after a failed one is not applied
    worker.close()


def test_nothing_is_applied_after_close() -> None:
    worker = MicroBatchWorker("v")
    worker.close()
    with pytest.raises(RuntimeError):
        worker.submit(lambda: None)
