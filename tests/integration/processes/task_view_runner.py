"""Runs views' consumers with their operators in Spark's tasks, in its own process (and its own Spark,
the settings' master: ``local-cluster`` in the tests), so a test can have a task SIGKILL it.

Usage: python -m tests.integration.processes.task_view_runner SETTINGS_JSON VIEW[,VIEW...] [KILL[,KILL...]]
Catches each view up with its upstream, in order (:meth:`ViewConsumer.catch_up`), prints
``done <view> <mce> <written>`` for each (``written``: partition epochs its tasks wrote, not found
committed) and exits. Each ``KILL`` is ``<view>:<partition>:<what>``: the first attempt of that view's
task of that partition, right after it wrote and staged its first epoch (the other partitions have
committed that epoch or not, as their tasks got), SIGKILLs this driver process and then itself
(``driver``), only its own Python worker (``worker``: Spark retries the task), or its executor's JVM
(``CoarseGrainedExecutorBackend``) and then itself (``executor``: Spark loses the executor, retries
the task on the other one, and the cluster's worker starts a new executor). A view may have several.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark import TaskContext

from mvlog.config import Settings
from mvlog.services.pipeline.view_consumer import ViewConsumer

ROOT = Path(__file__).resolve().parents[3]


def run(settings: Settings, views: list[str], kills: list[str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """This runner in a child process; returns when it exited (or was killed)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable}
    args = [sys.executable, "-m", "tests.integration.processes.task_view_runner", settings.model_dump_json(),
            ",".join(views)]
    if kills:
        args.append(",".join(kills))
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False)


EXECUTOR_MARK = b"CoarseGrainedExecutorBackend"


def executor_pid() -> int:
    """The executor JVM above this Python worker (worker <- the Python daemon <- executor JVM)."""
    pid = os.getpid()
    while pid > 1:
        if EXECUTOR_MARK in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    raise RuntimeError("this Python worker does not run under an executor JVM (not a local-cluster?)")


_WRITTEN: dict[tuple[int, int], int] = {}  # (task attempt, partition) -> epochs written, in this worker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class Kill:
    """Runs in the task (pickled with the job): after the first attempt of a partition in ``targets``
    wrote an epoch, SIGKILL what that partition names (the driver, ``driver_pid``, or the executor JVM),
    then the task's own Python worker, so nothing of this attempt goes further."""

    driver_pid: int
    #: partition -> "driver" / "worker" / "executor"; "driver2": the driver after the partition's second
    #: epoch; "hold": after its first epoch, wait until the driver is gone, then the worker (so that a
    #: "driver2" partition is ahead of it however fast the tasks run)
    targets: dict[int, str]

    def __call__(self, partition: int, epoch: int) -> None:
        context = TaskContext.get()
        what = self.targets.get(partition)
        if what is not None and (context is None or context.attemptNumber() == 0):
            if what == "driver2":
                key = (context.taskAttemptId() if context is not None else 0, partition)
                _WRITTEN[key] = _WRITTEN.get(key, 0) + 1
                if _WRITTEN[key] < 2:
                    return
                os.kill(self.driver_pid, signal.SIGKILL)
            if what == "hold":
                deadline = time.monotonic() + 120
                while _alive(self.driver_pid):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the driver {self.driver_pid} still runs after 120 s")
                    time.sleep(0.05)
            if what == "driver":
                os.kill(self.driver_pid, signal.SIGKILL)
            elif what == "executor":
                os.kill(executor_pid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    specs = sys.argv[3].split(",") if len(sys.argv) > 3 else []
    kills: dict[str, dict[int, str]] = {}
    for spec in specs:
        view, partition, what = spec.split(":")
        kills.setdefault(view, {})[int(partition)] = what
    spark = None
    for view in sys.argv[2].split(","):
        consumer = ViewConsumer(settings, view, spark=spark)
        spark = consumer.spark
        assert consumer.tasks is not None, f"{view} does not run in tasks"
        if view in kills:
            consumer.tasks.on_written = Kill(os.getpid(), kills[view])
        mce = consumer.catch_up()
        print(f"done {view} {mce} {consumer.tasks.epochs_written}", flush=True)
        consumer.stop()
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
