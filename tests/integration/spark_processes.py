"""The processes of a Spark application on a ``local-cluster`` master, found below its driver's process.

A SIGKILL test on a real multi-process cluster kills more than the driver (issue 19 item 6): an
executor's JVM (``CoarseGrainedExecutorBackend``; the cluster's worker starts another, Spark retries its
tasks) or one of an executor's Python workers (forked by the executor's Python daemon, mvlog's
``spark_daemon`` around ``pyspark.daemon``; the task running in it fails and is retried). In
``local[N]`` the executors are threads of the driver's JVM and its Python workers are the driver JVM's
own children: there is nothing here to find.
"""

from __future__ import annotations

import psutil

from mvlog.connectors.spark import worker_daemon
from mvlog.services.spark import daemon as spark_daemon

EXECUTOR_MARK = "CoarseGrainedExecutorBackend"
#: The daemon's module in its command line: mvlog's sessions', the connectors' plain one, or PySpark's own
#: (``spark_conf`` may set either).
DAEMON_MARKS = (spark_daemon.__name__, worker_daemon.__name__, "pyspark.daemon")


def _below(root: int) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return children


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def executor_jvms(driver: int) -> list[int]:
    """The pids of the executor JVMs of the application whose driver process is ``driver``."""
    return [p.pid for p in _below(driver) if EXECUTOR_MARK in _cmdline(p)]


def executor_python_workers(driver: int) -> list[int]:
    """The pids of the executors' Python workers: the children of an executor's Python daemon (which
    itself is not one: killing it takes every worker of its executor with it)."""
    workers = []
    for executor in executor_jvms(driver):
        for process in _below(executor):
            try:
                parent = process.parent()
            except psutil.NoSuchProcess:
                continue
            if parent is not None and any(mark in _cmdline(parent) for mark in DAEMON_MARKS):
                workers.append(process.pid)
    return workers
