"""A long Spark job's progress, for a progress bar: its tasks done out of its tasks, polled from Spark's
status tracker while the job runs.

The jobs run under a job group of their own (Spark's ``setJobGroup``, a property of the calling thread),
so the poller counts exactly their stages' tasks, whatever else the session runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from pyspark.sql import SparkSession

POLL_INTERVAL_S = 0.5


class JobProgress:
    """``with JobProgress(spark, group, on_progress):`` the jobs started in the block by this thread report
    ``on_progress(tasks done, tasks known)`` every :data:`POLL_INTERVAL_S` (the total grows as Spark
    plans the later stages), and all done when the block ends without an error: a stage Spark skipped
    (its shuffle output reused by a later job of adaptive execution) never counts its tasks as done.
    ``on_progress`` None: a no-op."""

    def __init__(self, spark: SparkSession, group: str, on_progress: Callable[[int, int], None] | None) -> None:
        self._context, self._group, self._on_progress = spark.sparkContext, group, on_progress
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def __enter__(self) -> JobProgress:
        if self._on_progress is not None:
            self._context.setJobGroup(self._group, self._group)
            self._poller = threading.Thread(target=self._poll, name=f"progress-{self._group}", daemon=True)
            self._poller.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._poller is None or self._on_progress is None:
            return
        self._stop.set()
        self._poller.join()
        done, total = self.tasks()
        if total:
            self._on_progress(total if error is None else done, total)
        self._context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]  # unsets it

    def tasks(self) -> tuple[int, int]:
        """(tasks done, tasks) over the stages of the group's jobs that Spark knows of."""
        tracker = self._context.statusTracker()
        stages = {stage for job in tracker.getJobIdsForGroup(self._group)
                  if (info := tracker.getJobInfo(job)) is not None for stage in info.stageIds}
        done = total = 0
        for stage in stages:  # a stage shared by several jobs (adaptive execution) counts once
            if (found := tracker.getStageInfo(stage)) is not None:
                done, total = done + found.numCompletedTasks, total + found.numTasks
        return done, total

    def _poll(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            self._report()

    def _report(self) -> None:
        assert self._on_progress is not None
        done, total = self.tasks()
        if total:
            self._on_progress(done, total)
