"""What a view consumer's supervisor sees of its streaming query (``MicroBatchRunner.failure``): a micro-batch
that raised in ``foreachBatch`` (as one run in Spark's tasks does when a stage refuses it) stops the query,
and ``failure()`` says so at once, the one call ``mvlog run-view``, the demo and the tests' runner processes
make; a query that runs, or that ``stop()`` stopped, is no failure. Spark's ``rate`` source feeds it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mvlog.services.pipeline.streaming import MicroBatchRunner

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _runner(spark: Any, name: str, fail_at: int | None) -> tuple[MicroBatchRunner, threading.Event]:
    """A runner over the rate source whose micro-batch number ``fail_at`` (counting from 1) raises; the
    event is set once two micro-batches went through."""
    runner = MicroBatchRunner(name, apply=lambda _table: None, upkeep=lambda: None)
    calls: list[int] = []
    two = threading.Event()

    def process(_batch: Any, batch_id: int) -> None:
        calls.append(batch_id)
        if len(calls) == fail_at:
            raise ValueError(f"micro-batch {batch_id} refused by a stage")
        if len(calls) >= 2:
            two.set()

    stream = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    runner.start(stream, process, "100 milliseconds", f"runner_test_{name}")
    return runner, two


def test_a_micro_batch_that_raises_is_the_runners_failure_at_once(spark: Any) -> None:
    runner, _ = _runner(spark, "failing", fail_at=2)
    try:
        deadline = time.monotonic() + 60
        while (error := runner.failure()) is None:
            assert time.monotonic() < deadline, "the failed micro-batch was not reported in 60 s"
            time.sleep(0.1)
        assert "refused by a stage" in str(error)
        with pytest.raises(RuntimeError, match="refused by a stage"):
            runner.check()
    finally:
        runner.stop()


def test_a_running_or_stopped_query_is_no_failure(spark: Any) -> None:
    runner, two = _runner(spark, "running", fail_at=None)
    try:
        assert two.wait(60), "two micro-batches did not run in 60 s"
        assert runner.failure() is None
    finally:
        runner.stop()
    assert runner.failure() is None
