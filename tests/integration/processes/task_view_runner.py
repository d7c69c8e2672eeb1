"""Runs one view's consumer with its operator in Spark's tasks, in its own process (and its own Spark,
the settings' master: ``local-cluster`` in the tests), so a test can have a task SIGKILL it.

Usage: python -m tests.integration.processes.task_view_runner SETTINGS_JSON VIEW[,VIEW...] [KILL_PARTITION]
Catches each view up with its upstream, in order (:meth:`ViewConsumer.catch_up`), prints
``done <view> <mce> <written>`` for each (``written``: partition epochs its tasks wrote, not found
committed) and exits. With ``KILL_PARTITION``, the first view's task of that partition SIGKILLs this
driver process, then itself, right after it wrote and staged its first epoch: the other partitions have
committed that epoch or not, as their tasks got.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mvlog.config import Settings
from mvlog.services.pipeline.view_consumer import ViewConsumer

ROOT = Path(__file__).resolve().parents[3]


def run(settings: Settings, views: list[str], kill_partition: int | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """This runner in a child process; returns when it exited (or was killed)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable}
    args = [sys.executable, "-m", "tests.integration.processes.task_view_runner", settings.model_dump_json(),
            ",".join(views)]
    if kill_partition is not None:
        args.append(str(kill_partition))
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False)


@dataclass(frozen=True)
class KillDriver:
    """Runs in the task (pickled with the job): after ``partition`` wrote an epoch, SIGKILL the driver,
    then the task's own Python worker, so nothing of this attempt goes further."""

    driver_pid: int
    partition: int

    def __call__(self, partition: int, epoch: int) -> None:
        if partition == self.partition:
            os.kill(self.driver_pid, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    spark = None
    for position, view in enumerate(sys.argv[2].split(",")):
        consumer = ViewConsumer(settings, view, spark=spark)
        spark = consumer.spark
        assert consumer.tasks is not None, f"{view} does not run in tasks"
        if position == 0 and len(sys.argv) > 3:
            consumer.tasks.on_written = KillDriver(os.getpid(), int(sys.argv[3]))
        mce = consumer.catch_up()
        print(f"done {view} {mce} {consumer.tasks.epochs_written}", flush=True)
        consumer.stop()
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
