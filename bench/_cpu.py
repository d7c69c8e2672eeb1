"""CPU seconds of the processes a benchmark run uses, by role, from ``/proc/<pid>/stat`` (Linux only).

Issue 19 asks for the driver's share of all CPU during a catch-up with the operators in Spark's tasks.
That share can only be told apart when the executors run in their own JVMs (``local-cluster[N,C,MB]``):
in ``local[N]`` the executors are threads of the driver's JVM. The roles:

* **driver**, in three parts: ``driver_py``, the Python driver process; ``driver_jvm``, its JVM (the
  py4j gateway's process, which in ``local-cluster`` also hosts Spark's master and workers);
  ``driver_workers``, the JVM's other descendants (the Python workers the driver's JVM starts itself, e.g.
  to plan a Python data source's reads), minus the executors' trees, and the JVM's ended children (an
  executor that ends during a sample would count here: none does in the benchmark);
* **executors**: every ``CoarseGrainedExecutorBackend`` JVM below the driver's JVM, with its Python
  daemon and workers;
* **broker** / **redis**: the stack's processes, given by pid.

A sample reads ``utime + stime + cutime + cstime`` of each process: the reaped children's time is in
their parent's, so a Python worker that exits between two samples still counts (in its parent's role),
and the difference of two samples is the CPU time each role used in between. Anything else on the
machine (other users' work) is not counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

EXECUTOR_MARK = b"CoarseGrainedExecutorBackend"
ROLES = ("driver_py", "driver_jvm", "driver_workers", "executors", "broker", "redis")
DRIVER_ROLES = ("driver_py", "driver_jvm", "driver_workers")


@dataclass(frozen=True)
class ProcStat:
    """One process (or thread): its parent, its own CPU ticks and its reaped children's. A thread's
    ``reaped`` is its process's (the kernel keeps it per process), so threads count ``own`` only."""

    pid: int
    ppid: int
    own: int
    reaped: int = 0

    @property
    def ticks(self) -> int:
        return self.own + self.reaped


def parse_stat(pid: int, text: str) -> ProcStat:
    """``/proc/<pid>/stat``: the command (field 2) may hold spaces and parentheses, so fields are counted
    after its last ``)``: state, ppid, ... utime (14), stime, cutime, cstime (17)."""
    fields = text[text.rindex(")") + 2:].split()
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return ProcStat(pid, ppid, utime + stime, cutime + cstime)


def descendants(children: Mapping[int, Iterable[int]], root: int) -> set[int]:
    """``root`` and every process below it."""
    found = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def roles(stats: Mapping[int, ProcStat], executors: Iterable[int], driver: int, driver_jvm: int,
          broker: int | None, redis: int | None) -> dict[str, set[int]]:
    """The processes of each role (pure): ``executors`` are the executor JVMs' pids."""
    children = _children(stats)
    executor_tree: set[int] = set()
    for pid in executors:
        executor_tree |= descendants(children, pid)
    result = {"driver_py": {driver}, "driver_jvm": {driver_jvm},
              "driver_workers": descendants(children, driver_jvm) - executor_tree - {driver_jvm},
              "executors": executor_tree, "broker": set(), "redis": set()}
    if broker is not None:
        result["broker"] = descendants(children, broker)
    if redis is not None:
        result["redis"] = descendants(children, redis)
    return result


def thread_group(comm: str) -> str:
    """A thread's name without its number (``Executor task launch worker-3`` and ``-4`` are one group):
    the JVM names its native threads after its Java threads (15 characters)."""
    return comm.rstrip("0123456789-# ").strip() or comm


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far by each role's processes alive at the sample, and by the driver JVM's live
    threads, per thread group."""

    seconds: dict[str, float]
    jvm_threads: dict[str, float]

    def __sub__(self, earlier: CpuSample) -> dict[str, float]:
        return {role: self.seconds[role] - earlier.seconds[role] for role in ROLES}

    def threads_since(self, earlier: CpuSample) -> dict[str, float]:
        """CPU seconds of the driver JVM's thread groups in between (threads that ended are missing)."""
        return {name: seconds - earlier.jvm_threads.get(name, 0.0) for name, seconds in self.jvm_threads.items()}


@dataclass(frozen=True)
class Members:
    """One scan of ``/proc``: each process's stat, the executor JVMs, and the processes of each role."""

    stats: dict[int, ProcStat]
    executors: tuple[int, ...]
    roles: dict[str, set[int]]


@dataclass(frozen=True)
class CpuProbe:
    """Samples the roles' CPU seconds; ``driver_jvm`` from the py4j gateway."""

    driver: int
    driver_jvm: int
    broker: int | None
    redis: int | None

    def members(self) -> Members:
        """Every live process of each role, with their stats."""
        stats: dict[int, ProcStat] = {}
        executors: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                stats[pid] = parse_stat(pid, (entry / "stat").read_text())
                if EXECUTOR_MARK in (entry / "cmdline").read_bytes():
                    executors.append(pid)
            except (OSError, ValueError):
                continue  # gone meanwhile
        below_jvm = descendants(_children(stats), self.driver_jvm)  # not another run's executors
        executors = [pid for pid in executors if pid in below_jvm]
        return Members(stats, tuple(executors),
                       roles(stats, executors, self.driver, self.driver_jvm, self.broker, self.redis))

    def sample(self) -> CpuSample:
        found = self.members()
        stats, members = found.stats, found.roles
        tick = os.sysconf("SC_CLK_TCK")
        threads: dict[str, float] = {}
        for task in Path(f"/proc/{self.driver_jvm}/task").iterdir():
            try:
                text = (task / "stat").read_text()
            except OSError:
                continue
            name = thread_group(text[text.index("(") + 1:text.rindex(")")])
            threads[name] = threads.get(name, 0.0) + parse_stat(int(task.name), text).own / tick
        seconds = {role: sum(stats[pid].ticks for pid in pids if pid in stats) / tick
                   for role, pids in members.items()}
        jvm = stats.get(self.driver_jvm)
        if jvm is not None:  # the JVM's reaped children (its Python workers that ended) count as workers
            seconds["driver_jvm"] -= jvm.reaped / tick
            seconds["driver_workers"] += jvm.reaped / tick
        return CpuSample(seconds, threads)


def _children(stats: Mapping[int, ProcStat]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    return children
